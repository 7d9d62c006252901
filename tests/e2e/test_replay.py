"""The replay (docs/decisions.md, "Replay: context saved"): a made-up Claude Code transcript
whose figures are computed here, a shared transcript with its figures pinned, and
`ctxctl replay` (--json, a bad file, --plot)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import short_root

from ctxclient._replay import kept_in, load, replay
from ctxd.hygiene import ref_id_for
from ctxd.tokens import TokenCounter
from ctxd.transcripts import ClaudeCodeParser

TRANSCRIPTS = Path(__file__).resolve().parents[3] / "shared" / "bench-data" / "transcripts"
DEEP = TRANSCRIPTS / "claude-code_claude-code-log_deep-manifest_a7da6a22.jsonl"
needs_data = pytest.mark.skipif(not DEEP.exists(), reason="bench-data transcripts absent")

BIG = "".join(f"line {i}: def parse(value): return value\n" for i in range(200))
FIRST = "Fix the date parser. Always run the tests with pytest -q.\nDon't touch setup.py."
LATEST = "Now add a changelog entry."
ERROR = "FAILED tests/test_dates.py::test_iso - AssertionError"


def _record(kind: str, content: Any, uuid: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "uuid": uuid, "sessionId": "s1",
            "message": {"role": kind, "content": content}, **extra}


def made_up() -> list[dict[str, Any]]:
    return [
        _record("user", FIRST, "u1"),
        _record("assistant", [{"type": "tool_use", "id": "t1", "name": "Read",
                               "input": {"file_path": "/p/dates.py"}}], "a1"),
        _record("user", [{"type": "tool_result", "tool_use_id": "t1", "content": BIG}], "u2"),
        _record("assistant", [{"type": "tool_use", "id": "t2", "name": "Bash",
                               "input": {"command": "pytest -q"}}], "a2"),
        _record("user", [{"type": "tool_result", "tool_use_id": "t2", "is_error": True,
                          "content": ERROR + "\n1 failed"}], "u3"),
        _record("assistant", [{"type": "text", "text": "Fixed."}], "a3"),
        _record("user", LATEST, "u4"),
        _record("assistant", [{"type": "text", "text": "Done."}], "a4"),
    ]


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def raw_tokens(records: list[dict[str, Any]]) -> int:
    """The raw thread's tokens: every message the parser makes of the records, counted by
    ctxd's rule, plus 3 for the reply priming."""
    data = "".join(json.dumps(record) + "\n" for record in records).encode()
    entries, _ = ClaudeCodeParser().feed(data, 0, 1)
    counter = TokenCounter()
    return 3 + sum(counter.message_tokens(m.role, m.content, m.name, m.tool_call_id)
                   for entry in entries for m in entry.messages)


def test_made_up_transcript_replays_with_exact_figures(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", made_up())
    # A turn is one model call: the prompt, the response and the results answering it.
    assert [len(turn) for turn in load(path).turns] == [3, 2, 1, 2]
    report = replay(path)
    assert report.window == 200_000
    assert (report.trigger_tokens, report.floor_share) == (182_217, 1.0)  # 0.95 of 191,808
    assert report.turns == 4
    assert report.messages == 8
    assert report.raw_peak_tokens == raw_tokens(made_up())
    assert [p.raw_tokens for p in report.series] == [
        raw_tokens(made_up()[:end]) for end in (3, 5, 6, 8)]
    # The one large result is offloaded: the render holds its stub instead.
    assert report.offloaded == 1
    assert report.compacted == 0
    assert report.peak_tokens == report.final_tokens < report.raw_peak_tokens
    assert report.removed_messages == 1
    assert report.removed_bytes == len(BIG.encode())
    assert report.retrievable_fraction == 1.0
    assert report.not_retrievable == []
    # first and latest request, two rules, one file, one command, one error: all kept
    # (the file's contents one result.read away).
    assert report.key_facts == 7
    assert report.facts_missed == []
    assert report.key_facts_kept == 1.0
    assert report.reduction == round(1 - report.peak_tokens / report.raw_peak_tokens, 4)


def test_a_small_window_compacts_and_every_removed_byte_reads_back(tmp_path: Path) -> None:
    records = made_up()
    for n in range(12):
        records += [_record("user", f"Request {n}: read part {n}.", f"x{n}"),
                    _record("assistant", [{"type": "tool_use", "id": f"r{n}", "name": "Read",
                                           "input": {"file_path": f"/p/part{n}.py"}}],
                            f"y{n}"),
                    _record("user", [{"type": "tool_result", "tool_use_id": f"r{n}",
                                      "content": BIG.replace("line", f"p{n}")[:3000]}],
                                     f"z{n}"),
                    _record("assistant", [{"type": "text", "text": f"Part {n} read."}],
                            f"w{n}")]
    report = replay(write(tmp_path / "t.jsonl", records), window=12_000)
    assert report.turns == 4 + 12 * 2
    assert report.compacted > 0
    assert report.peak_tokens < report.raw_peak_tokens
    assert report.retrievable_fraction == 1.0
    assert report.not_retrievable == []


PINNED_COSTS = {"raw": 983_576.45, "claude-code": 572_725.6, "context-editing": 983_576.45,
                "observation-masking": 3_478_017.85, "ctxd": 377_117.0}


@needs_data
def test_shared_transcript_figures() -> None:
    """Pinned: a replay is deterministic (ref_ids derive from the session and the seq), and
    two runs give the same report."""
    report = replay(DEEP, window=32_000)
    assert (report.turns, report.messages, report.raw_peak_tokens) == (103, 299, 86_234)
    # The offload stubs' excerpts (head, error lines, tail: up to 600 characters, where
    # the first 200 were shown) made the final context 14,157 -> 15,889 tokens; summaries
    # that take Claude Code's slash-command records for no request, 15,889 -> 13,573.
    assert (report.peak_tokens, report.final_tokens) == (22_541, 13_573)
    # The first request survives every compaction: each summary carries the last over.
    assert (report.key_facts, report.key_facts_kept, len(report.facts_missed)) == (10, 1.0, 0)
    # Old Write/Edit inputs cleared too: fewer messages summarised away.
    assert (report.removed_messages, report.offloaded, report.compacted) == (207, 52, 207)
    assert report.retrievable_fraction == 1.0
    # Automatic compaction keeps the thread under the compact trigger (0.95 of 23,808), and
    # the peak cannot be much under it: 22,617 / 86,234.
    assert (report.trigger_tokens, report.floor_share) == (22_617, 0.2623)
    # Cost (docs/performance.md, "Replay: cost"): ctxd's gateway, at most 0.8 of the
    # cheapest other policy's, keeping as many key facts and every removed byte.
    costs = {name: policy.cost for name, policy in report.policies.items()}
    assert costs == PINNED_COSTS
    best = min((name for name in costs if name != "ctxd"), key=costs.__getitem__)
    assert costs["ctxd"] <= 0.8 * costs[best]
    ctxd = report.policies["ctxd"]
    assert ctxd.key_facts_kept >= report.policies[best].key_facts_kept
    assert (ctxd.key_facts_kept, ctxd.retrievable_fraction) == (1.0, 1.0)
    assert replay(DEEP, window=32_000).as_dict() == report.as_dict()


@pytest.mark.parametrize(("fact", "text", "kept"), [
    ("ls", "$ ls -la", True),
    ("ls", "ran ls", True),
    ("ls", "the tools are false", False),
    ("ls", "ls_colors", False),
    ("README.md", "Edit README.md.", True),
    ("README.md", "see README.md, then", True),
    ("README.md", "docs/README.md", False),
    ("README.md", "README.md.bak", False),
    ("README.md", "old-README.md", False),
    ("/p/a.py", "read /p/a.py\n", True),
    ("/p/a.py", "read /p/a.pyc", False),
    ("/p/a.py", "/p/a.py/x", False),
    ("pytest -q", "`pytest -q`", True),
    ("pytest -q", "pytest -qq", False),
    ("Error: boom!", "x Error: boom!y", True),  # edges that are not word characters
    ("", "anything", False),
])
def test_a_key_fact_is_kept_only_delimited(fact: str, text: str, kept: bool) -> None:
    """A fact counts as kept where no word or path character continues it (docs/decisions.md,
    "Replay: context saved"): a substring would keep `ls` in any "tools"."""
    assert kept_in(fact, text) is kept


def test_ref_ids_derive_from_the_session_and_the_seq() -> None:
    assert ref_id_for("replay", 1) == "res_49f0c6489b6cc931"
    assert ref_id_for("ses_0123456789abcdef", 42) == "res_c26aaefbf9393992"


def ctxctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ctxclient.cli", *args], capture_output=True,
                          text=True, timeout=300, check=False)


def test_ctxctl_replay_json(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", made_up())
    done = ctxctl("replay", str(path), "--json", "--window", "32000")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["window"] == 32_000
    assert report["raw_peak_tokens"] == raw_tokens(made_up())
    assert report["peak_tokens"] < report["raw_peak_tokens"]
    assert report["reduction"] == round(1 - report["peak_tokens"]
                                        / report["raw_peak_tokens"], 4)
    assert report["key_facts_kept"] == 1.0
    assert report["facts_missed"] == []
    assert report["retrievable_fraction"] == 1.0
    assert [point["turn"] for point in report["series"]] == [1, 2, 3, 4]
    policies = report["policies"]
    assert list(policies) == ["raw", "claude-code", "context-editing", "observation-masking",
                              "ctxd"]
    raw = policies["raw"]
    # No timestamps: every call comes at once, so each reads all the one before it sent
    # and writes only what it adds.
    tokens = [point["tokens"] for point in raw["series"]]
    assert [point["call"] for point in raw["series"]] == [1, 2, 3, 4]
    assert raw["cache_read_tokens"] == sum(tokens[:-1])
    assert raw["cache_write_tokens"] == tokens[-1] == raw["peak_tokens"]
    assert raw["cost"] == round(0.1 * raw["cache_read_tokens"]
                                + 1.25 * raw["cache_write_tokens"]
                                + 5 * raw["output_tokens"], 2)
    assert raw["series"][-1]["cumulative_cost"] == raw["cost"]
    assert report["price_model"] == "claude-sonnet-4-5"
    assert raw["dollars"] == round((3.75 * raw["cache_write_tokens"]
                                    + 0.3 * raw["cache_read_tokens"]
                                    + 15 * raw["output_tokens"]) / 1e6, 4)
    # The answers are the same whatever the policy; nothing here passes 100,000 tokens,
    # 84 % of the window or ten results.
    assert {policy["output_tokens"] for policy in policies.values()} == {raw["output_tokens"]}
    for same in ("claude-code", "context-editing", "observation-masking"):
        assert policies[same]["cost"] == raw["cost"]
    # ctxd's gateway sends the read's 9 KB as its stub from the call after it.
    ctxd = policies["ctxd"]
    assert ctxd["peak_tokens"] < raw["peak_tokens"]
    assert ctxd["cost"] < raw["cost"]
    assert (ctxd["key_facts_kept"], ctxd["retrievable_fraction"]) == (1.0, 1.0)


def test_ctxctl_replay_prices_the_policies_asked(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", made_up())
    done = ctxctl("replay", str(path), "--json", "--policy", "raw", "--policy", "ctxd",
                  "--price-model", "claude-opus-4-5")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert list(report["policies"]) == ["raw", "ctxd"]
    raw = report["policies"]["raw"]
    assert (report["price_model"], raw["dollars"]) == ("claude-opus-4-5", round(
        (6.25 * raw["cache_write_tokens"] + 0.5 * raw["cache_read_tokens"]
         + 25 * raw["output_tokens"]) / 1e6, 4))
    table = ctxctl("replay", str(path), "--policy", "ctxd", "--format", "plain")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[-2].split()[:4] == ["POLICY", "COST", "$", "VS_BEST"]
    assert table.stdout.splitlines()[-1].split()[0] == "ctxd"
    refused = ctxctl("replay", str(path), "--policy", "claude")
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == (
        "ctxctl replay: error: argument --policy: invalid choice: 'claude'; did you mean "
        "'claude-code'? (choose from raw, claude-code, context-editing, observation-masking, "
        "ctxd)")


FORMATS_READ = (
    "ctxctl replay reads (--from):\n"
    "  claude-code  a Claude Code transcript, ~/.claude/projects/PROJECT/SESSION.jsonl (JSONL, "
    "or a JSON array of its records)\n"
    "  opencode     an OpenCode export, `opencode export SESSION > FILE` (a JSON object with "
    "info and messages)\n")


def test_ctxctl_replay_bad_files(tmp_path: Path) -> None:
    """A file replay cannot read is named with why, then the formats it reads."""
    missing = ctxctl("replay", str(tmp_path / "none.jsonl"))
    assert missing.returncode == 2
    assert "does not exist" in missing.stderr
    bad = tmp_path / "bad.txt"
    bad.write_text("hello\n")
    refused = ctxctl("replay", str(bad))
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == (f"ctxctl: {bad} is neither a Claude Code transcript nor an "
                              f"OpenCode export\n{FORMATS_READ}")
    lines = tmp_path / "bad.jsonl"
    lines.write_text("not json\n")
    assert ctxctl("replay", str(lines)).stderr == (
        f"ctxctl: {lines} is not a Claude Code transcript: no line is a JSON record\n"
        f"{FORMATS_READ}")
    other_tool = tmp_path / "rollout.jsonl"  # another agent's JSONL: records, no prompt
    other_tool.write_text('{"type":"session_meta","payload":{"id":"x"}}\n')
    assert ctxctl("replay", str(other_tool)).stderr == (
        f"ctxctl: {other_tool} is not a Claude Code transcript: no record is a user or "
        f"assistant message\n"
        f"{FORMATS_READ}")
    not_export = tmp_path / "other.json"
    not_export.write_text('{"info": {}}')
    assert ctxctl("replay", str(not_export), "--from", "opencode").stderr == (
        f"ctxctl: {not_export} is not an OpenCode export: it is not an object "
        f"{{info, messages: [...]}}\n{FORMATS_READ}")
    no_messages = tmp_path / "empty.json"
    no_messages.write_text('{"info": {}, "messages": [{"info": {"role": "system"}}]}')
    assert ctxctl("replay", str(no_messages)).stderr == (
        f"ctxctl: {no_messages} holds no message to replay as an OpenCode export\n"
        f"{FORMATS_READ}")


def test_ctxctl_replay_offers_no_socket(tmp_path: Path) -> None:
    """replay starts its own daemons: a --socket would be ignored, so it is not offered."""
    helped = ctxctl("replay", "--help")
    assert helped.returncode == 0
    assert "--socket" not in helped.stdout
    assert "--json" in helped.stdout
    assert "--format" in helped.stdout
    refused = ctxctl("replay", str(write(tmp_path / "t.jsonl", made_up())), "--socket", "x")
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == (
        "ctxctl replay: error: unrecognized arguments: --socket x")


def test_ctxctl_replay_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = write(tmp_path / "t.jsonl", made_up())
    png = tmp_path / "replay.png"
    done = ctxctl("replay", str(path), "--plot", str(png), "--format", "plain")
    assert done.returncode == 0, done.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert done.stdout.splitlines()[0].split() == ["FIGURE", "VALUE", "DETAIL"]


def test_opencode_export_replays_turn_by_turn(tmp_path: Path) -> None:
    def message(role: str, mid: str, *parts: dict[str, Any]) -> dict[str, Any]:
        return {"info": {"role": role, "id": mid}, "parts": list(parts)}

    export = {"info": {"id": "ses_x"}, "messages": [
        message("user", "m1", {"type": "text", "text": "List the files. Never use tabs."}),
        message("assistant", "m2", {"type": "tool", "callID": "c1", "tool": "bash", "state": {
            "status": "completed", "input": {"command": "ls"}, "output": BIG}}),
        message("user", "m3", {"type": "text", "text": "Thanks."}),
        message("assistant", "m4", {"type": "text", "text": "Done."})]}
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    report = replay(path)
    assert report.format == "opencode"
    assert report.turns == 2  # one assistant message each
    assert report.messages == 5  # the tool call and its result are two messages
    assert report.offloaded == 1
    assert report.key_facts == 4  # two requests, one rule, one command
    assert report.facts_missed == []
    assert report.retrievable_fraction == 1.0


def _ctxd_processes_naming(folder: Path) -> list[str]:
    """The command lines of the running processes that name ``folder``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile, or not ours to read
        line = " ".join(part.decode(errors="replace") for part in argv if part)
        if str(folder) in line:
            found.append(line)
    return found


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """An empty folder of a short path, for a replay's TMPDIR: its private daemons' sockets
    go under it, and a socket path is limited to 107 bytes (pytest's own folders grow with
    the runs on a machine)."""
    root = short_root()
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _long_replay(tmp_path: Path, tmp: Path, **pipes: Any) -> tuple[subprocess.Popen[str], Path]:
    """`ctxctl replay` of a transcript of 400 more turns, started with ``tmp`` as its TMPDIR
    (where its private daemons live), once both of its daemons are up (each binds its
    socket before serving)."""
    records = made_up()
    for n in range(400):
        records += [_record("user", f"Request {n}.", f"x{n}"),
                    _record("assistant", [{"type": "text", "text": f"Answer {n}."}], f"y{n}")]
    path = write(tmp_path / "t.jsonl", records)
    # tiktoken caches its encodings under $TMPDIR unless told where: the usual place.
    cache = os.environ.get("TIKTOKEN_CACHE_DIR",
                           os.path.join(tempfile.gettempdir(), "data-gym-cache"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxclient.cli", "replay", str(path)],
        env={**os.environ, "TMPDIR": str(tmp), "TIKTOKEN_CACHE_DIR": cache}, text=True,
        **pipes)
    while proc.poll() is None and len(list(tmp.glob("ctxd-replay-*/*.sock"))) < 2:
        time.sleep(0.01)
    return proc, tmp


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_ctxctl_replay_interrupted_leaves_no_daemon_and_no_file(
        tmp_path: Path, short_tmp: Path, signum: signal.Signals) -> None:
    """Killed (SIGTERM), interrupted (SIGINT) or hung up on (SIGHUP) once its two private
    daemons are up, `ctxctl replay` stops them, removes their directory and says so in one
    line."""
    proc, tmp = _long_replay(tmp_path, short_tmp, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        assert proc.poll() is None, proc.communicate()
        sockets = sorted(p.name for p in tmp.glob("ctxd-replay-*/*.sock"))
        assert sockets == ["ctxd.sock", "raw.sock"]
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, stdout, stderr) == (130, "", "ctxctl: interrupted\n")
    assert _ctxd_processes_naming(tmp) == []
    assert list(tmp.iterdir()) == []


def test_json_array_replays_turn_by_turn_as_its_jsonl(tmp_path: Path) -> None:
    """Claude Code records saved as one JSON array replay as they are (transcript.import
    reads the array): the same turns, figures and facts as the same records in JSONL."""
    array = tmp_path / "t.json"
    array.write_text(json.dumps(made_up(), indent=2))
    assert [len(turn) for turn in load(array).turns] == [3, 2, 1, 2]
    assert load(array).turns[0] == made_up()[:3]
    got = replay(array).as_dict()
    want = replay(write(tmp_path / "t.jsonl", made_up())).as_dict()
    assert got.pop("file") == str(array)
    assert want.pop("file") == str(tmp_path / "t.jsonl")
    assert got == want
    assert [point["turn"] for point in got["series"]] == [1, 2, 3, 4]


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_private_daemons_stop_when_ctxctl_replay_is_killed(tmp_path: Path,
                                                           short_tmp: Path) -> None:
    """Even a SIGKILL, which nothing can catch, leaves no daemon running: each is told to
    stop when its parent dies."""
    proc, tmp = _long_replay(tmp_path, short_tmp, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        assert proc.poll() is None
        assert len(_ctxd_processes_naming(tmp)) == 2
        proc.kill()
        proc.wait()
        # Each daemon exits on its own SIGTERM: wait for that, up to a minute.
        deadline = time.monotonic() + 60
        while _ctxd_processes_naming(tmp) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _ctxd_processes_naming(tmp) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
