"""`ctxctl hook` against a real daemon: each Claude Code event as Claude Code sends it
(the shapes of claude_agent_sdk/types.py), through the installed console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess

import ctxclient
from ctxclient import Client

CTXCTL = Path(sys.executable).with_name("ctxctl")


def hook(socket: Path | str, event: dict[str, Any]) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXD_")}
    done = subprocess.run([str(CTXCTL), "hook", "--socket", str(socket)],
                          input=json.dumps(event), capture_output=True, text=True,
                          env=env, timeout=30, check=False)
    return done.returncode, done.stdout, done.stderr


def event(name: str, session_id: str, cwd: str, **fields: Any) -> dict[str, Any]:
    return {"session_id": session_id, "transcript_path": f"{cwd}/t.jsonl", "cwd": cwd,
            "hook_event_name": name, **fields}


def test_hook_help_says_what_it_does_and_reads_no_event() -> None:
    """``ctxctl hook --help`` printed nothing: the console script's fast path took it for
    an event (an empty one, standard input being closed)."""
    helped = subprocess.run([str(CTXCTL), "hook", "--help"], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=30, check=False)
    assert (helped.returncode, helped.stderr) == (0, "")
    assert helped.stdout.startswith("usage: ctxctl hook [-h] [--socket PATH]")
    assert "Answer one Claude Code hook event: read its JSON on standard input" in (
        " ".join(helped.stdout.split()))
    assert "  echo '{\"hook_event_name\":\"SessionStart\",\"session_id\":\"s1\"}' | ctxctl hook" \
        in helped.stdout.splitlines()


def test_hook_ignores_arguments_it_does_not_know(tmp_path: Path) -> None:
    """A hook fails open: an argument it does not know is no usage error (exit 2 would
    block the tool call in Claude Code)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXD_")}
    done = subprocess.run([str(CTXCTL), "hook", "--socket", str(tmp_path / "none.sock"),
                           "--bogus"], input="{}", capture_output=True, text=True, env=env,
                          timeout=30, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.fixture
def claude_sid() -> str:
    return str(uuid.uuid4())


def test_session_start_opens_the_session_and_adds_project_memories(
        shared_daemon: DaemonProcess, claude_sid: str) -> None:
    cwd = "/home/u/src/pelican"
    with Client(shared_daemon.socket) as client:
        client.call("memory.record", {
            "title": "pelican builds with make", "content": "Run make html in pelican.",
            "scope": "project:/home/u/src/pelican"})
        code, out, err = hook(shared_daemon.socket,
                              event("SessionStart", claude_sid, cwd, source="startup"))
        assert (code, err) == (0, "")
        answer = json.loads(out)
        assert answer["hookSpecificOutput"]["hookEventName"] == "SessionStart"
        assert answer["hookSpecificOutput"]["additionalContext"] == (
            "Memories from earlier work that may help with this task:\n"
            "- pelican builds with make (confidence 0.80): Run make html in pelican.\n")
        session = client.call("session.get", {"session_id": claude_sid})["session"]
        assert (session["project"], session["state"]) == (cwd, "open")


def test_user_prompt_is_recorded_and_injections_are_drained(
        shared_daemon: DaemonProcess, claude_sid: str) -> None:
    cwd = "/home/u/src/quiet"
    with Client(shared_daemon.socket) as client:
        code, out, _ = hook(shared_daemon.socket,
                            event("UserPromptSubmit", claude_sid, cwd, prompt="zzqx wibble"))
        assert (code, out) == (0, "")  # nothing to add: no injection, no memory matches
        client.call("inject.push", {"session_id": claude_sid, "content": "The CI is red."})
        code, out, _ = hook(shared_daemon.socket,
                            event("UserPromptSubmit", claude_sid, cwd, prompt="and now?"))
        assert json.loads(out) == {"hookSpecificOutput": {
            "hookEventName": "UserPromptSubmit", "additionalContext": "The CI is red."}}
        listed = client.call("inject.list", {"session_id": claude_sid})["injections"]
        assert [i["state"] for i in listed] == ["accepted"]
        messages = client.call("message.list", {"session_id": claude_sid})["messages"]
        assert [(m["role"], m["content"]) for m in messages] == [
            ("user", "zzqx wibble"), ("user", "and now?")]


def test_a_large_bash_output_is_offloaded_and_answered_with_the_stub(
        shared_daemon: DaemonProcess, claude_sid: str) -> None:
    output = "".join(f"line {i:05d} of the build log\n" for i in range(1000))
    response = {"stdout": output, "stderr": "", "interrupted": False, "isImage": False}
    code, out, _ = hook(shared_daemon.socket, event(
        "PostToolUse", claude_sid, "/home/u/src/big", tool_name="Bash",
        tool_input={"command": "make"}, tool_response=response, tool_use_id="toolu_01"))
    assert code == 0
    updated = json.loads(out)["hookSpecificOutput"]["updatedToolOutput"]
    with Client(shared_daemon.socket) as client:
        messages = client.call("message.list", {"session_id": claude_sid})["messages"]
        assert [m["role"] for m in messages] == ["assistant", "tool"]
        ref_id = messages[1]["ref_id"]
        # 28 characters a line with its newline: six lines of each end fit in 180.
        lines = output.splitlines()
        assert updated == {
            "stdout": '[Tool result stored — 28,000 bytes, 1,000 lines from "Bash". First and '
                      "last lines, and lines with errors:\n" + "\n".join(
                          [*lines[:6], "[… 988 lines …]", *lines[-6:]])
                      + f'\n] Use read_result with ref_id="{ref_id}" (or run: ctxctl result '
                      f"{ref_id}) to read more.",
            "stderr": "", "interrupted": False, "isImage": False}
        read = client.call("result.read", {"session_id": claude_sid, "ref_id": ref_id,
                                           "limit": 1_000_000})
        assert read["content"] == output
        # A small output is recorded and left as it is.
        code, out, _ = hook(shared_daemon.socket, event(
            "PostToolUse", claude_sid, "/home/u/src/big", tool_name="Bash",
            tool_input={"command": "ls"}, tool_response={**response, "stdout": "a\nb\n"},
            tool_use_id="toolu_02"))
        assert (code, out) == (0, "")
        messages = client.call("message.list", {"session_id": claude_sid})["messages"]
        assert (messages[-1]["content"], messages[-1]["tool_call_id"]) == ("a\nb\n",
                                                                            "toolu_02")


def test_read_persisted_output_failures_and_ctxds_own_answers(
        tmp_path: Path, shared_daemon: DaemonProcess, claude_sid: str) -> None:
    """The shapes Claude Code 2.1 sends (recorded from the bundled CLI): Read's text file;
    a Bash output it cut at 30,000 characters and saved whole beside its transcript;
    PostToolUseFailure's ``error``; an MCP tool of ctxd's own."""
    cwd = str(tmp_path / "proj")
    transcript = tmp_path / "claude" / "projects" / "-proj" / f"{claude_sid}.jsonl"
    saved = transcript.parent / claude_sid / "tool-results" / "b1.txt"
    saved.parent.mkdir(parents=True)
    whole = "".join(f"walrus-{i:05d} " + "x" * 40 + "\n" for i in range(2000))  # 108,000
    saved.write_text(whole)
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("not Claude Code's: " + whole)
    (transcript.parent / claude_sid / "tool-results" / "link.txt").symlink_to(outside)
    socket = shared_daemon.socket

    def post(call_id: str, name: str, response: Any, **fields: Any) -> str:
        code, out, _ = hook(socket, event(
            fields.pop("hook_event_name", "PostToolUse"), claude_sid, cwd, tool_name=name,
            tool_input=fields.pop("tool_input", {}), tool_use_id=call_id,
            transcript_path=str(transcript), **({"tool_response": response}
                                                if response is not None else {}), **fields))
        assert code == 0
        return out

    bash = {"stdout": whole[:30_000], "stderr": "", "interrupted": False, "isImage": False,
            "noOutputExpected": False, "persistedOutputPath": str(saved),
            "persistedOutputSize": 108_000}
    out_saved = post("toolu_saved", "Bash", bash)
    out_link = post("toolu_link", "Bash", {**bash, "persistedOutputPath": str(
        transcript.parent / claude_sid / "tool-results" / "link.txt")})
    out_outside = post("toolu_outside", "Bash", {**bash, "persistedOutputPath": str(outside)})
    content = "".join(f"line {i:06d} of a big file with words\n" for i in range(2236))
    read = {"type": "text", "file": {"filePath": f"{cwd}/big.txt", "content": content,
                                     "numLines": 2236, "startLine": 1, "totalLines": 4001,
                                     "truncatedByTokenCap": True}}
    out_read = post("toolu_read", "Read", read, tool_input={"file_path": f"{cwd}/big.txt"})
    small_error = "Exit code 3\nsmall-err"
    big_error = "Exit code 1\n" + "".join(f"ok-{i:05d}\n" for i in range(2000)) + (
        "FAIL: test_parser")  # 18,029 characters: over four times the threshold
    out_failures = [post(call_id, "Bash", None, hook_event_name="PostToolUseFailure",
                         error=error, is_interrupt=False)
                    for call_id, error in (("toolu_fail1", small_error),
                                           ("toolu_fail2", big_error))]
    page = "".join(f"page line {i:05d}\n" for i in range(1500))  # 24,000 bytes
    out_own = post("toolu_own", "mcp__ctxd__read_result", [{"type": "text", "text": page}])

    with Client(socket) as client:
        results = {m["tool_call_id"]: m for m in client.call(
            "message.list", {"session_id": claude_sid})["messages"] if m["role"] == "tool"}
        rendered = {m["tool_call_id"]: m["content"] for m in client.call(
            "ctxd.render", {"session_id": claude_sid})["messages"] if m["role"] == "tool"}

        def read_back(call_id: str) -> str:
            answer = client.call("result.read", {"session_id": claude_sid, "limit": 1_000_000,
                                                 "ref_id": results[call_id]["ref_id"]})
            return str(answer["content"])

        # The whole output from Claude Code's file; the stub in Bash's shape, without the
        # file (Claude Code would show its preview of it again).
        assert read_back("toolu_saved") == whole
        assert json.loads(out_saved)["hookSpecificOutput"]["updatedToolOutput"] == {
            "stdout": rendered["toolu_saved"], "stderr": "", "interrupted": False,
            "isImage": False, "noOutputExpected": False}
        assert rendered["toolu_saved"].startswith(
            '[Tool result stored — 108,000 bytes, 2,000 lines from "Bash".')
        # A file outside Claude Code's folders (directly or through a link): what it cut.
        assert read_back("toolu_link") == read_back("toolu_outside") == whole[:30_000]
        assert all(json.loads(out)["hookSpecificOutput"]["updatedToolOutput"]["stdout"]
                   .startswith("[Tool result stored — 30,000 bytes, 556 lines from \"Bash\".")
                   for out in (out_link, out_outside))
        # Read: its file's content, the stub in Read's own shape.
        assert read_back("toolu_read") == content
        assert json.loads(out_read)["hookSpecificOutput"]["updatedToolOutput"] == {
            **read, "file": {**read["file"], "content": rendered["toolu_read"]}}
        # Failures: recorded as errors, the small one inline, the large one as its stub
        # (with its FAIL line); Claude Code takes no replacement for them.
        assert out_failures == ["", ""]
        assert (results["toolu_fail1"]["content"], results["toolu_fail1"]["meta"]) == (
            small_error, {"live": "PostToolUseFailure", "is_error": True})
        assert rendered["toolu_fail1"] == small_error
        assert read_back("toolu_fail2") == big_error
        assert rendered["toolu_fail2"].split("\n")[-2] == "FAIL: test_parser"
        # ctxd's own tool's answer is never offloaded: the model gets the page it asked for.
        assert out_own == ""
        assert results["toolu_own"].get("ref_id") is None
        assert rendered["toolu_own"] == page


def test_an_import_keeps_the_output_claude_code_saved_inside_the_transcripts_folder(
        tmp_path: Path, shared_daemon: DaemonProcess, claude_sid: str) -> None:
    """A result the hooks did not record (here: no PostToolUse at all) is imported from the
    transcript: Claude Code's ``<persisted-output>`` preview gives way to the file its
    ``toolUseResult`` names, when that file is inside the transcript's folder."""
    cwd = str(tmp_path)
    transcript = tmp_path / "projects" / "-p" / f"{claude_sid}.jsonl"
    saved = transcript.parent / claude_sid / "tool-results" / "b1.txt"
    saved.parent.mkdir(parents=True)
    whole = "".join(f"otter-{i:05d} " + "y" * 40 + "\n" for i in range(2000))
    saved.write_text(whole)
    outside = tmp_path / "outside.txt"
    outside.write_text(whole)
    base = {"sessionId": claude_sid, "cwd": cwd, "isSidechain": False}

    def preview(path: Path) -> str:
        return (f"<persisted-output>\nOutput too large (105.5KB). Full output saved to: {path}"
                f"\n\nPreview (first 2KB):\n{whole[:2000]}\n...\n</persisted-output>")

    records = [{**base, "type": "user", "uuid": "u1", "parentUuid": None,
                "message": {"role": "user", "content": "print the logs"}}]
    for n, path in enumerate((saved, outside), 1):
        records += [
            {**base, "type": "assistant", "uuid": f"a{n}", "parentUuid": records[-1]["uuid"],
             "message": {"id": f"msg_{n}", "role": "assistant", "model": "claude-x",
                         "content": [{"type": "tool_use", "id": f"toolu_{n}", "name": "Bash",
                                      "input": {"command": "cat log"}}]}},
            {**base, "type": "user", "uuid": f"r{n}", "parentUuid": f"a{n}",
             "toolUseResult": {"stdout": whole[:30_000], "stderr": "", "interrupted": False,
                               "isImage": False, "persistedOutputPath": str(path),
                               "persistedOutputSize": len(whole)},
             "message": {"role": "user", "content": [{"type": "tool_result",
                                                      "tool_use_id": f"toolu_{n}",
                                                      "content": preview(path)}]}}]
    transcript.write_text("".join(map(_line, records)))
    assert hook(shared_daemon.socket, event("Stop", claude_sid, cwd, stop_hook_active=False,
                                            transcript_path=str(transcript))) == (0, "", "")
    with Client(shared_daemon.socket) as client:
        results = {m["tool_call_id"]: m["content"] for m in client.call(
            "message.list", {"session_id": claude_sid})["messages"] if m["role"] == "tool"}
    assert results == {"toolu_1": whole, "toolu_2": preview(outside)}


def test_pre_compact_snapshots_and_session_start_compact_returns_the_summary(
        shared_daemon: DaemonProcess, claude_sid: str) -> None:
    cwd = "/home/u/src/long"
    with Client(shared_daemon.socket) as client:
        client.call("session.open", {"session_id": claude_sid, "project": cwd,
                                     "budget": {"context_window": 12_000,
                                                "max_output_tokens": 1_000}})
        for i in range(12):
            client.call("message.append", {"session_id": claude_sid, "messages": [
                {"role": "user", "content": f"question {i}: " + "word " * 300},
                {"role": "assistant", "content": f"answer {i}: " + "reply " * 300}],
                "allow_over": True})
        code, out, _ = hook(shared_daemon.socket,
                            event("PreCompact", claude_sid, cwd, trigger="auto",
                                  custom_instructions=None))
        assert (code, out) == (0, "")
        resumed = client.call("session.resume", {"session_id": claude_sid})
        assert resumed["source"] == "snapshot"
        summary = [m["content"] for m in resumed["messages"]
                   if m["content"].startswith("[Summary of ")]
        assert len(summary) == 1
        code, out, _ = hook(shared_daemon.socket,
                            event("SessionStart", claude_sid, cwd, source="compact"))
        assert json.loads(out)["hookSpecificOutput"]["additionalContext"] == summary[0]


def test_a_lone_surrogate_in_a_prompt_or_tool_output_is_recorded_as_u_fffd(
        shared_daemon: DaemonProcess, claude_sid: str) -> None:
    """Claude Code (JavaScript) writes half an emoji as a lone surrogate escape; the hook
    passes it on as one, and the daemon records U+FFFD (docs/protocol.md, "Framing")."""
    cwd = "/home/u/src/emoji"
    code, out, _ = hook(shared_daemon.socket, event(
        "UserPromptSubmit", claude_sid, cwd, prompt="why is \ud83d cut?"))
    assert (code, out) == (0, "")
    response = {"stdout": "half \udc00 of it\n", "stderr": "", "interrupted": False,
                "isImage": False}
    code, out, _ = hook(shared_daemon.socket, event(
        "PostToolUse", claude_sid, cwd, tool_name="Bash", tool_input={"command": "cat \ud83d"},
        tool_response=response, tool_use_id="toolu_01"))
    assert (code, out) == (0, "")
    with Client(shared_daemon.socket) as client:
        messages = client.call("message.list", {"session_id": claude_sid})["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "why is \ufffd cut?"),
        ("assistant", [{"type": "tool_use", "id": "toolu_01", "name": "Bash",
                        "input": {"command": "cat \ufffd"}}]),
        ("tool", "half \ufffd of it\n")]


def test_an_answer_with_id_null_ends_the_hooks_wait(daemon_root: Path, claude_sid: str) -> None:
    """A request the daemon can only answer with id null (here a line over
    max_request_bytes) is answered: the hook logs the daemon's error, not a timeout."""
    daemon = DaemonProcess(daemon_root, extra_args=["--max-request-bytes", "4096"])
    with daemon.running():
        response = {"stdout": "x" * 5000, "stderr": "", "interrupted": False,
                    "isImage": False}
        assert hook(daemon.socket, event(
            "PostToolUse", claude_sid, "/x", tool_name="Bash", tool_input={"command": "yes"},
            tool_response=response, tool_use_id="toolu_01")) == (0, "", "")
    logged = [line.partition("ctxctl-hook (uid ")[2].partition("): ")[2]
              for line in daemon.log().splitlines() if "ctxctl-hook (uid " in line]
    assert logged == ["HookError: -32600: invalid request: line longer than max_request_bytes "
                      "(4096); it was discarded"]


def test_fails_open(tmp_path: Path, shared_daemon: DaemonProcess, claude_sid: str) -> None:
    start = event("SessionStart", claude_sid, "/x", source="startup")
    assert hook(tmp_path / "none.sock", start) == (0, "", "")
    assert hook(shared_daemon.socket, {"not": "a hook"}) == (0, "", "")
    # An error the daemon answers (a session id it refuses) is logged by the daemon.
    bad = event("UserPromptSubmit", "bad id!", "/x", prompt="hi")
    assert hook(shared_daemon.socket, bad) == (0, "", "")
    assert "ctxctl-hook (uid" in shared_daemon.log_path.read_text()
    # Events ctxd does not handle (yet) answer nothing and touch nothing.
    assert hook(shared_daemon.socket, event("Notification", claude_sid, "/x",
                                            message="m")) == (0, "", "")


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record) + "\n"


def test_stop_ingests_the_transcript_without_what_the_hooks_recorded_live(
        tmp_path: Path, shared_daemon: DaemonProcess, claude_sid: str) -> None:
    """Stop reads the transcript from the last byte read: the prompt, the tool call and its
    result that UserPromptSubmit and PostToolUse recorded are not appended again; the
    model's answer and its usage (once per message.id) are; a later Stop reads only what
    was added, and SubagentStop makes the sub-agent's own file a branch."""
    cwd = str(tmp_path)
    transcript = tmp_path / "t.jsonl"
    prompt, answer = "list the files", "There are two files."
    base = {"sessionId": claude_sid, "cwd": cwd, "isSidechain": False}
    usage = {"input_tokens": 120, "output_tokens": 30, "cache_read_input_tokens": 0,
             "cache_creation_input_tokens": 0}
    records = [
        {**base, "type": "user", "uuid": "u1", "parentUuid": None,
         "message": {"role": "user", "content": prompt}},
        {**base, "type": "assistant", "uuid": "a1", "parentUuid": "u1",
         "message": {"id": "msg_1", "role": "assistant", "model": "claude-x", "usage": usage,
                     "content": [{"type": "tool_use", "id": "toolu_9", "name": "Bash",
                                  "input": {"command": "ls"}}]}},
        {**base, "type": "user", "uuid": "r1", "parentUuid": "a1",
         "message": {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "toolu_9", "content": "a.txt\nb.txt"}]}},
        {**base, "type": "assistant", "uuid": "a2", "parentUuid": "r1",
         "message": {"id": "msg_2", "role": "assistant", "model": "claude-x", "usage": usage,
                     "content": [{"type": "text", "text": answer}]}},
    ]
    transcript.write_text("".join(map(_line, records)))
    socket = shared_daemon.socket
    assert hook(socket, event("UserPromptSubmit", claude_sid, cwd, prompt=prompt))[0] == 0
    assert hook(socket, event("PostToolUse", claude_sid, cwd, tool_name="Bash",
                              tool_input={"command": "ls"}, tool_use_id="toolu_9",
                              tool_response={"stdout": "a.txt\nb.txt", "stderr": "",
                                             "interrupted": False, "isImage": False}))[0] == 0
    assert hook(socket, event("Stop", claude_sid, cwd, stop_hook_active=False,
                              transcript_path=str(transcript))) == (0, "", "")
    with Client(socket) as client:
        messages = client.call("message.list", {"session_id": claude_sid})["messages"]
        assert [(m["role"], m["content"]) for m in messages] == [
            ("user", prompt),
            ("assistant", [{"type": "tool_use", "id": "toolu_9", "name": "Bash",
                            "input": {"command": "ls"}}]),
            ("tool", "a.txt\nb.txt"), ("assistant", [{"type": "text", "text": answer}])]
        assert messages[0]["meta"] == {"live": "UserPromptSubmit", "live_matched": True}
        totals = client.call("usage.get", {"session_id": claude_sid})["totals"]
        assert (totals["input_tokens"], totals["output_tokens"]) == (240, 60)
        # The same prompt again, live; then the transcript grows by that turn.
        assert hook(socket, event("UserPromptSubmit", claude_sid, cwd, prompt=prompt))[0] == 0
        with transcript.open("a") as out:
            out.write(_line({**base, "type": "user", "uuid": "u2", "parentUuid": "a2",
                             "message": {"role": "user", "content": prompt}}))
            out.write(_line({**base, "type": "assistant", "uuid": "a3", "parentUuid": "u2",
                             "message": {"id": "msg_3", "role": "assistant",
                                         "model": "claude-x", "usage": usage,
                                         "content": [{"type": "text", "text": "Still two."}]}}))
        agent = tmp_path / "agent-a1b2.jsonl"
        agent.write_text("".join(map(_line, [
            {**base, "isSidechain": True, "agentId": "a1b2", "type": "user", "uuid": "s1",
             "parentUuid": None, "message": {"role": "user", "content": "count the lines"}},
            {**base, "isSidechain": True, "agentId": "a1b2", "type": "assistant",
             "uuid": "s2", "parentUuid": "s1",
             "message": {"id": "msg_s", "role": "assistant", "model": "claude-x",
                         "usage": usage, "content": [{"type": "text", "text": "42 lines"}]}},
        ])))
        assert hook(socket, event("SubagentStop", claude_sid, cwd, stop_hook_active=False,
                                  agent_id="a1b2", agent_type="general-purpose",
                                  agent_transcript_path=str(agent))) == (0, "", "")
        assert hook(socket, event("SessionEnd", claude_sid, cwd, reason="other",
                                  transcript_path=str(transcript))) == (0, "", "")
        messages = client.call("message.list", {"session_id": claude_sid})["messages"]
        assert [m["content"] for m in messages[4:] if "branch_id" not in m] == [
            prompt, 'Branch "sub-agent a1b2" returned: 42 lines',
            [{"type": "text", "text": "Still two."}]]
        listed = client.call("branch.list", {"session_id": claude_sid})
        assert (listed["total"], listed["active"], listed["folded"]) == (1, 0, 1)
        assert listed["branches"][0]["description"] == "sub-agent a1b2"
        totals = client.call("usage.get", {"session_id": claude_sid})["totals"]
        assert (totals["input_tokens"], totals["output_tokens"]) == (480, 120)


def test_a_sub_agent_nests_its_own_and_is_denied_past_its_deadline(
        daemon_root: Path, claude_sid: str) -> None:
    """The hooks of one sub-agent's life as Claude Code fires them: its Agent call opens a
    branch, SubagentStart binds it to the sub-agent, whose own Agent call opens a branch
    under it; once ctxd returned the branch at its deadline, the sub-agent's next tool call
    is denied with the reason; SubagentStop of a returned branch leaves its fold as it is."""
    process = DaemonProcess(daemon_root, env={"CTXD_BRANCH_TIMEOUT_S": "1"}).start()
    try:
        cwd = "/home/u/src/grebe"
        socket = process.socket

        def fire(name: str, **fields: Any) -> str:
            code, out, err = hook(socket, event(name, claude_sid, cwd, **fields))
            assert (code, err) == (0, "")
            return out

        agent = {"description": "Map the grebes", "prompt": "Find every grebe nest.",
                 "subagent_type": "general-purpose"}
        assert fire("PreToolUse", tool_name="Agent", tool_input=agent,
                    tool_use_id="toolu_a1") == ""
        assert fire("SubagentStart", agent_id="a-grebe", agent_type="general-purpose") == ""
        nested = {"description": "Count eggs", "prompt": "Count the eggs.",
                  "subagent_type": "Explore"}
        assert fire("PreToolUse", tool_name="Agent", tool_input=nested,
                    tool_use_id="toolu_a2", agent_id="a-grebe",
                    agent_type="general-purpose") == ""
        with Client(socket) as client:
            branches = client.call("branch.list", {"session_id": claude_sid})["branches"]
            outer, inner = sorted(branches, key=lambda b: b["depth"])
            assert (outer["description"], outer["parent_branch_id"]) == ("Map the grebes", None)
            assert (inner["description"], inner["parent_branch_id"]) == (
                "Count eggs", outer["branch_id"])
            while client.call("branch.status", {"branch_id": outer["branch_id"]}
                              )["branch"]["status"] == "active":
                time.sleep(0.05)  # until ctxd returns it at its deadline
            status = client.call("branch.status", {"branch_id": outer["branch_id"]})["branch"]
            assert (status["status"], status["return_reason"]) == ("timeout", "timeout")
        denied = json.loads(fire("PreToolUse", tool_name="Bash",
                                 tool_input={"command": "ls"}, tool_use_id="toolu_b1",
                                 agent_id="a-grebe", agent_type="general-purpose"))
        assert denied == {"hookSpecificOutput": {
            "hookEventName": "PreToolUse", "permissionDecision": "deny",
            "permissionDecisionReason": "time is up: return your result now"}}
        # The main agent's calls are never denied.
        assert fire("PreToolUse", tool_name="Bash", tool_input={"command": "ls"},
                    tool_use_id="toolu_b2") == ""
        assert fire("SubagentStop", agent_id="a-grebe", agent_type="general-purpose",
                    agent_transcript_path=f"{cwd}/agent.jsonl", stop_hook_active=False,
                    last_assistant_message="Three nests.") == ""
        with Client(socket) as client:
            after = client.call("branch.status", {"branch_id": outer["branch_id"]})["branch"]
        assert after == status
    finally:
        process.stop()

def test_a_memory_reaches_a_session_once_until_its_context_is_compacted(
        shared_daemon: DaemonProcess, claude_sid: str) -> None:
    """SessionStart and every UserPromptSubmit ask for memories: the session gets each one
    once, even after a restart of the daemon, and again after Claude Code compacted the
    context that held it (docs/protocol.md, "Claude Code hooks")."""
    cwd = "/home/u/src/heronry"
    block = ("Memories from earlier work that may help with this task:\n"
             "- heronry deploys with rsync (confidence 0.80): Deploy heronry with rsync -a.\n")
    with Client(shared_daemon.socket) as client:
        client.call("memory.record", {
            "title": "heronry deploys with rsync", "content": "Deploy heronry with rsync -a.",
            "scope": "project:/home/u/src/heronry"})
    prompt = "deploy heronry with rsync now"

    def context(name: str, **fields: Any) -> str | None:
        code, out, err = hook(shared_daemon.socket, event(name, claude_sid, cwd, **fields))
        assert (code, err) == (0, "")
        return json.loads(out)["hookSpecificOutput"]["additionalContext"] if out else None

    started = context("SessionStart", source="startup")
    first = context("UserPromptSubmit", prompt=prompt)
    second = context("UserPromptSubmit", prompt=prompt)
    shared_daemon.stop()
    shared_daemon.start()
    after_restart = context("UserPromptSubmit", prompt=prompt)
    assert context("PreCompact", trigger="manual") is None
    compacted = context("SessionStart", source="compact")
    after_compaction = context("UserPromptSubmit", prompt=prompt)
    with Client(shared_daemon.socket) as client:
        other = client.call("memory.context", {"query": prompt,
                                               "scope": "project:/home/u/src/heronry"})
        given = client.call("memory.context", {"query": prompt, "session_id": claude_sid,
                                               "scope": "project:/home/u/src/heronry"})
        with pytest.raises(ctxclient.InvalidParams) as bad:
            client.call("memory.context", {"query": prompt, "compacted": True})
    assert (started, first, second, after_restart) == (block, None, None, None)
    assert (compacted, after_compaction) == (block, None)
    # Without a session nothing is left out (and nothing remembered).
    assert other["text"] == block
    # With it, the reason says the memory is there already (not that none matched).
    assert (given["text"], given["injection"]["reason"]) == (
        None, "the memories that match were given to this session already (they may come "
              "again once its agent compacts its context)")
    assert bad.value.data["path"] == "$.compacted"
