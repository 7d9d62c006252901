"""Fitting memories into a branch's injected message by exact token counts."""

import random
import string
from pathlib import Path

import apsw
import pytest
from tests_support import COUNTER

from ctxd.memory import _queries as q
from ctxd.memory._injection import HEADER, PROMPT_HEADER, Candidate, block, fit, head, tail
from ctxd.memory._lexical import LexicalIndex
from ctxd.store import migrate

AWKWARD = string.ascii_letters + string.digits + " .,;:!?-\n\t()[]{}'\"`~/\\|@#$%^&*_+=<>é中😀"


def _text(rng: random.Random, shortest: int, longest: int) -> str:
    if rng.random() < 0.1:  # blank: its block is its head and a newline
        return "".join(rng.choice(" \n\t") for _ in range(max(1, shortest)))
    return "".join(rng.choice(AWKWARD) for _ in range(rng.randint(shortest, longest)))


@pytest.mark.parametrize("header", [HEADER, PROMPT_HEADER])
def test_the_items_and_the_header_add_up_to_the_message_exactly(header: str) -> None:
    # Texts that end in punctuation, spaces or newlines would merge with a following
    # separator in a naive concatenation; the blocks are built so that they never do. A
    # content's tokens kept from before give the same counts as counting it now.
    rng = random.Random(7)
    for _ in range(500):
        contents = [_text(rng, 1, 120) for _ in range(rng.randint(1, 10))]
        kept = [rng.random() < 0.5 for _ in contents]
        candidates = [
            Candidate(i, _text(rng, 0, 20), content, rng.choice([0.7, 0.8, 0.91, 1.0]),
                      rng.choice(["success", "failure"]),
                      COUNTER.count(shown) if keep and (shown := tail(content)) else None)
            for i, (content, keep) in enumerate(zip(contents, kept, strict=True), start=1)]
        injected = fit(candidates, COUNTER, 100_000, header)
        assert injected.text is not None
        assert injected.text.startswith(header)
        assert injected.tokens == COUNTER.message_tokens("user", injected.text)
        assert injected.tokens == COUNTER.message_tokens("user", header) + sum(
            item.tokens for item in injected.items)
        for candidate, item in zip(candidates, injected.items, strict=True):
            block_text = block(head(candidate.title, candidate.confidence, candidate.outcome),
                               tail(candidate.content))
            assert item.tokens == COUNTER.count(block_text)
        assert injected.counted == {
            c.memory_id: (COUNTER.count(f" {c.content.rstrip()}\n"), c.content)
            for c in candidates if c.content_tokens is None and c.content.strip()}
        assert injected.shown == {c.memory_id: c.content for c in candidates}


def test_items_that_do_not_fit_are_skipped_and_later_ones_still_tried() -> None:
    candidates = [Candidate(1, "long", "word " * 400, 0.9, "success", None),
                  Candidate(2, "short", "run the tests with the venv", 0.8, "failure", None),
                  Candidate(3, "also short", "bump user_version", 0.75, "success", 4)]
    injected = fit(candidates, COUNTER, 60)
    assert [item.id for item in injected.items] == [2, 3]
    assert injected.text == (HEADER + "- short (confidence 0.80, learned from a failure): "
                             "run the tests with the venv\n- also short (confidence 0.75): "
                             "bump user_version\n")
    assert injected.tokens == COUNTER.message_tokens("user", injected.text) <= 60
    nothing = fit(candidates[:1], COUNTER, 60)
    assert (nothing.text, nothing.injection.status) == (None, "none_found")
    assert nothing.counted == {1: (401, "word " * 400)}
    # Counted, so kept, whether it fitted or not; a kept count is not counted again.
    assert injected.counted == {1: (401, "word " * 400), 2: (8, "run the tests with the venv")}


def test_kept_content_tokens_are_forgotten_when_the_encoding_changes(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "ctxd.db"))
    migrate(conn)
    mirror = LexicalIndex()
    contents = ["bump user_version", "run the tests with the venv", "a reused id's new text"]
    with conn:
        q.count_tokens_with(conn, "cl100k_base")
        for content in contents[:2]:
            q.insert(conn, mirror, q.NewMemory(
                scope="global", title="lesson", description="", content=content,
                outcome="success", tags="", prior=q.PRIOR_RECORDED, source=None,
                created_at=0.0, content_tokens=None))
        # Kept only for the content they were counted for, and only where none is kept.
        q.keep_content_tokens(conn, {1: (4, contents[0]), 2: (99, contents[2])})
        q.keep_content_tokens(conn, {1: (98, contents[0])})

    def kept() -> list[tuple[int, int | None]]:
        return conn.execute("SELECT id, content_tokens FROM memories ORDER BY id").fetchall()

    assert kept() == [(1, 4), (2, None)]
    with conn:
        q.count_tokens_with(conn, "cl100k_base")  # the same encoding: kept
    assert kept() == [(1, 4), (2, None)]
    with conn:
        q.count_tokens_with(conn, "o200k_base")
    assert kept() == [(1, None), (2, None)]
    assert conn.execute("SELECT tokens_encoding FROM memory_index_state").fetchall() == [
        ("o200k_base",)]


def test_a_use_is_recorded_only_for_the_memory_that_was_shown(tmp_path: Path) -> None:
    # A memory injected, then deleted before the branch's write: its id is never given
    # again, but a database from before schema version 17 may have given it to a new
    # memory (the row moved to that id here, as such a database holds it): the use is not
    # the new memory's.
    conn = apsw.Connection(str(tmp_path / "ctxd.db"))
    migrate(conn)
    mirror = LexicalIndex()

    def new(content: str) -> int:
        item, _ = q.insert(conn, mirror, q.NewMemory(
            scope="global", title="lesson", description="", content=content,
            outcome="success", tags="", prior=q.PRIOR_RECORDED, source=None, created_at=0.0))
        return item.id

    with conn:
        kept, shown = new("bump user_version"), new("run the tests with the venv")
        q.delete(conn, mirror, shown)
        fresh = new("an unrelated lesson")
        assert fresh == shown + 1
        conn.execute("UPDATE memories SET id = ? WHERE id = ?", (shown, fresh))
        reused = shown
    with conn:
        q.record_use(conn, mirror, {kept: "bump user_version",
                                    shown: "run the tests with the venv"}, "branch-1", 1.0)
    assert conn.execute("SELECT id, alpha, usage_count FROM memories ORDER BY id").fetchall(
        ) == [(kept, 4.1, 1), (reused, 4.0, 0)]
    assert conn.execute("SELECT memory_id, kind, source FROM memory_signals").fetchall() == [
        (kept, "use", "branch-1")]
