"""LoCoMo recall benchmark: Recall@5 and Recall@10 of memory.search on long conversations.

Protocol (the README of the data folder): every turn of a conversation is recorded through
a real daemon (``python -m ctxd`` on a temporary socket and data directory) as one memory
in the conversation's scope ``project:locomo-<file stem>``: title = the speaker, content =
``"<speaker>: <text>"`` plus ``" [shares <blip_caption>]"`` when the turn has an image
caption. Every question of categories 1-4 is a ``memory.search`` in its conversation's
scope (``min_confidence`` 0, ``k`` 10); a hit at k is an evidence turn among the first k
results. Evidence ids are read leniently (``"D8:6; D9:17"`` is two turns, ``"D:11:26"`` is
``D11:26``); a question none of whose evidence ids names a turn of its conversation is left
out and counted. Records and searches are pipelined (``--window`` requests in flight on
one connection).

Passes:

* ``recall`` (always): lexical, dense and hybrid for each embedder: the built-in hashing
  embedder always; sentence-transformers when the daemon's interpreter (``--st-python``,
  default this one) can import it and a model is found (``--model-path``, else the
  daemon's default), otherwise skipped with the reason. Beside them, the reference figures
  of the data folder's README (measured on all 10 conversations; this folder holds 5).
* ``tune`` (``--tune``): hybrid recall of the hashing embedder under other ``[memory]``
  settings, each through a daemon restarted on the same data directory with the setting's
  flags (``--memory-hash-dim``, ``--memory-dense-weight``, ...); a new ``hash_dim`` makes
  the daemon rebuild its index at start.
* ``techniques`` (``--techniques``): variants of the hashing embedder and of the fusion,
  computed in this process (scratch code, not the daemon's): the daemon's lexical leg (its
  first 50 ids, as the hybrid search fuses them) and a dense leg computed here by exact
  inner product are fused by the daemon's own ``ctxd.memory.fuse``. The first row
  reproduces the daemon's own embedder and fusion, to show that the simulation agrees.

The script reports and exits 0 once it has figures; it exits 1 only when it could not
measure (a daemon that does not start, an error reply).

Run: ``python bench/locomo_recall.py`` (about 30 s), ``python bench/locomo_recall.py
--tune --techniques`` (a few minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from folding import Caller
from rpc import (
    BenchError,
    DaemonProcess,
    RawClient,
    print_table,
    run_and_report,
    scratch_root,
)

from ctxd.memory import HashingEmbedder, feature_bucket, fuse
from ctxd.memory import stem as light_stem

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO_ROOT.parent / "shared" / "bench-data" / "locomo" / "dev"
CATEGORIES = (1, 2, 3, 4)
K_VALUES = (5, 10)
LEG_CANDIDATES = 50  # what each leg proposes to the fusion for k <= 12 (_retrieval.py)
START_TIMEOUT_S = 120.0  # a sentence-transformers daemon loads its model first
REFERENCE = (
    ("plain BM25", 0.481, 0.561),
    ("BM25 with stemming", 0.521, 0.618),
    ("all-MiniLM-L6-v2 dense", 0.416, 0.513),
    ("reciprocal-rank fusion of BM25 and MiniLM", 0.504, 0.603),
    ("feature-hashed bag of words", 0.221, 0.295),
)
TUNING: tuple[tuple[str, dict[str, str]], ...] = (
    ("defaults", {}),
    ("hash_dim 256", {"hash-dim": "256"}),
    ("hash_dim 512", {"hash-dim": "512"}),
    ("hash_dim 2048", {"hash-dim": "2048"}),
    ("hash_dim 4096", {"hash-dim": "4096"}),
    ("dense_weight 0.25", {"dense-weight": "0.25"}),
    ("dense_weight 0.5", {"dense-weight": "0.5"}),
    ("lexical_weight 2", {"lexical-weight": "2"}),
    ("rrf_k 10", {"rrf-k": "10"}),
    ("rrf_k 30", {"rrf-k": "30"}),
    ("rrf_k 120", {"rrf-k": "120"}),
    ("dense_min_score 0", {"dense-min-score": "0"}),
    ("dense_min_score 0.2", {"dense-min-score": "0.2"}),
    ("dense_min_score 0.3", {"dense-min-score": "0.3"}),
    ("dense_min_score 0.35", {"dense-min-score": "0.35"}),
    ("dense_weight 0.5, hash_dim 2048", {"dense-weight": "0.5", "hash-dim": "2048"}),
    ("dense_weight 0.25, rrf_k 10", {"dense-weight": "0.25", "rrf-k": "10"}),
    ("dense_weight 0.25, rrf_k 10, min_score 0.2",
     {"dense-weight": "0.25", "rrf-k": "10", "dense-min-score": "0.2"}),
    ("the same, hash_dim 2048",
     {"dense-weight": "0.25", "rrf-k": "10", "dense-min-score": "0.2", "hash-dim": "2048"}),
)


# ---- the data --------------------------------------------------------------------------

@dataclass(frozen=True)
class Question:
    text: str
    evidence: frozenset[str]
    category: int


@dataclass
class Conversation:
    """One file: its turns as memory.record params, its questions, and (once recorded) the
    dialogue id of each memory id."""

    stem: str
    turns: list[tuple[str, dict[str, Any]]]
    questions: list[Question]
    left_out: int
    dia_of: dict[int, str] = field(default_factory=dict)

    @property
    def scope(self) -> str:
        return f"project:locomo-{self.stem}"


_SESSION = re.compile(r"session_\d+")
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")


def load(folder: Path) -> list[Conversation]:
    conversations = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        turns: list[tuple[str, dict[str, Any]]] = []
        for key, session in data.items():
            if not _SESSION.fullmatch(key):
                continue
            for turn in session:
                content = f"{turn['speaker']}: {turn['text']}"
                if turn.get("blip_caption"):
                    content += f" [shares {turn['blip_caption']}]"
                turns.append((turn["dia_id"], {"title": turn["speaker"], "content": content}))
        known = {dia_id for dia_id, _ in turns}
        questions = []
        left_out = 0
        for qa in data["qa"]:
            if qa["category"] not in CATEGORIES:
                continue
            evidence = frozenset(f"D{s}:{t}" for s, t in _EVIDENCE.findall(
                " ".join(str(e) for e in qa.get("evidence", [])))) & known
            if not evidence:
                left_out += 1
                continue
            questions.append(Question(str(qa["question"]), evidence, qa["category"]))
        conversation = Conversation(path.stem, turns, questions, left_out)
        for _, params in turns:
            params["scope"] = conversation.scope
        conversations.append(conversation)
    if not conversations:
        raise BenchError(f"no *.json conversation in {folder}")
    return conversations


# ---- daemons ---------------------------------------------------------------------------

@contextlib.contextmanager
def running(root: Path, data_dir: Path, label: str, python: str,
            settings: dict[str, str]) -> Iterator[tuple[DaemonProcess, Caller]]:
    """A daemon of this tree on ``data_dir`` with ``--memory-<key> value`` flags, run by
    ``python`` (which need not have ctxd installed), stopped on exit."""
    flags = [arg for key, value in settings.items() for arg in (f"--memory-{key}", value)]
    daemon = DaemonProcess(root, flags, name=label, data=data_dir, python=python,
                           code=REPO_ROOT, start_timeout=START_TIMEOUT_S)
    with daemon.running(), contextlib.closing(RawClient(daemon.socket)) as client:
        yield daemon, Caller(client)


def record_all(caller: Caller, conversations: Sequence[Conversation], window: int) -> float:
    """Record every turn (pipelined); returns memories/s."""
    pairs = [(conversation, dia_id, params) for conversation in conversations
             for dia_id, params in conversation.turns]
    started = time.perf_counter()
    results = caller.pipelined("memory.record", ((lambda p=p: p) for _, _, p in pairs),
                               window)
    elapsed = time.perf_counter() - started
    for (conversation, dia_id, _), result in zip(pairs, results, strict=True):
        conversation.dia_of[result["memory"]["id"]] = dia_id
    return len(pairs) / elapsed


def wait_memory_ready(caller: Caller, memories: int, timeout_s: float) -> str | None:
    """Wait until both legs are ready: the dense leg answers (the index loaded or rebuilt,
    the memories recorded meanwhile added) and the lexical ranking is loaded; the reason
    when they are not within ``timeout_s``.

    A search is a job of the index's owner task, served in order after its start-up
    rebuild, so the first dense search that answers comes after everything queued before.
    """
    give_up = time.monotonic() + timeout_s
    while True:
        found = caller.call("memory.search", {"query": "ready", "k": 1, "mode": "dense"})
        index = caller.call("daemon.status").get("memory_index")
        if "dense" in found["legs_used"] and not found.get("note") and (
                index is None or index.get("lexical", "ready") == "ready"):
            if index is not None and index["vectors"] != memories:
                return f"the dense index holds {index['vectors']} of {memories} memories"
            return None
        if index is not None and index["state"] == "unavailable":
            return f"the dense index is unavailable: {index['reason']}"
        if time.monotonic() > give_up:
            return found.get("note") or "the dense leg did not answer"
        time.sleep(0.5)


@dataclass
class Ranking:
    """The dialogue ids each question's search returned, best first."""

    ranked: list[list[str]]
    questions: list[Question]
    legs_used: Counter[str] = field(default_factory=Counter)
    notes: Counter[str] = field(default_factory=Counter)

    def recall(self, k: int, category: int | None = None) -> float:
        pairs = [(r, q) for r, q in zip(self.ranked, self.questions, strict=True)
                 if category is None or q.category == category]
        if not pairs:
            return math.nan
        return sum(any(d in q.evidence for d in r[:k]) for r, q in pairs) / len(pairs)


def search_all(caller: Caller, conversations: Sequence[Conversation], mode: str, k: int,
               window: int) -> Ranking:
    asked = [(c, q) for c in conversations for q in c.questions]
    results = caller.pipelined("memory.search", (
        (lambda c=c, q=q: {"query": q.text, "scope": c.scope, "k": k, "min_confidence": 0.0,
                           "mode": mode}) for c, q in asked), window)
    ranking = Ranking([], [q for _, q in asked])
    for (conversation, _), result in zip(asked, results, strict=True):
        ranking.ranked.append([conversation.dia_of[hit["id"]] for hit in result["results"]])
        ranking.legs_used["+".join(result["legs_used"])] += 1
        if result.get("note"):
            ranking.notes[result["note"]] += 1
    return ranking


def lexical_ids(caller: Caller, conversations: Sequence[Conversation], window: int
                ) -> list[list[int]]:
    """The lexical leg's first `LEG_CANDIDATES` memory ids for each question."""
    asked = [(c, q) for c in conversations for q in c.questions]
    results = caller.pipelined("memory.search", (
        (lambda c=c, q=q: {"query": q.text, "scope": c.scope, "k": LEG_CANDIDATES,
                           "min_confidence": 0.0, "mode": "lexical"}) for c, q in asked),
        window)
    return [[hit["id"] for hit in result["results"]] for result in results]


# ---- the passes ------------------------------------------------------------------------

@dataclass
class RecallRow:
    label: str
    ranking: Ranking | None
    note: str = ""


@dataclass
class Report:
    args: argparse.Namespace
    conversations: list[Conversation] = field(default_factory=list)
    record_rates: dict[str, float] = field(default_factory=dict)
    rows: list[RecallRow] = field(default_factory=list)
    tuning: list[tuple[str, Ranking | None, str]] = field(default_factory=list)
    lexical: Ranking | None = None
    techniques: list[tuple[str, float, float, float, float]] = field(default_factory=list)
    hashing_ids: dict[str, dict[int, str]] = field(default_factory=dict)
    """The dialogue id of each memory id of the hashing run, by conversation (memory ids
    stay the same when a daemon restarts on its data directory)."""
    technique_notes: list[str] = field(default_factory=list)

    def print(self) -> None:
        args = self.args
        questions = sum(len(c.questions) for c in self.conversations)
        left_out = sum(c.left_out for c in self.conversations)
        turns = sum(len(c.turns) for c in self.conversations)
        print()
        print(f"LoCoMo recall: {platform.python_implementation()} {platform.python_version()},"
              f" {os.cpu_count()} CPUs; data {args.dir}")
        print(f"{len(self.conversations)} conversations, {turns:,} turns recorded as "
              f"memories, {questions} questions of categories 1-4 ({left_out} left out: "
              "no evidence turn named)")
        for label, rate in self.record_rates.items():
            print(f"memory.record, pipelined ({args.window} in flight), {label}: "
                  f"{rate:,.0f} memories/s")
        print()
        if self.rows:
            header = ("retrieval", "R@5", "R@10", *(f"R@5 cat {c}" for c in CATEGORIES),
                      "note")
            rows: list[tuple[str, ...]] = [header]
            for row in self.rows:
                if row.ranking is None:
                    rows.append((row.label, "-", "-", *("-" for _ in CATEGORIES), row.note))
                    continue
                rows.append((row.label, *_recalls(row.ranking),
                             *(f"{row.ranking.recall(5, c):.3f}" for c in CATEGORIES),
                             row.note))
            for label, at5, at10 in REFERENCE:
                rows.append((f"reference: {label}", f"{at5:.3f}", f"{at10:.3f}",
                             *("" for _ in CATEGORIES), "README, all 10 conversations"))
            print_table(rows)
            print()
        if self.tuning:
            lexical = self.lexical
            print("tuning, hashing embedder, hybrid (each row a daemon restarted with the "
                  "setting's flags; others at their defaults)")
            rows = [("setting", "R@5", "R@10", "R@5 - lexical", "R@10 - lexical", "note")]
            for label, ranking, note in self.tuning:
                if ranking is None:
                    rows.append((label, "-", "-", "-", "-", note))
                    continue
                deltas = (("-", "-") if lexical is None else
                          tuple(f"{ranking.recall(k) - lexical.recall(k):+.3f}"
                                for k in K_VALUES))
                rows.append((label, *_recalls(ranking), *deltas, note))
            print_table(rows)
            print()
        if self.techniques:
            print("techniques (scratch code in this process, fused with the daemon's lexical "
                  "leg as the daemon fuses)")
            rows = [("variant", "dense R@5", "dense R@10", "hybrid R@5", "hybrid R@10")]
            rows += [(label, *(f"{value:.3f}" for value in values))
                     for label, *values in self.techniques]
            print_table(rows)
            for note in self.technique_notes:
                print(f"  {note}")
            print()


def _recalls(ranking: Ranking) -> tuple[str, str]:
    at5, at10 = (ranking.recall(k) for k in K_VALUES)
    return f"{at5:.3f}", f"{at10:.3f}"


def embedders(args: argparse.Namespace) -> list[tuple[str, str, dict[str, str], str | None]]:
    """(label, python, settings, reason to skip) for each embedder."""
    found: list[tuple[str, str, dict[str, str], str | None]] = [
        ("hashing", sys.executable, {}, None)]
    python = args.st_python or sys.executable
    probe = subprocess.run([python, "-c", "import sentence_transformers"],
                           capture_output=True, check=False)
    settings = {"embedder": "sentence-transformers"}
    if args.model_path:
        settings["model-path"] = args.model_path
    reason = None
    if probe.returncode != 0:
        reason = (f"skipped: sentence-transformers is not installed for {python} (install "
                  "ctxd's `semantic` extra, or pass --st-python)")
    found.append(("sentence-transformers", python, settings, reason))
    return found


def recall_pass(report: Report, root: Path) -> None:
    args = report.args
    conversations = report.conversations
    total = sum(len(c.turns) for c in conversations)
    for label, python, settings, reason in embedders(args):
        if reason is not None:
            report.rows.append(RecallRow(label, None, reason))
            continue
        for conversation in conversations:
            conversation.dia_of.clear()
        data_dir = root / f"data-{label}"
        print(f"{label}: recording {total:,} turns ...", flush=True)
        with running(root, data_dir, label, python, settings) as (_, caller):
            report.record_rates[label] = record_all(caller, conversations, args.window)
            problem = wait_memory_ready(caller, total, args.index_timeout)
            modes = ("lexical",) if problem else ("lexical", "dense", "hybrid")
            for mode in modes:
                ranking = search_all(caller, conversations, mode, max(K_VALUES), args.window)
                report.rows.append(RecallRow(f"{label}: {mode}", ranking, _notes(ranking)))
                if label == "hashing" and mode == "lexical":
                    report.lexical = ranking
            if problem:
                report.rows.append(RecallRow(f"{label}: dense, hybrid", None,
                                             f"skipped: {problem}"))
        if label == "hashing":
            report.hashing_ids = {c.stem: dict(c.dia_of) for c in conversations}


def _notes(ranking: Ranking) -> str:
    parts = [f"legs {legs}: {count}" for legs, count in ranking.legs_used.items()
             if len(ranking.legs_used) > 1]
    parts += [f"{note} ({count})" for note, count in ranking.notes.items()]
    return "; ".join(parts)


def tune_pass(report: Report, root: Path) -> None:
    args = report.args
    conversations = report.conversations
    total = sum(len(c.turns) for c in conversations)
    for conversation in conversations:
        conversation.dia_of = dict(report.hashing_ids[conversation.stem])
    for number, (label, settings) in enumerate(TUNING):
        print(f"tuning {number + 1}/{len(TUNING)}: {label}", flush=True)
        with running(root, root / "data-hashing", f"tune-{number}", sys.executable,
                     settings) as (_, caller):
            problem = wait_memory_ready(caller, total, args.index_timeout)
            if problem:
                report.tuning.append((label, None, problem))
                continue
            ranking = search_all(caller, conversations, "hybrid", max(K_VALUES), args.window)
            report.tuning.append((label, ranking, _notes(ranking)))


# ---- techniques: scratch variants of the hashing embedder and of the fusion -------------

Vectors = npt.NDArray[np.float32]
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Not the lexical leg's list (ctxd/memory/_queries.py STOPWORDS, 126 words) but the 103 of
# them that the technique figures of docs/performance.md were measured with; with the
# lexical leg's, the rows that drop stop words move by up to 0.006.
STOP_WORDS = frozenset(
    "a about after again all am an and any are as at be been before being but by can could "
    "did do does doing for from had has have having he her here hers him his how i if in "
    "into is it its just me more most my no nor not of off on once only or other our out "
    "over own same she should so some such than that the their them then there these they "
    "this those through to too under until up very was we were what when where which while "
    "who whom why will with would you your".split())
@dataclass(frozen=True)
class Variant:
    """A feature-hashing embedder: which features, how they are weighted."""

    label: str
    dim: int = 1024
    stem: Callable[[str], str] = light_stem
    """The daemon's by default."""
    pairs: bool = True
    stop_words: bool = False
    char_ngrams: tuple[int, ...] = ()
    char_weight: float = 1.0
    idf: str = "none"
    """"none"; "both": documents and queries weighted by IDF (document frequencies of the
    stored memories); "query": queries only, by IDF squared (stored vectors need no IDF)."""

    def features(self, text: str) -> Counter[str]:
        raw = _WORD.findall(text.lower())
        words = [self.stem(w) for w in raw if not (self.stop_words and w in STOP_WORDS)]
        features = Counter(words)
        if self.pairs:
            features.update(f"{a} {b}" for a, b in itertools.pairwise(words))
        for n in self.char_ngrams:
            for word in set(raw) - (STOP_WORDS if self.stop_words else set()):
                padded = f"<{word}>"
                features.update(f"#{padded[i:i + n]}" for i in range(len(padded) - n + 1))
        return features


bucket = functools.cache(feature_bucket)
"""The daemon's hashing of a feature into a dimension and a sign, remembered."""


def embed(variant: Variant, texts: Sequence[str], idf: dict[str, float] | None) -> Vectors:
    vectors = np.zeros((len(texts), variant.dim), dtype=np.float32)
    for row, text in enumerate(texts):
        for feature, count in variant.features(text).items():
            place, sign = bucket(feature, variant.dim)
            weight = 1.0 + math.log(count)
            if feature.startswith("#"):
                weight *= variant.char_weight
            if idf is not None:
                weight *= idf.get(feature, 1.0)
            vectors[row, place] += sign * weight
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    np.divide(vectors, norms, out=vectors, where=norms > 0)
    return vectors


@dataclass(frozen=True)
class Fusion:
    dense_weight: float = 1.0
    rrf_k: int = 60
    min_score: float = 0.1


def techniques_pass(report: Report, root: Path) -> None:
    """Dense legs of scratch embedders, fused with the daemon's lexical leg."""
    args = report.args
    conversations = report.conversations
    for conversation in conversations:
        conversation.dia_of = dict(report.hashing_ids[conversation.stem])
    print("techniques: the daemon's lexical leg ...", flush=True)
    with running(root, root / "data-hashing", "techniques", sys.executable, {}) as (_, caller):
        lexical = lexical_ids(caller, conversations, args.window)
    asked = [(c, q) for c in conversations for q in c.questions]
    by_scope: dict[str, tuple[list[int], list[str]]] = {}
    for conversation in conversations:
        ids = sorted(conversation.dia_of)
        texts = {dia: params for dia, params in conversation.turns}
        by_scope[conversation.scope] = (
            ids, [f"{texts[conversation.dia_of[i]]['title']}\n"
                  f"{texts[conversation.dia_of[i]]['content']}" for i in ids])
    all_texts = [text for _, texts in by_scope.values() for text in texts]

    def run(variant: Variant, fusion: Fusion) -> tuple[float, float, float, float]:
        idf = None
        if variant.idf != "none":
            df: Counter[str] = Counter()
            for text in all_texts:
                df.update(variant.features(text).keys())
            power = 2.0 if variant.idf == "query" else 1.0
            idf = {f: (math.log((1 + len(all_texts)) / (1 + n)) + 1.0) ** power
                   for f, n in df.items()}
        stored_idf = idf if variant.idf == "both" else None
        matrices = {scope: embed(variant, texts, stored_idf)
                    for scope, (_, texts) in by_scope.items()}
        queries = embed(variant, [q.text for _, q in asked], idf)
        dense_hits = {5: 0, 10: 0}
        hybrid_hits = {5: 0, 10: 0}
        for row, ((conversation, question), lexical_leg) in enumerate(
                zip(asked, lexical, strict=True)):
            ids, _ = by_scope[conversation.scope]
            scores = matrices[conversation.scope] @ queries[row]
            order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))
            dense = [ids[i] for i in order if scores[i] >= fusion.min_score][:LEG_CANDIDATES]
            fused = [memory_id for memory_id, _, _ in fuse(
                {"lexical": lexical_leg[:LEG_CANDIDATES], "dense": dense},
                {"lexical": 1.0, "dense": fusion.dense_weight}, fusion.rrf_k)[:max(K_VALUES)]]
            for k in K_VALUES:
                dense_hits[k] += any(conversation.dia_of[i] in question.evidence
                                     for i in dense[:k])
                hybrid_hits[k] += any(conversation.dia_of[i] in question.evidence
                                      for i in fused[:k])
        n = len(asked)
        return dense_hits[5] / n, dense_hits[10] / n, hybrid_hits[5] / n, hybrid_hits[10] / n

    default = Fusion()
    light = Fusion(dense_weight=0.25, rrf_k=10, min_score=0.2)
    tuned = Fusion(dense_weight=0.25, rrf_k=10)
    best = {"stop_words": True, "char_ngrams": (3, 4), "char_weight": 0.5}
    variants: list[tuple[Variant, Fusion]] = [
        (Variant("daemon's embedder and fusion (words + pairs, 1024)"), default),
        (Variant("daemon's embedder"), light),
        (Variant("no word pairs", pairs=False), default),
        (Variant("no stemming", stem=lambda w: w), default),
        (Variant("5-letter prefixes as stems", stem=lambda w: w[:5]), default),
        (Variant("stop words dropped", stop_words=True), default),
        (Variant("char 3,4-grams x0.5", char_ngrams=(3, 4), char_weight=0.5), default),
        (Variant("IDF, documents and queries", idf="both"), default),
        (Variant("IDF squared, queries only", idf="query"), default),
        (Variant("stop words + IDF", stop_words=True, idf="both"), default),
        (Variant("stop words + char 3,4-grams x0.5 + IDF", idf="both", **best), default),
        (Variant("stop words + char 3,4-grams x0.5 + IDF", idf="both", **best),
         tuned),
        (Variant("stop words + char 3,4-grams x0.5 + IDF, 2048 dims", idf="both", dim=2048,
                 **best), default),
        (Variant("stop words + char 3,4-grams x0.5 + IDF squared on queries only",
                 idf="query", **best), default),
        (Variant("stop words + char 3,4-grams x0.5 + IDF squared on queries only",
                 idf="query", **best), tuned),
    ]
    for number, (variant, fusion) in enumerate(variants):
        label = variant.label
        if fusion != default:
            label += (f"; dense_weight {fusion.dense_weight}, rrf_k {fusion.rrf_k}, "
                      f"dense_min_score {fusion.min_score}")
        print(f"technique {number + 1}/{len(variants)}: {label}", flush=True)
        report.techniques.append((label, *run(variant, fusion)))
    sample = all_texts[:200]
    same = np.allclose(embed(Variant("daemon"), sample, None),
                       HashingEmbedder(1024).embed_sync(sample), atol=1e-6)
    report.technique_notes.append(
        "the scratch embedder with the daemon's options "
        + ("gives the daemon's HashingEmbedder vectors" if same else
           "DIFFERS from the daemon's HashingEmbedder: its rows are not comparable"))
    hybrid = next((row.ranking for row in report.rows if row.label == "hashing: hybrid"), None)
    if hybrid is not None:
        report.technique_notes.append(
            f"the daemon's own hybrid: R@5 {hybrid.recall(5):.3f}, R@10 "
            f"{hybrid.recall(10):.3f} (the first row should match it)")


def run_benchmark(report: Report) -> None:
    args = report.args
    report.conversations = load(Path(args.dir))
    with scratch_root("ctxd-l", args.keep_logs) as root:
        recall_pass(report, root)
        if args.tune:
            tune_pass(report, root)
        if args.techniques:
            techniques_pass(report, root)


def data_arguments(cli: argparse.ArgumentParser) -> None:
    """The arguments of a benchmark on these conversations: their folder, the window."""
    cli.add_argument("dir", nargs="?", default=str(DEFAULT_DIR),
                     help=f"folder of LoCoMo conversations (default {DEFAULT_DIR})")
    cli.add_argument("--window", type=int, default=32,
                     help="pipelined requests in flight (default 32)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    data_arguments(cli)
    cli.add_argument("--tune", action="store_true",
                     help="hybrid recall of the hashing embedder under other settings")
    cli.add_argument("--techniques", action="store_true",
                     help="scratch variants of the hashing embedder and of the fusion")
    cli.add_argument("--st-python", metavar="PYTHON",
                     help="interpreter of the sentence-transformers daemon (default: this one)")
    cli.add_argument("--model-path", metavar="DIR",
                     help="sentence-transformers model folder (default: the daemon's)")
    cli.add_argument("--index-timeout", type=float, default=900.0,
                     help="seconds to wait for a daemon's dense index (default 900)")
    cli.add_argument("--keep-logs", metavar="DIR", help="copy the daemons' logs to DIR")
    args = cli.parse_args(argv)
    if args.window < 1:
        cli.error("--window must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    run_and_report(Report(parse_args(argv)), run_benchmark)


if __name__ == "__main__":
    main()
