"""Summarizers: what the compaction chain's second strategy turns the oldest span of a
thread into (docs/protocol.md, "Summarizers"). Chosen by ``[hygiene] summarizer``:

- `ExtractiveSummarizer`: no model; keeps, in labelled sections, what compaction must not
  drop (the first and the latest user request, the user's rules, decisions, errors and how
  they ended, files, commands).
- `CommandSummarizer`: an external program, the span as JSON on its stdin, the summary on
  its stdout.
- `HttpSummarizer`: an OpenAI-compatible ``/chat/completions`` endpoint.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import trio

from ctxd.config import HygieneConfig
from ctxd.hygiene._child import open_child
from ctxd.remote import RemoteError, post_json
from ctxd.wire.types import RenderedMessage


class SummarizerError(Exception):
    """A summarizer failed; the message says why, in one line (compaction then goes on to
    truncation and reports it)."""


class Summarizer(Protocol):
    @property
    def name(self) -> str:
        """``extractive``, ``command`` or ``http``."""

    async def summarize(self, span: Sequence[RenderedMessage], max_tokens: int) -> str:
        """A summary of ``span`` (oldest first) meant to take at most about ``max_tokens``
        tokens (the caller cuts a longer one exactly).

        Raises:
            SummarizerError: it could not summarise the span.
        """


# ---- extractive ----------------------------------------------------------------------------

CHARS_PER_TOKEN = 3.5
"""The extractive summary's budget: ``max_tokens`` times this many characters. Paths,
commands and log lines take more tokens per character than prose (a 300 KB session's
summary measured 3.6 characters a token; docs/performance.md, "Summarizers"), and a summary
over the bound loses its end to the caller's cut."""
ITEM_CHARS = 300
"""A rule, a decision or an error line is cut to this many characters."""
COMMAND_CHARS = 200
"""A command is cut to this many characters."""
CALL_TYPES = frozenset({"tool_use", "tool_call", "function_call"})
"""Content parts that call a tool (as hygiene's `called_tools` reads them)."""
RESULT_TYPES = frozenset({"tool_result", "function_call_output"})
"""Content parts that carry a tool's result (Anthropic; OpenAI Responses)."""
PATH_KEYS = frozenset({"path", "file_path", "filepath", "filename", "file", "paths",
                       "files", "notebook_path", "target_file", "source", "destination"})
"""Arguments of a tool call whose values are files."""
COMMAND_KEYS = ("command", "cmd", "script")
"""Arguments of a tool call whose value is a command line."""

_SENTENCE = re.compile(r"(?:[^\n.!?]|[.!?](?=\S))+[.!?]*")
"""A sentence: up to a run of ``.!?`` followed by a space or the end, or up to a line's
end (``a.py`` does not end one). Linear: no match is retried from a later start."""
_RULE = re.compile(
    r"\b(?:must|mustn't|never|always|don't|do not|doesn't|should|shouldn't|make sure|"
    r"avoid|only|prefer|please|need to|needs to|required?|without|keep)\b", re.IGNORECASE)
_DECISION = re.compile(
    r"\b(?:decided|decide to|I'll use|I will use|we'll|we will|going with|go with|"
    r"instead of|chose|choose|switch(?:ed)? to|let's use|settled on|opted)\b", re.IGNORECASE)
_ERROR = re.compile(
    r"Traceback \(most recent call last\)|(?:Error|Exception)\b|"
    r"\b(?:error|ERROR|FAILED|Failed|fatal:|panic:)|(?<!\b0 )\bfailed\b|command not found|"
    r"No such file or directory")
"""What shows that a tool result is an error (one that is not flagged ``is_error``)."""
ERROR_WORDS = ("Traceback", "Error", "Exception", "error", "ERROR", "FAILED", "Failed",
               "fatal:", "panic:", "failed", "command not found", "No such file or directory")
"""The literal start of each of `_ERROR`'s alternatives: found with ``str.find``, which
scans a log at memory speed, where the regular expression alone ran at 16 MB/s (most
results have none; docs/performance.md, "Summarizers")."""
_PATH = re.compile(
    r"(?<![\w/.:~-])(?:~|\.{1,2})?/?(?:[\w@+-][\w.@+-]*/)+[\w@+-][\w.@+-]*"
    r"|(?<![\w/.-])[\w-]+\.(?:py|pyi|js|mjs|ts|tsx|jsx|rs|go|c|h|cc|cpp|hpp|java|kt|rb|php|"
    r"cs|swift|md|rst|txt|toml|ya?ml|json|cfg|ini|sh|sql|html|css|lock|xml|csv)\b")


def _error(text: str) -> re.Match[str] | None:
    """The first match of `_ERROR` in ``text``, searched from the first of `ERROR_WORDS`."""
    starts = [at for word in ERROR_WORDS if (at := text.find(word)) >= 0]
    return _ERROR.search(text, min(starts)) if starts else None


def _cut(text: str, limit: int) -> str:
    """``text`` whole, or its first characters and how many were left out."""
    if len(text) <= limit:
        return text
    note = f" … [{len(text) - limit:,} more chars]"
    return text[:max(0, limit - len(note))] + note


def _one_line(text: str, limit: int) -> str:
    return _cut(" ".join(text.split()), limit)


def _first_line(text: str, limit: int) -> str:
    """``text`` as it is when it is one line of at most ``limit`` characters; else its first
    line, cut, and how many more lines it had."""
    lines = text.strip().splitlines() or [""]
    more = len(lines) - 1
    head = _cut(lines[0].strip(), limit)
    return head + (f" … [{more:,} more lines]" if more else "")


def _text(content: Any) -> str:
    """The text of a content: a string, or its text parts (and a tool result's nested
    content) joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif part.get("type") in RESULT_TYPES:
            texts.append(_text(part.get("content", part.get("output"))))
    return "\n".join(texts)


def _arguments(part: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """A call part's tool name and arguments: Anthropic ``{name, input}``, OpenAI
    ``{function: {name, arguments}}`` or ``{name, arguments}`` (arguments a JSON string or
    an object)."""
    function = part.get("function")
    source = function if isinstance(function, dict) else part
    name = source.get("name")
    arguments = source.get("input", source.get("arguments"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = {"arguments": arguments}
    return (name if isinstance(name, str) else None,
            arguments if isinstance(arguments, dict) else {})


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _command(arguments: Mapping[str, Any]) -> str | None:
    for key in COMMAND_KEYS:
        value = arguments.get(key)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = shlex.join(value)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


@dataclass
class _Call:
    tool: str | None
    command: str | None


@dataclass
class _Extract:
    """What the extractive summarizer found in a span, in order of appearance."""

    requests: list[str] = field(default_factory=list)
    carried_first: str | None = None
    """The first request an earlier summary in the span kept (perhaps already cut)."""
    carried_errors: dict[str, None] = field(default_factory=dict)
    """Error lines an earlier summary in the span kept, with how they ended."""
    dropped: dict[str, int] = field(default_factory=dict)
    """Entries an earlier summary in the span had already dropped, by section."""
    rules: dict[str, None] = field(default_factory=dict)
    decisions: dict[str, None] = field(default_factory=dict)
    files: dict[str, None] = field(default_factory=dict)
    commands: dict[str, None] = field(default_factory=dict)
    errors: list[tuple[int, str | None, str]] = field(default_factory=list)
    """(result index, tool, line) of each error result."""
    last_success: dict[str | None, int] = field(default_factory=dict)
    """The index of each tool's last result that was not an error."""
    calls: dict[str, _Call] = field(default_factory=dict)
    results: int = 0

    def sentences(self, text: str, pattern: re.Pattern[str], into: dict[str, None]) -> None:
        for match in _SENTENCE.finditer(text):
            sentence = match.group().strip()
            if sentence and pattern.search(sentence):
                into.setdefault(_one_line(sentence, ITEM_CHARS))

    def paths(self, text: str) -> None:
        for path in _PATH.findall(text):
            if "://" not in path:
                self.files.setdefault(path.rstrip("."))

    def call(self, part: Mapping[str, Any]) -> None:
        tool, arguments = _arguments(part)
        command = _command(arguments)
        if command is not None:
            self.commands.setdefault(_first_line(command, COMMAND_CHARS))
            self.paths(command)
        for key, value in arguments.items():
            if key in PATH_KEYS:
                for path in _strings(value):
                    self.files.setdefault(path.strip())
        call_id = part.get("id", part.get("call_id"))
        if isinstance(call_id, str):
            self.calls[call_id] = _Call(tool, command)

    def result(self, call_id: Any, tool: str | None, text: str, flagged: bool) -> None:
        call = self.calls.get(call_id) if isinstance(call_id, str) else None
        tool = tool or (call.tool if call else None)
        index = self.results
        self.results += 1
        match = _error(text)
        if not flagged and match is None:
            self.last_success[tool] = index
            return
        lines = [line for line in text.splitlines() if line.strip()] or ["(no output)"]
        first = _one_line(lines[0], ITEM_CHARS)
        if match is None:
            line = lines[0]
        elif match.group().startswith("Traceback"):
            line = lines[-1]  # a Python traceback ends with the exception
        else:
            start = text.rfind("\n", 0, match.start()) + 1
            end = text.find("\n", match.end())
            line = text[start:end if end >= 0 else len(text)]
        shown = _one_line(line, ITEM_CHARS)
        source = f"`{call.command}`" if call and call.command else (tool or "a tool")
        # The result's first line, always; the line that shows the error when it is another.
        self.errors.append((index, tool, f"{_first_line(source, COMMAND_CHARS)}: {first}"
                                         + ("" if shown == first else f" … {shown}")))

    def ended(self, index: int, tool: str | None) -> str:
        if self.last_success.get(tool, -1) > index:
            return f"resolved: a later {tool or 'tool'} call succeeded"
        return "unresolved: no later call of it succeeded"


NOT_TYPED = re.compile(
    r"<(local-command-stdout|local-command-stderr|command-name|command-message|command-args)>"
    r".*?</\1>|Caveat: The messages below were generated by the user while running local "
    r"commands\.[^\n]*|\[Request interrupted by user[^\]]*\]", re.S)
"""What Claude Code writes in a user's turn that the user did not type: a slash command
it ran and that command's output, the caveat before them, an interruption note."""


def _own_text(text: str) -> str:
    """A user message's text without what Claude Code wrote into it (`NOT_TYPED`)."""
    return NOT_TYPED.sub("", text).strip()


def _extract(span: Sequence[RenderedMessage]) -> _Extract:
    found = _Extract()
    for message in span:
        content = message.content
        parts = [] if isinstance(content, str) else [p for p in content if isinstance(p, dict)]
        if message.role == "tool":
            found.result(message.tool_call_id, message.name, _text(content),
                         any(p.get("is_error") is True for p in parts))
            continue
        for part in parts:
            kind = part.get("type")
            if kind in CALL_TYPES:
                found.call(part)
            elif kind in RESULT_TYPES:
                found.result(part.get("tool_use_id", part.get("call_id")), None,
                             _text(part.get("content", part.get("output"))),
                             part.get("is_error") is True)
        text = content if isinstance(content, str) else "\n".join(
            p["text"] for p in parts if p.get("type", "text") == "text"
            and isinstance(p.get("text"), str))
        if message.role == "user" and text.startswith(SUMMARY_HEAD):
            _carry(found, text)
        elif message.role == "user" and (text := _own_text(text)):
            found.requests.append(text)
            found.sentences(text, _RULE, found.rules)
            found.paths(text)
        elif message.role == "assistant":
            found.sentences(text, _DECISION, found.decisions)
            found.paths(text)
    return found


SUMMARY_HEAD = "[Summary of "
"""How a summary compaction wrote starts (``summary_text``): a span that holds one carries
its sections over into the new summary instead of taking it for a request."""
SECTIONS = {"First request": "first", "Latest request": "latest", "Other requests": "requests",
            "Rules the user stated": "rules", "Decisions": "decisions", "Errors": "errors",
            "Files touched or named": "files", "Commands run": "commands"}
_HEADING = re.compile(r"\n\n(" + "|".join(map(re.escape, SECTIONS))
                      + r")(?: \(([\d,]+) earlier dropped\))?:\n")


def _carry(found: _Extract, text: str) -> None:
    """Take an earlier summary's sections into ``found``, in their place in the span."""
    parts = _HEADING.split(text)
    # parts: [header, title, dropped, body, title, dropped, body, ...]
    for at in range(1, len(parts) - 2, 3):
        key, dropped, body = SECTIONS[parts[at]], parts[at + 1], parts[at + 2]
        if dropped:
            found.dropped[key] = found.dropped.get(key, 0) + int(dropped.replace(",", ""))
        if key in ("first", "latest"):
            if key == "first" and found.carried_first is None and not found.requests:
                found.carried_first = body
            else:
                found.requests.append(body)
            continue
        items = [line[2:] for line in body.split("\n") if line.startswith("- ")]
        if key == "requests":
            found.requests.extend(items)
        elif key == "errors":
            found.carried_errors.update(dict.fromkeys(items))
        elif key == "commands":
            found.commands.update(dict.fromkeys(
                item[1:-1] if item.startswith("`") and item.endswith("`") else item
                for item in items))
        else:
            into: dict[str, None] = getattr(found, key)
            into.update(dict.fromkeys(items))


def _fill(items: Sequence[str], room: int, separator: int) -> tuple[list[str], int]:
    """The newest ``items`` that fit in ``room`` characters (each costs its length and
    ``separator``), in their order; and the room left."""
    kept: list[str] = []
    for item in reversed(items):
        cost = len(item) + separator
        if cost > room:
            break
        kept.append(item)
        room -= cost
    return kept[::-1], room


DROPPED_NOTE = len(" (9,999 earlier dropped)")
"""Room kept for a section's note of how many entries it dropped."""


def extract_summary(span: Sequence[RenderedMessage], max_tokens: int) -> str:
    """The extractive summary of ``span`` in at most ``max_tokens * CHARS_PER_TOKEN``
    characters: the first and latest user requests verbatim (each cut to a quarter of the
    budget), then, while room is left and in this order of importance, the user's rules,
    the other requests (each its first line), errors (each result's first line, and the
    line that shows the error when it is another) and how they ended, commands run (each
    its first line), files touched or named, and decisions. Each section is deduplicated
    and in order; when a section does not all fit its oldest entries go first, and its
    heading says how many went. An earlier summary in the span is carried over, section by
    section. Deterministic, linear in the span."""
    found = _extract(span)
    budget = int(max_tokens * CHARS_PER_TOKEN)
    header = f"[Summary of {len(span)} earlier messages]"
    room = budget - len(header)
    sections: dict[str, str] = {}
    verbatim: set[str] = set()
    requests = list(found.requests)
    first = found.carried_first
    if first is None and requests:
        first = requests.pop(0)
    latest = requests.pop() if requests else None
    quarter = max(80, budget // 4)
    for key, title, text in (("first", "First request", first),
                             ("latest", "Latest request", latest)):
        if text is None or (key == "latest" and text == first):
            continue
        section = f"\n\n{title}:\n" + _cut(text, quarter)
        if len(section) > room:
            continue
        sections[key] = section
        room -= len(section)
        if len(text) <= quarter:
            verbatim.add(text)
    others = list(dict.fromkeys(_first_line(text, ITEM_CHARS) for text in requests
                                if text not in (first, latest)))
    # A rule inside the first or latest request shown whole is already in the summary.
    shown = "\n".join(verbatim)
    rules = [rule for rule in found.rules if rule not in shown]
    errors = list(dict.fromkeys([*found.carried_errors, *(
        f"{line} → {found.ended(index, tool)}" for index, tool, line in found.errors)]))
    lists = (("rules", "Rules the user stated", rules),
             ("requests", "Other requests", others),
             ("errors", "Errors", errors),
             ("commands", "Commands run", [f"`{c}`" for c in found.commands]),
             ("files", "Files touched or named", list(found.files)),
             ("decisions", "Decisions", list(found.decisions)))
    for key, title, items in lists:
        already = found.dropped.get(key, 0)
        heading = f"\n\n{title}:"
        if not items or len(heading) + DROPPED_NOTE + len(items[-1]) + 3 > room:
            continue
        kept, room = _fill(items, room - len(heading) - DROPPED_NOTE, 3)
        room += DROPPED_NOTE
        dropped = already + len(items) - len(kept)
        if dropped:
            heading = f"\n\n{title} ({dropped:,} earlier dropped):"
            room -= len(heading) - len(f"\n\n{title}:")
        sections[key] = heading + "".join(f"\n- {item}" for item in kept)
    order = ("first", "latest", "requests", "rules", "decisions", "errors", "files",
             "commands")
    return header + "".join(sections[key] for key in order if key in sections)


BACKGROUND_CHARS = 64 * 1024
"""A span with more text than this is summarised in a worker thread, off the event loop."""


class ExtractiveSummarizer:
    """Keeps what compaction must not drop, without a model (`extract_summary`)."""

    name = "extractive"

    async def summarize(self, span: Sequence[RenderedMessage], max_tokens: int) -> str:
        size = 0
        for message in span:
            size += len(message.content) if isinstance(message.content, str) else 1024
            if size > BACKGROUND_CHARS:
                return await trio.to_thread.run_sync(extract_summary, span, max_tokens)
        return extract_summary(span, max_tokens)


# ---- command -------------------------------------------------------------------------------

MAX_OUTPUT_BYTES = 1 << 20
"""A command's summary may take this many bytes of stdout; more is an error."""
STDERR_TAIL_BYTES = 4096
"""The end of a failed command's stderr kept for its error."""
STDERR_REASON_CHARS = 300
"""The end of a failed command's stderr its error quotes."""

_encode_span = msgspec.json.Encoder().encode


def span_json(span: Sequence[RenderedMessage], max_tokens: int) -> bytes:
    """What a summarizer command reads on stdin: ``{"messages": [...], "max_tokens": N}``,
    each message as ``ctxd.render`` returns it."""
    return _encode_span({"messages": list(span), "max_tokens": max_tokens})


class CommandSummarizer:
    """Runs ``argv`` with the span as JSON on stdin; its stdout is the summary. The program
    leads a process group of its own, killed whole when it times out or is cancelled, and
    dies with the daemon (`open_child`).

    Args:
        command: the command line, split like a shell's (``shlex``).
        timeout_s: the program is killed after this long.
    """

    name = "command"

    def __init__(self, command: str, timeout_s: float):
        self._command = command
        self._timeout_s = timeout_s

    def _argv(self) -> list[str]:
        try:
            argv = shlex.split(self._command)
        except ValueError as exc:
            raise SummarizerError(f"summarizer_command cannot be split: {exc}") from exc
        if not argv:
            raise SummarizerError("summarizer_command is empty; set it in [hygiene]")
        return argv

    async def summarize(self, span: Sequence[RenderedMessage], max_tokens: int) -> str:
        argv = self._argv()
        try:
            process = await open_child(argv)
        except OSError as exc:
            raise SummarizerError(f"summarizer command {argv[0]!r} cannot be run: "
                                  f"{exc.strerror or exc}") from exc
        stdin = process.stdin
        stdout = process.stdout
        stderr = process.stderr
        output = bytearray()
        errors = bytearray()
        overflow = False

        async def feed() -> None:
            try:
                async with stdin:
                    await stdin.send_all(span_json(span, max_tokens))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # it exited without reading all of it; its status tells

        async def read_output(cancel: trio.CancelScope) -> None:
            nonlocal overflow
            async for chunk in stdout:
                output.extend(chunk)
                if len(output) > MAX_OUTPUT_BYTES:
                    overflow = True
                    cancel.cancel()
                    return

        async def read_errors() -> None:
            async for chunk in stderr:
                errors.extend(chunk)
                del errors[:-STDERR_TAIL_BYTES]

        try:
            with trio.move_on_after(self._timeout_s) as deadline:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(feed)
                    nursery.start_soon(read_output, nursery.cancel_scope)
                    nursery.start_soon(read_errors)
                if not overflow:
                    await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                with trio.move_on_after(5, shield=True):
                    await process.wait()
            for stream in (stdout, stderr):
                with trio.move_on_after(1, shield=True):
                    await stream.aclose()
        if deadline.cancelled_caught:
            raise SummarizerError(f"summarizer command {argv[0]!r} did not finish within "
                                  f"{self._timeout_s:g} s; it was killed")
        if overflow:
            raise SummarizerError(f"summarizer command {argv[0]!r} wrote more than "
                                  f"{MAX_OUTPUT_BYTES:,} bytes")
        code = process.returncode
        if code != 0:
            tail = " ".join(errors.decode(errors="replace").split())
            status = (f"was killed by signal {-code}" if code is not None and code < 0
                      else f"exited with status {code}")
            raise SummarizerError(f"summarizer command {argv[0]!r} {status}"
                                  + (f": {tail[-STDERR_REASON_CHARS:]}" if tail else ""))
        try:
            summary = output.decode().strip()
        except UnicodeDecodeError as exc:
            raise SummarizerError(f"summarizer command {argv[0]!r} wrote bytes that are not "
                                  f"UTF-8 ({exc.reason} at byte {exc.start})") from exc
        if not summary:
            raise SummarizerError(f"summarizer command {argv[0]!r} wrote no summary")
        return summary


# ---- http ----------------------------------------------------------------------------------

INSTRUCTIONS = (
    "You summarise the oldest part of a conversation between a user and an AI coding "
    "agent, so that the agent can continue without it. Keep, in labelled sections: the "
    "user's first and latest requests verbatim; every rule, constraint and preference the "
    "user stated; decisions made and why; files read or changed; commands run; errors seen "
    "and how each ended. Drop pleasantries and output that no longer matters. Answer with "
    "the summary only, in at most about {max_tokens} tokens.")
"""The system message of the ``http`` summarizer's request."""


def transcript(span: Sequence[RenderedMessage]) -> str:
    """The span as plain text for a model: one block per message, headed by its role (and
    the tool's name), tool calls and results as ``[tool call name: {arguments}]`` and
    ``[tool result (error): text]``."""
    blocks: list[str] = []
    for message in span:
        head = message.role + (f" ({message.name})" if message.name else "")
        content = message.content
        if isinstance(content, str):
            blocks.append(f"{head}: {content}")
            continue
        lines: list[str] = []
        for part in content:
            kind = part.get("type")
            if kind in CALL_TYPES:
                tool, arguments = _arguments(part)
                lines.append(f"[tool call {tool}: {json.dumps(arguments, ensure_ascii=False)}]")
            elif kind in RESULT_TYPES:
                flag = " (error)" if part.get("is_error") is True else ""
                lines.append(f"[tool result{flag}: "
                             f"{_text(part.get('content', part.get('output')))}]")
            elif isinstance(part.get("text"), str):
                lines.append(part["text"])
            else:
                lines.append(f"[{kind or 'part'}]")
        blocks.append(f"{head}: " + "\n".join(lines))
    return "\n\n".join(blocks)


class HttpSummarizer:
    """An OpenAI-compatible ``POST {base_url}/chat/completions`` endpoint.

    Args:
        base_url: e.g. ``http://127.0.0.1:11434/v1``.
        model: the model name to send.
        api_key: sent as a bearer token when given.
        timeout_s: the deadline of the whole request.
    """

    name = "http"

    def __init__(self, base_url: str, model: str, api_key: str | None, timeout_s: float):
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model = model
        self._api_key = api_key
        self._timeout_s = timeout_s

    def request(self, span: Sequence[RenderedMessage], max_tokens: int) -> dict[str, Any]:
        """The request's JSON body."""
        return {"model": self._model,
                "messages": [{"role": "system",
                              "content": INSTRUCTIONS.format(max_tokens=max_tokens)},
                             {"role": "user", "content": transcript(span)}],
                "max_tokens": max_tokens}

    async def summarize(self, span: Sequence[RenderedMessage], max_tokens: int) -> str:
        if not self._url.startswith(("http://", "https://")):
            raise SummarizerError(f"summarizer_url {self._url.removesuffix('/chat/completions')!r}"
                                  " is not an http(s) URL; set it in [hygiene]")
        body = self.request(span, max_tokens)
        answer: Any = None
        with trio.move_on_after(self._timeout_s) as deadline:
            try:
                # Abandoned at the deadline: the socket timeout ends the thread soon after.
                answer = await trio.to_thread.run_sync(
                    post_json, self._url, body, self._api_key, self._timeout_s,
                    abandon_on_cancel=True)
            except RemoteError as exc:
                raise SummarizerError(f"summarizer endpoint {self._url}: {exc}") from exc
        if deadline.cancelled_caught:
            raise SummarizerError(f"summarizer endpoint {self._url} did not answer within "
                                  f"{self._timeout_s:g} s")
        try:
            summary = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise SummarizerError(f"summarizer endpoint {self._url} answered without "
                                  "choices[0].message.content") from exc
        if not isinstance(summary, str) or not summary.strip():
            raise SummarizerError(f"summarizer endpoint {self._url} answered an empty summary")
        return summary.strip()


def make_summarizer(config: HygieneConfig,
                    environ: Mapping[str, str] | None = None) -> Summarizer:
    """The summarizer ``config`` names. It never fails here: a misconfigured ``command``
    or ``http`` summarizer raises `SummarizerError` when it is used, so compaction goes on
    to truncation and says why (docs/decisions.md, Hygiene).

    Args:
        config: the ``[hygiene]`` table.
        environ: where ``summarizer_api_key_env`` is looked up (default ``os.environ``).
    """
    if config.summarizer == "command":
        return CommandSummarizer(config.summarizer_command, config.summarizer_timeout_s)
    if config.summarizer == "http":
        environ = os.environ if environ is None else environ
        key = environ.get(config.summarizer_api_key_env) if config.summarizer_api_key_env \
            else None
        return HttpSummarizer(config.summarizer_url, config.summarizer_model, key or None,
                              config.summarizer_timeout_s)
    return ExtractiveSummarizer()
