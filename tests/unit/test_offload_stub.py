"""The offload stub (docs/protocol.md, "Offloaded tool results"): its excerpt keeps the
head, the tail and the error lines within 600 characters, the same bytes for the same
text; what stays inline (small results, errors up to four times the threshold, ctxd's own
tools' answers)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import trio
import trio.lowlevel
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxd.hygiene import (
    EXCERPT_CHARS,
    OFF_LOOP_CHARS,
    excerpt,
    offload,
    offload_off_loop,
    ref_id_for,
    stub_text,
)
from ctxd.wire.types import MessageIn

LOG = [f"line {i:05d} of the build log" for i in range(1000)]  # 27 characters a line
FAILING_RUN = ([f"test_case_{n:03d} ... ok" for n in range(300)]  # 20 characters a line
               + ["FAIL: test_parser_handles_unicode (tests.test_parser.ParserTest)",
                  "Traceback (most recent call last):",
                  '  File "parser.py", line 88',
                  "    return x +",
                  "SyntaxError: invalid syntax"]
               + [f"test_case_{n:03d} ... ok" for n in range(300, 600)]
               + ["Ran 601 tests in 0.912s", "FAILED (failures=1)"])


def tool(text: str, name: str | None = "Bash", is_error: bool = False) -> MessageIn:
    return MessageIn(role="tool", content=text, name=name, tool_call_id="t1",
                     meta={"is_error": True} if is_error else None)


def test_the_stub_of_a_log_shows_its_first_and_last_lines() -> None:
    text = "".join(line + "\n" for line in LOG)
    ref_id = ref_id_for("s1", 2)
    # 28 characters a line with its newline: six lines fit in 180 at each end.
    assert stub_text(len(text), "Bash", text, ref_id) == (
        '[Tool result stored — 28,000 bytes, 1,000 lines from "Bash". First and last '
        "lines, and lines with errors:\n" + "\n".join(LOG[:6]) + "\n[… 988 lines …]\n"
        + "\n".join(LOG[-6:]) + f'\n] Use read_result with ref_id="{ref_id}" (or run: '
        f"ctxctl result {ref_id}) to read more.")


def test_a_failing_test_runs_fail_and_syntax_error_lines_are_in_its_stub() -> None:
    text = "\n".join(FAILING_RUN) + "\n"
    stub, _blob = offload(tool(text), 4096, "s1", 7) or (None, None)
    assert stub is not None
    # Head: 8 lines of 21 (168 of 180). Tail: the two summary lines (20 + 24) and six test
    # lines (21 each: 170 of 180). Between them, the lines that hold FAIL and Error, in
    # order (the words are case-sensitive: "Traceback" is none of them).
    shown = excerpt(text)
    assert shown == "\n".join([
        *FAILING_RUN[:8], "[… 292 lines …]", FAILING_RUN[300], "[… 3 lines …]",
        FAILING_RUN[304], "[… 294 lines …]", *FAILING_RUN[-8:]])
    assert len(shown) <= EXCERPT_CHARS
    ref_id = ref_id_for("s1", 7)
    assert stub.content == (
        f"[Tool result stored — {len(text):,} bytes, 607 lines from \"Bash\". First and "
        f"last lines, and lines with errors:\n{shown}\n] Use read_result with "
        f'ref_id="{ref_id}" (or run: ctxctl result {ref_id}) to read more.')
    assert "FAIL: test_parser_handles_unicode" in stub.content
    assert "SyntaxError: invalid syntax" in stub.content


def test_long_lines_are_cut_and_the_cut_is_marked() -> None:
    one_line = "x" * 10_000
    assert excerpt(one_line) == "x" * 179 + "…\n…" + "x" * 179
    error_line = "b" * 300 + " error here " + "c" * 500
    text = "a" * 300 + "\n" + error_line + "\n" + "d" * 400
    # The error line is cut to 160 around its word: 40 characters before it.
    at = error_line.index("error")
    window = error_line[at - 40:at - 40 + 158]
    assert excerpt(text) == ("a" * 179 + "…\n…" + window + "…\n…" + "d" * 179)


def test_error_lines_beyond_the_bound_are_left_out_in_order() -> None:
    errors = [f"error {n}: " + "e" * 100 for n in range(8)]  # 109 characters each
    fill = [f"filler line {n}" for n in range(5)]  # 13 characters: past 180 after the head
    text = "\n".join(["h" * 170, *fill, *errors, "t" * 170])
    # Head and tail take 170 each; the error lines that fit in the rest, with the markers
    # of the lines skipped: the first two (170 + 14 + 110 + 110 + 14 + 171 = 589 of 600).
    assert excerpt(text) == "\n".join(
        ["h" * 170, "[… 5 lines …]", errors[0], errors[1], "[… 6 lines …]", "t" * 170])


def test_short_results_and_ctxds_own_answers_stay_inline() -> None:
    assert offload(tool("a" * 4096), 4096, "s1", 1) is None
    assert offload(tool("a" * 4097), 4096, "s1", 1) is not None
    assert offload(tool("é" * 2048), 4096, "s1", 1) is None  # 4,096 bytes
    assert offload(tool("é" * 2049), 4096, "s1", 1) is not None
    # An error stays inline up to four times the threshold; beyond, its stub.
    assert offload(tool("e" * 16_384, is_error=True), 4096, "s1", 1) is None
    stubbed = offload(tool("e" * 16_385, is_error=True), 4096, "s1", 1)
    assert stubbed is not None
    assert stubbed[0].meta == {"is_error": True}
    # ctxd's own tools, as Claude Code and OpenCode name them: never offloaded.
    for name in ("mcp__ctxd__read_result", "ctxd_read_result"):
        assert offload(tool("r" * 100_000, name=name), 4096, "s1", 1) is None
    assert offload(tool("r" * 100_000, name="mcp__other__read_result"), 4096, "s1",
                   1) is not None


def test_the_same_text_gives_the_same_stub_in_another_interpreter() -> None:
    """Nothing of the excerpt depends on a set's or a hash's order (string hashes change
    with each interpreter)."""
    program = ("import sys; from ctxd.hygiene import stub_text; "
               "text = sys.stdin.read(); "
               "sys.stdout.write(stub_text(len(text.encode()), 'Bash', text, 'res_x'))")
    text = "\n".join(FAILING_RUN * 3)
    runs = {subprocess.run([sys.executable, "-c", program], input=text, capture_output=True,
                           text=True, check=True, env={"PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2")}
    assert runs == {stub_text(len(text.encode()), "Bash", text, "res_x")}


LINE = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\n"), max_size=300),
    st.sampled_from(["error: x", "FAILED", "Traceback (most recent call last):",
                     "SyntaxError: bad", "", "ok"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(LINE, min_size=1, max_size=200), st.booleans())
def test_an_excerpt_is_bounded_and_shows_only_the_texts_own_lines(
        lines: list[str], newline_at_end: bool) -> None:
    text = "\n".join(lines) + ("\n" if newline_at_end else "")
    shown = excerpt(text)
    assert len(shown) <= EXCERPT_CHARS
    assert shown == excerpt(text)
    for line in shown.split("\n") if shown else []:
        if line.startswith("[… ") and line.endswith(" …]"):
            continue
        assert line.removeprefix("…").removesuffix("…") in text


SHORT_ERROR = st.builds(lambda word, rest: word + rest, st.sampled_from(
    ["error", "Error", "FAIL", "failed", "exception"]), st.text("xyz :", max_size=50))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text("abc ", max_size=80), min_size=30, max_size=80),
       st.lists(SHORT_ERROR, min_size=1, max_size=2), st.data())
def test_a_few_short_error_lines_are_always_shown(
        plain: list[str], errors: list[str], data: st.DataObject) -> None:
    lines = list(plain)
    for error in errors:
        lines.insert(data.draw(st.integers(0, len(lines))), error)
    shown = excerpt("\n".join(lines)).split("\n")
    for error in errors:
        assert error in shown


async def test_a_very_long_result_is_offloaded_off_the_event_loop() -> None:
    """Over `OFF_LOOP_CHARS` a result's stub is made in a worker thread (its excerpt scans
    the whole text): the loop's other tasks run meanwhile; below it, inline."""
    runs = 0

    async def watch() -> None:
        nonlocal runs
        while True:
            runs += 1
            await trio.lowlevel.checkpoint()

    async def loop_runs_while(message: MessageIn) -> tuple[int, Any]:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await trio.lowlevel.checkpoint()
            before = runs
            done = await offload_off_loop(message, 4096, "s_off", 7)
            during = runs - before
            nursery.cancel_scope.cancel()
        return during, done

    long = MessageIn(role="tool", content="ok\n" * (OFF_LOOP_CHARS // 3 + 1), name="bash",
                     tool_call_id="c1")
    short = MessageIn(role="tool", content="ok\n" * 10_000, name="bash", tool_call_id="c2")
    during, done = await loop_runs_while(long)
    assert during > 0
    assert done == offload(long, 4096, "s_off", 7)
    during, done = await loop_runs_while(short)
    assert during == 0
    assert done == offload(short, 4096, "s_off", 7)
