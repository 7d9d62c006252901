"""The summarizers: extractive (exact text on realistic spans, the bound), an external
command run for real, and an OpenAI-compatible chat endpoint served by a real local HTTP
server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from chat_server import ChatServer, SeenRequest

from ctxd.config import HygieneConfig
from ctxd.hygiene import SummarizerError, make_summarizer
from ctxd.hygiene._summarize import (
    INSTRUCTIONS,
    MAX_OUTPUT_BYTES,
    CommandSummarizer,
    ExtractiveSummarizer,
    HttpSummarizer,
    extract_summary,
    transcript,
)
from ctxd.wire.types import RenderedMessage as M

# ---- spans ----------------------------------------------------------------------------------

FIRST = ("Add a --json flag to `ctxctl status`. Tests must pass with pytest -x, and never "
         "edit the migrations in ctxd/store/migrations.")
LATEST = "Now document the flag in man/ctxctl.1, please."

ANTHROPIC_SPAN = [
    M(role="system", content="You are a coding agent."),
    M(role="user", content=FIRST),
    M(role="assistant", content=[
        {"type": "text", "text": "I'll read the CLI first."},
        {"type": "tool_use", "id": "toolu_1", "name": "read_file",
         "input": {"path": "clients/ctxctl/_main.py"}}]),
    M(role="user", content=[{"type": "tool_result", "tool_use_id": "toolu_1",
                             "content": "def status(args):\n    print(render(args))\n"}]),
    M(role="assistant", content=[
        {"type": "text", "text": "I'll use msgspec to encode the status instead of json.dumps. "
                                 "Running the tests now."},
        {"type": "tool_use", "id": "toolu_2", "name": "bash",
         "input": {"command": "pytest -x tests/unit/test_cli.py"}}]),
    M(role="user", content=[{"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                             "content": [{"type": "text", "text":
                                          "collected 5 items\nFAILED tests/unit/test_cli.py::"
                                          "test_status_json - assert 'text' == 'json'\n"
                                          "1 failed"}]}]),
    M(role="user", content="Keep the human output unchanged. Don't add a dependency for this."),
    M(role="assistant", content=[
        {"type": "tool_use", "id": "toolu_3", "name": "edit_file",
         "input": {"file_path": "clients/ctxctl/_main.py", "old": "print(", "new": "emit("}}]),
    M(role="user", content=[{"type": "tool_result", "tool_use_id": "toolu_3",
                             "content": "edited 1 line"}]),
    M(role="assistant", content=[
        {"type": "tool_use", "id": "toolu_4", "name": "bash",
         "input": {"command": "pytest -x tests/unit/test_cli.py"}}]),
    M(role="user", content=[{"type": "tool_result", "tool_use_id": "toolu_4",
                             "content": "5 passed in 0.12s"}]),
    M(role="assistant", content="The flag works; all 5 tests pass."),
    M(role="user", content=LATEST),
]
"""A session with Anthropic's shapes: tool_use parts, tool_result parts in user messages."""

ANTHROPIC_SUMMARY = f"""[Summary of 13 earlier messages]

First request:
{FIRST}

Latest request:
{LATEST}

Other requests:
- Keep the human output unchanged. Don't add a dependency for this.

Rules the user stated:
- Keep the human output unchanged.
- Don't add a dependency for this.

Decisions:
- I'll use msgspec to encode the status instead of json.dumps.

Errors:
- `pytest -x tests/unit/test_cli.py`: collected 5 items … FAILED tests/unit/test_cli.py::\
test_status_json - assert 'text' == 'json' → resolved: a later bash call succeeded

Files touched or named:
- ctxd/store/migrations
- clients/ctxctl/_main.py
- tests/unit/test_cli.py
- man/ctxctl.1

Commands run:
- `pytest -x tests/unit/test_cli.py`"""

OPENAI_SPAN = [
    M(role="user", content="Why does the app crash on start? Only look at src/, do not run it."),
    M(role="assistant", content=[
        {"type": "text", "text": "Going with a listing first."},
        {"type": "tool_call", "id": "call_1",
         "function": {"name": "shell", "arguments": '{"cmd": ["ls", "-la", "src/app"]}'}}]),
    M(role="tool", tool_call_id="call_1", content=(
        "Traceback (most recent call last):\n  File \"run.py\", line 3\n"
        "FileNotFoundError: [Errno 2] No such file or directory: 'src/app'")),
    M(role="assistant", content=[
        {"type": "function_call", "call_id": "fc_1", "name": "grep",
         "arguments": '{"pattern": "main", "path": "src/main.py"}'}]),
    M(role="user", content=[{"type": "function_call_output", "call_id": "fc_1",
                             "output": "src/main.py:4: def main():"}]),
    M(role="tool", name="shell", tool_call_id="call_2", content="ERROR: permission denied"),
]
"""OpenAI's shapes: tool_call parts with ``function.arguments`` as JSON text and ``tool``
messages (chat completions); function_call / function_call_output parts (Responses)."""

OPENAI_SUMMARY = """[Summary of 6 earlier messages]

First request:
Why does the app crash on start? Only look at src/, do not run it.

Decisions:
- Going with a listing first.

Errors:
- `ls -la src/app`: Traceback (most recent call last): … FileNotFoundError: [Errno 2] No \
such file or directory: 'src/app' → unresolved: no later call of it succeeded
- shell: ERROR: permission denied → unresolved: no later call of it succeeded

Files touched or named:
- src/app
- src/main.py

Commands run:
- `ls -la src/app`"""


# ---- extractive -----------------------------------------------------------------------------


async def test_extractive_keeps_requests_rules_decisions_errors_files_commands() -> None:
    summarizer = make_summarizer(HygieneConfig())
    assert summarizer.name == "extractive"
    assert await summarizer.summarize(ANTHROPIC_SPAN, 2_000) == ANTHROPIC_SUMMARY


async def test_extractive_reads_openai_shapes() -> None:
    assert await ExtractiveSummarizer().summarize(OPENAI_SPAN, 2_000) == OPENAI_SUMMARY


def test_extractive_drops_the_least_important_first_to_fit_the_bound() -> None:
    # 80 tokens: 280 characters. The requests come first (each cut to a quarter of the
    # budget, at least 80 characters), then the newest rule that fits, the heading saying
    # how many older ones went; the rest is dropped.
    cut_first = ("First request:\nAdd a --json flag to `ctxctl status`. Tests must pass with "
                 "pyt … [45 more chars]")
    summary = extract_summary(ANTHROPIC_SPAN, 80)
    assert summary == (
        f"[Summary of 13 earlier messages]\n\n{cut_first}\n\n"
        f"Latest request:\n{LATEST}\n\n"
        "Rules the user stated (2 earlier dropped):\n- Don't add a dependency for this.")
    assert len(summary) <= 80 * 3.5
    # 100 tokens: both rules stated after the cut request (the one inside it dropped);
    # nothing else fits.
    summary = extract_summary(ANTHROPIC_SPAN, 100)
    assert summary == (
        "[Summary of 13 earlier messages]\n\nFirst request:\nAdd a --json flag to "
        "`ctxctl status`. Tests must pass with pytest -x, … [38 more chars]\n\n"
        f"Latest request:\n{LATEST}\n\n"
        "Rules the user stated (1 earlier dropped):\n- Keep the human output unchanged.\n"
        "- Don't add a dependency for this.")
    assert len(summary) <= 100 * 3.5
    # 64 tokens: the requests alone.
    assert extract_summary(ANTHROPIC_SPAN, 64) == (
        f"[Summary of 13 earlier messages]\n\n{cut_first}\n\nLatest request:\n{LATEST}")


def test_extractive_bound_holds_on_a_large_span_and_dedupes() -> None:
    span = [m for _ in range(200) for m in ANTHROPIC_SPAN]
    for max_tokens in (64, 100, 500, 2_000):
        assert len(extract_summary(span, max_tokens)) <= max_tokens * 3.5
    # 200 copies give the sections of one copy: each rule, error, file, command once (the
    # error of each copy is resolved by the next bash call).
    summary = extract_summary(span, 2_000)
    assert summary.count("→ resolved: a later bash call succeeded") == 1
    assert summary.count("\n- Keep the human output unchanged.\n") == 1
    assert summary.count("- clients/ctxctl/_main.py") == 1
    assert summary.count("- `pytest -x tests/unit/test_cli.py`\n") + summary.endswith(
        "- `pytest -x tests/unit/test_cli.py`") == 1
    assert summary.startswith("[Summary of 2600 earlier messages]\n\nFirst request:\n"
                              f"{FIRST}\n\nLatest request:\n{LATEST}\n\n")


def test_extractive_cuts_an_enormous_request_and_keeps_its_rules() -> None:
    huge = "Refactor the parser. " * 2_000 + "You must keep the public API stable."
    summary = extract_summary([M(role="user", content=huge)], 200)
    assert summary == (
        "[Summary of 1 earlier messages]\n\nFirst request:\n" + huge[:153]
        + " … [41,861 more chars]\n\nRules the user stated:\n"
        "- You must keep the public API stable.")


def test_extractive_carries_an_earlier_summary_over() -> None:
    # The span starts with the summary of an earlier compaction: its first request stays
    # the first, its requests, errors, commands and files come before the span's own, and
    # the drops it noted add up.
    earlier = ("[Summary of 40 earlier messages, written by the extractive summarizer when "
               "ctxd compacted the context; message.list keeps the originals.]\n\n"
               "[Summary of 40 earlier messages]\n\nFirst request:\nPort the CLI to click."
               "\n\nLatest request:\nAdd --verbose.\n\n"
               "Errors:\n- `make`: make: *** No rule to make target 'all'. → unresolved: no "
               "later call of it succeeded\n\nCommands run (3 earlier dropped):\n- `make`")
    span = [M(role="user", content=earlier),
            M(role="assistant", content=[
                {"type": "tool_use", "id": "t9", "name": "Bash",
                 "input": {"command": "git status\ngit diff --stat"}}]),
            M(role="user", content=[{"type": "tool_result", "tool_use_id": "t9",
                                     "content": "On branch main"}]),
            M(role="user", content="Now commit it.")]
    assert extract_summary(span, 2_000) == (
        "[Summary of 4 earlier messages]\n\nFirst request:\nPort the CLI to click.\n\n"
        "Latest request:\nNow commit it.\n\nOther requests:\n- Add --verbose.\n\n"
        "Errors:\n- `make`: make: *** No rule to make target 'all'. → unresolved: no later "
        "call of it succeeded\n\n"
        "Commands run (3 earlier dropped):\n- `make`\n- `git status … [1 more lines]`")


def test_extractive_requests_are_what_the_user_typed() -> None:
    """Claude Code writes a slash command, its output and a caveat into the user's turn
    (several records, one message once a provider's shape joins them): not a request."""
    noise = ("Caveat: The messages below were generated by the user while running local "
             "commands. DO NOT respond to these messages.\n"
             "<command-name>/context</command-name>\n<command-message>context"
             "</command-message>\n<command-args></command-args>\n"
             "<local-command-stdout>\x1b[1mContext Usage\x1b[22m\n" + "⛁ " * 900
             + "</local-command-stdout>\n[Request interrupted by user for tool use]\n")
    summary = extract_summary([
        M(role="user", content=noise + "Commit the pending changes."),
        M(role="assistant", content="Committed."),
        M(role="user", content=noise),
        M(role="user", content="Now the tests.")], 300)
    assert summary == ("[Summary of 4 earlier messages]\n\nFirst request:\nCommit the pending "
                       "changes.\n\nLatest request:\nNow the tests.")


def test_extractive_of_a_span_without_requests() -> None:
    assert extract_summary([M(role="assistant", content="Hello.")], 100) == (
        "[Summary of 1 earlier messages]")


# ---- command --------------------------------------------------------------------------------


def script(tmp_path: Path, name: str, body: str) -> str:
    """A command line that runs ``body`` with this interpreter (its path holds a space)."""
    folder = tmp_path / "summarizer scripts"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(body, encoding="utf-8")
    return f"{sys.executable} '{path}'"


def command(line: str, timeout_s: float = 30.0) -> CommandSummarizer:
    summarizer = make_summarizer(HygieneConfig(summarizer="command", summarizer_command=line,
                                               summarizer_timeout_s=timeout_s))
    assert isinstance(summarizer, CommandSummarizer)
    assert summarizer.name == "command"
    return summarizer


ECHO = """import json, sys
raw = sys.stdin.buffer.read()
open(sys.argv[1], "wb").write(raw)
got = json.loads(raw)
print(f"  {len(got['messages'])} messages, at most {got['max_tokens']} tokens  ")
"""


async def test_command_gets_the_span_as_json_and_its_stdout_is_the_summary(
        tmp_path: Path) -> None:
    seen = tmp_path / "stdin.json"
    summarizer = command(script(tmp_path, "echo", ECHO) + f" '{seen}'")
    span = ANTHROPIC_SPAN[:4]
    assert await summarizer.summarize(span, 300) == "4 messages, at most 300 tokens"
    assert json.loads(seen.read_bytes()) == {"messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": FIRST},
        {"role": "assistant", "content": [
            {"type": "text", "text": "I'll read the CLI first."},
            {"type": "tool_use", "id": "toolu_1", "name": "read_file",
             "input": {"path": "clients/ctxctl/_main.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "def status(args):\n    print(render(args))\n"}]},
    ], "max_tokens": 300}


async def test_command_gets_name_and_tool_call_id(tmp_path: Path) -> None:
    seen = tmp_path / "stdin.json"
    summarizer = command(script(tmp_path, "echo", ECHO) + f" '{seen}'")
    assert await summarizer.summarize(OPENAI_SPAN[-1:], 64) == "1 messages, at most 64 tokens"
    assert json.loads(seen.read_bytes())["messages"] == [
        {"role": "tool", "content": "ERROR: permission denied", "name": "shell",
         "tool_call_id": "call_2"}]


async def test_command_failing_is_an_error_with_its_stderr(tmp_path: Path) -> None:
    line = script(tmp_path, "fail", "import sys\nsys.stderr.write('model not loaded\\n"
                                    "see /var/log/summarizer.log\\n')\nsys.exit(3)\n")
    with pytest.raises(SummarizerError) as caught:
        await command(line).summarize(ANTHROPIC_SPAN, 100)
    assert str(caught.value) == (f"summarizer command {sys.executable!r} exited with status "
                                 "3: model not loaded see /var/log/summarizer.log")


async def test_command_timeout_kills_it(tmp_path: Path) -> None:
    line = script(tmp_path, "sleep", "import time\ntime.sleep(60)\nprint('too late')\n")
    with pytest.raises(SummarizerError) as caught:
        await command(line, timeout_s=0.5).summarize(ANTHROPIC_SPAN, 100)
    assert str(caught.value) == (f"summarizer command {sys.executable!r} did not finish "
                                 "within 0.5 s; it was killed")


SPAWNS = """import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(sys.argv[1], "w") as fifo:
    fifo.write(str(child.pid))
child.wait()
"""
"""A summarizer command that starts a program of its own and waits for it."""


async def test_a_cancelled_command_is_killed_with_what_it_started(tmp_path: Path) -> None:
    # Regression: only the command was killed; a program it had started ran on.
    fifo = tmp_path / "grandchild"
    os.mkfifo(fifo)
    summarizer = command(script(tmp_path, "spawns", SPAWNS) + f" '{fifo}'")
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(summarizer.summarize, ANTHROPIC_SPAN, 100)
            # Until the command has started its program and said which.
            grandchild = os.pidfd_open(int(await trio.to_thread.run_sync(fifo.read_text)))
            scope.cancel()
    try:
        with trio.fail_after(10):  # a guard: it is gone at once
            await trio.lowlevel.wait_readable(grandchild)
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone, and reaped already
            signal.pidfd_send_signal(grandchild, signal.SIGKILL)
        os.close(grandchild)


async def test_command_missing_program(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-summarizer")
    with pytest.raises(SummarizerError) as caught:
        await command(f"{missing} --fast").summarize(ANTHROPIC_SPAN, 100)
    assert str(caught.value) == (f"summarizer command {missing!r} cannot be run: "
                                 "No such file or directory")


@pytest.mark.parametrize(("line", "reason"), [
    ("", "summarizer_command is empty; set it in [hygiene]"),
    ("summarize 'unclosed", "summarizer_command cannot be split: No closing quotation"),
])
async def test_command_misconfigured(line: str, reason: str) -> None:
    with pytest.raises(SummarizerError) as caught:
        await command(line).summarize(ANTHROPIC_SPAN, 100)
    assert str(caught.value) == reason


async def test_command_empty_and_oversized_output(tmp_path: Path) -> None:
    # It does not read its stdin: the unread span is no error, the empty summary is.
    empty = script(tmp_path, "empty", "print('   ')\n")
    with pytest.raises(SummarizerError) as caught:
        await command(empty).summarize(ANTHROPIC_SPAN * 50, 100)
    assert str(caught.value) == f"summarizer command {sys.executable!r} wrote no summary"
    endless = script(tmp_path, "endless", "import sys\nwhile True:\n"
                                          "    sys.stdout.write('x' * 65536)\n")
    with pytest.raises(SummarizerError) as caught:
        await command(endless).summarize(ANTHROPIC_SPAN, 100)
    assert str(caught.value) == (f"summarizer command {sys.executable!r} wrote more than "
                                 f"{MAX_OUTPUT_BYTES:,} bytes")


# ---- http -----------------------------------------------------------------------------------


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    with ChatServer() as running:
        yield running


def http(url: str, key_env: str = "SUMMARIZER_KEY", timeout_s: float = 30.0,
         environ: dict[str, str] | None = None) -> HttpSummarizer:
    summarizer = make_summarizer(
        HygieneConfig(summarizer="http", summarizer_url=url, summarizer_model="small-model",
                      summarizer_api_key_env=key_env, summarizer_timeout_s=timeout_s),
        {"SUMMARIZER_KEY": "sk-test"} if environ is None else environ)
    assert isinstance(summarizer, HttpSummarizer)
    assert summarizer.name == "http"
    return summarizer


SMALL_SPAN = ANTHROPIC_SPAN[1:6]
SMALL_TRANSCRIPT = (
    f"user: {FIRST}\n\n"
    "assistant: I'll read the CLI first.\n"
    '[tool call read_file: {"path": "clients/ctxctl/_main.py"}]\n\n'
    "user: [tool result: def status(args):\n    print(render(args))\n]\n\n"
    "assistant: I'll use msgspec to encode the status instead of json.dumps. Running the "
    "tests now.\n"
    '[tool call bash: {"command": "pytest -x tests/unit/test_cli.py"}]\n\n'
    "user: [tool result (error): collected 5 items\nFAILED tests/unit/test_cli.py::"
    "test_status_json - assert 'text' == 'json'\n1 failed]")


def test_transcript() -> None:
    assert transcript(SMALL_SPAN) == SMALL_TRANSCRIPT
    assert transcript(OPENAI_SPAN[2:]) == (
        "tool: Traceback (most recent call last):\n  File \"run.py\", line 3\n"
        "FileNotFoundError: [Errno 2] No such file or directory: 'src/app'\n\n"
        'assistant: [tool call grep: {"pattern": "main", "path": "src/main.py"}]\n\n'
        "user: [tool result: src/main.py:4: def main():]\n\n"
        "tool (shell): ERROR: permission denied")


async def test_http_posts_the_transcript_and_returns_the_answer(chat: ChatServer) -> None:
    assert await http(chat.url + "/").summarize(SMALL_SPAN, 500) == (
        "The user wants a --json flag.")
    assert chat.requests == [SeenRequest(
        "/v1/chat/completions", "Bearer sk-test", "application/json",
        {"model": "small-model",
         "messages": [{"role": "system", "content": INSTRUCTIONS.format(max_tokens=500)},
                      {"role": "user", "content": SMALL_TRANSCRIPT}],
         "max_tokens": 500})]
    assert "in at most about 500 tokens." in chat.requests[0].body["messages"][0]["content"]


async def test_http_sends_no_key_without_one(chat: ChatServer) -> None:
    await http(chat.url, key_env="").summarize(SMALL_SPAN, 100)
    await http(chat.url, environ={}).summarize(SMALL_SPAN, 100)
    assert [r.authorization for r in chat.requests] == [None, None]


@pytest.mark.parametrize(("failure", "reason"), [
    ("status", ': HTTP Error 500: Internal Server Error ({"error": "model crashed"})'),
    ("bad-json", ": Expecting value: line 1 column 1 (char 0)"),
    ("no-choices", " answered without choices[0].message.content"),
])
async def test_http_bad_answers_are_errors(chat: ChatServer, failure: str, reason: str) -> None:
    chat.failure = failure
    with pytest.raises(SummarizerError) as caught:
        await http(chat.url).summarize(SMALL_SPAN, 100)
    assert str(caught.value) == f"summarizer endpoint {chat.url}/chat/completions{reason}"


async def test_http_empty_summary_is_an_error(chat: ChatServer) -> None:
    chat.summary = " \n"
    with pytest.raises(SummarizerError) as caught:
        await http(chat.url).summarize(SMALL_SPAN, 100)
    assert str(caught.value) == (f"summarizer endpoint {chat.url}/chat/completions answered "
                                 "an empty summary")


async def test_http_timeout(chat: ChatServer) -> None:
    chat.delay_s = 2.0
    with pytest.raises(SummarizerError) as caught:
        await http(chat.url, timeout_s=0.5).summarize(SMALL_SPAN, 100)
    assert str(caught.value) == (f"summarizer endpoint {chat.url}/chat/completions did not "
                                 "answer within 0.5 s")


async def test_http_without_a_url() -> None:
    with pytest.raises(SummarizerError) as caught:
        await http("").summarize(SMALL_SPAN, 100)
    assert str(caught.value) == "summarizer_url '' is not an http(s) URL; set it in [hygiene]"
