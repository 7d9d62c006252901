"""The dense leg's approximate index against the exact one: how much of the exact top 5 it
finds, and at what cost, as ``nprobe`` grows; beside it, an exact search by postings
(the hashing embedder's vectors are sparse: about 100 of 1,024 dimensions set).

In this process, on ``bench/memory.py``'s synthetic memories (the same writer: 20 project
scopes and ``global``) embedded by the daemon's hashing embedder, an IVF made as the
daemon makes it (``lists_for``, its codes, trained on every memory up to 100,000) and
searched as the daemon searches (k 50, within the bitmap of a project's scope and the
global one). The baseline is the exact top 5 (inner product of the 32-bit vectors) within
the same scope. Queries: ``memory.search``'s (4-10 words) and a branch's injection (a
description and a 1 KB prompt).

The search by postings (each dimension's memories and values, its scores added up with
``np.bincount``) is measured three ways: over the postings of the scopes a query sees
(the project's and the global one, kept apart as the lexical mirror keeps its shards),
over every memory's postings with the scope filtered after, and over the scopes' with a
budget of postings (the query's heaviest dimensions first) whose 50 best are then scored
exactly.

Run: ``python bench/dense_recall.py`` (about 2 minutes at 100,000 memories).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the daemon (ctxd/memory/_index.py)

import argparse
import sys
import time
from collections.abc import Sequence

import faiss
import numpy as np
from memory import PROJECTS, Writer
from rpc import machine_line, print_table

from ctxd.memory import CODES, HashingEmbedder, fix_code_range, lists_for

K = 5
CANDIDATES = 50  # what the dense leg asks FAISS for (ctxd/memory/_retrieval.py)


class Postings:
    """The postings of some memories' vectors: each dimension's memories (as positions
    among ``rows``) and values, one run per dimension."""

    def __init__(self, vectors: np.ndarray, rows: np.ndarray):
        self.rows = rows
        dims, self.members = np.nonzero(vectors[rows].T)
        self.values = vectors[rows].T[dims, self.members]
        self.starts = np.searchsorted(dims, np.arange(vectors.shape[1] + 1))
        self.sizes = np.diff(self.starts)

    def scores(self, q: np.ndarray, dims: np.ndarray) -> np.ndarray:
        """Each of ``rows``' inner product with ``q`` over ``dims``."""
        starts = self.starts
        members = np.concatenate([self.members[starts[d]:starts[d + 1]] for d in dims])
        values = np.concatenate([self.values[starts[d]:starts[d + 1]] for d in dims])
        values *= np.repeat(q[dims], self.sizes[dims])
        return np.bincount(members, values, minlength=len(self.rows))


def top(scores: np.ndarray, k: int) -> np.ndarray:
    """The positions of the ``k`` highest scores, highest first."""
    k = min(k, len(scores))
    best = np.argpartition(-scores, k - 1)[:k]
    return best[np.argsort(-scores[best], kind="stable")]


def main(argv: Sequence[str] | None = None) -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    cli.add_argument("--memories", type=int, default=100_000)
    cli.add_argument("--queries", type=int, default=300)
    args = cli.parse_args(argv)
    writer = Writer(seed=20251122)
    memories = [writer.memory() for _ in range(args.memories)]
    texts = ["\n".join([m["title"], m["description"], m["content"], " ".join(m["tags"])])
             for m in memories]
    embedder = HashingEmbedder()
    print(f"embedding {len(texts):,} memories ...", flush=True)
    vectors = np.concatenate([embedder.embed_sync(texts[i:i + 512])
                              for i in range(0, len(texts), 512)])
    scope = np.array([-1 if m["scope"] == "global" else int(m["scope"].rsplit("-", 1)[1])
                      for m in memories])
    project = 1
    within = np.flatnonzero((scope == -1) | (scope == project))
    bitmap = np.zeros((len(texts) + 7) // 8, np.uint8)
    np.bitwise_or.at(bitmap, within >> 3, (1 << (within & 7)).astype(np.uint8))
    selector = faiss.IDSelectorBitmap(len(bitmap), faiss.swig_ptr(bitmap))
    lists = lists_for(len(texts))
    quantizer = faiss.IndexFlatIP(vectors.shape[1])
    ivf = faiss.IndexIVFScalarQuantizer(quantizer, vectors.shape[1], lists, CODES,
                                        faiss.METRIC_INNER_PRODUCT)
    print(f"training an IVF of {lists:,} lists ...", flush=True)
    ivf.train(vectors[:100_000])
    fix_code_range(ivf)
    ivf.add_with_ids(vectors, np.arange(len(texts), dtype=np.int64))
    scoped = vectors[within]
    shards = [Postings(vectors, np.flatnonzero(scope == -1)),
              Postings(vectors, np.flatnonzero(scope == project))]
    every = Postings(vectors, np.arange(len(texts)))
    allowed = np.zeros(len(texts), bool)
    allowed[within] = True
    queries = {
        "memory.search query (4-10 words)": [writer.query(texts) for _ in range(args.queries)],
        "injection (description + 1 KB prompt)": [
            writer.sentence(6, 12) + "\n" + writer.prompt(1024) for _ in range(args.queries)]}
    rows: list[tuple[str, ...]] = [("queries", "search", "exact top 5 found", "p50 / p99")]
    for name, texts_of_queries in queries.items():
        embedded = embedder.embed_sync(texts_of_queries)
        exact = [set(within[np.argsort(-(scoped @ q), kind="stable")[:K]].tolist())
                 for q in embedded]

        def measure(search: object, label: str, exact: list[set[int]] = exact,
                    embedded: np.ndarray = embedded, name: str = name) -> None:
            found, seconds = 0, []
            for q, best in zip(embedded, exact, strict=True):
                began = time.perf_counter()
                top = search(q)  # type: ignore[operator]
                seconds.append(time.perf_counter() - began)
                found += len(best & set(top[:K]))
            samples = np.array(seconds) * 1e3
            rows.append((name, label, f"{found / (K * len(exact)):.1%}",
                         f"{np.percentile(samples, 50):.2f} / "
                         f"{np.percentile(samples, 99):.2f} ms"))

        for nprobe in (64, 128, 256, 512):
            params = faiss.SearchParametersIVF()
            params.nprobe, params.sel = nprobe, selector

            def by_ivf(q: np.ndarray, params: object = params) -> list[int]:
                _, ids = ivf.search(q[None, :], CANDIDATES, params=params)
                return ids[0].tolist()

            measure(by_ivf, f"IVF, nprobe {nprobe}" + (" (the default)" if nprobe == 64
                                                        else ""))

        def by_shards(q: np.ndarray, budget: int | None = None) -> list[int]:
            dims = np.flatnonzero(q)
            if budget is not None:  # the heaviest dimensions first, up to the budget
                dims = dims[np.argsort(-np.abs(q[dims]), kind="stable")]
                held = np.cumsum(sum(shard.sizes[dims] for shard in shards))
                dims = dims[:max(1, int(np.searchsorted(held, budget)))]
            ids = np.concatenate([shard.rows for shard in shards])
            scores = np.concatenate([shard.scores(q, dims) for shard in shards])
            best = ids[top(scores, CANDIDATES)]
            if budget is not None:  # the candidates scored exactly
                best = best[np.argsort(-(vectors[best] @ q), kind="stable")]
            return best.tolist()

        def by_every_memory(q: np.ndarray) -> list[int]:
            scores = every.scores(q, np.flatnonzero(q))
            scores[~allowed] = -np.inf
            return top(scores, CANDIDATES).tolist()

        measure(by_shards, "exact, by postings of the scopes seen")
        measure(by_every_memory, "exact, by postings of every memory")
        for budget in (200_000, 400_000):
            measure(lambda q, budget=budget: by_shards(q, budget),
                    f"by postings, {budget:,} at most, the best 50 rescored")
    print()
    print(machine_line("ctxd dense leg: approximate against exact"))
    print(f"{len(texts):,} memories, {PROJECTS} projects and global; a project's scope holds "
          f"{len(within):,}; {vectors.astype(bool).sum(1).mean():.0f} of "
          f"{vectors.shape[1]:,} dimensions set per memory (mean)")
    print()
    print_table(rows)


if __name__ == "__main__":
    sys.exit(main())
