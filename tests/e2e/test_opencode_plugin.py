"""ctxd's OpenCode plugin (clients/opencode/ctxd.js) run by node against a real daemon: the
hooks' edge cases that a real OpenCode run does not reach (tests/e2e/test_opencode.py runs
the plugin inside OpenCode itself)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess

PLUGIN = (Path(__file__).parents[2] / "clients" / "opencode" / "ctxd.js").as_uri()
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node not installed (apt-get install nodejs)")

SCRIPT = r"""
const { CtxdPlugin } = await import(process.argv[1])
const [sessionID, paths] = [process.argv[2], JSON.parse(process.argv[3])]
const hooks = await CtxdPlugin({ directory: "/p/opencode" })
const shown = []
for (const [i, where] of paths.entries()) {
  const output = { output: `...output truncated...\n\nFull output saved to: ${where}\n\ntail ${i}`,
                   metadata: { truncated: true, outputPath: where } }
  await hooks["tool.execute.after"]({ tool: "bash", sessionID, callID: `call_${i}` }, output)
  shown.push(output.output)
}
const ours = { args: { ref_id: "res_0123456789abcdef", _meta: { progressToken: 7 } } }
await hooks["tool.execute.before"]({ tool: "ctxd_read_result", sessionID, callID: "c1" }, ours)
const other = { args: { command: "ls" } }
await hooks["tool.execute.before"]({ tool: "bash", sessionID, callID: "c2" }, other)
const messages = [{ info: { role: "assistant" }, parts: [
  { type: "tool", tool: "ctxd_read_result", state: { input: structuredClone(ours.args) } },
  { type: "tool", tool: "ctxd_memory_search",
    state: { input: { query: "q", _meta: { "ctxd/session_id": sessionID } } } }] }]
await hooks["experimental.chat.messages.transform"]({}, { messages })
console.log(JSON.stringify({ shown, ours: ours.args, other: other.args,
                             sent: messages[0].parts.map((part) => part.state.input) }))
"""

WHOLE = "".join(f"{i}\n" for i in range(1, 3001))
"""What OpenCode saved whole (13,893 bytes) when it cut a command's output."""
FULL_OUTPUT_BYTES = 4 * 1024 * 1024


def test_the_plugin_reads_only_opencodes_own_saved_outputs_and_names_the_session(
        tmp_path: Path, shared_daemon: DaemonProcess, sid: str) -> None:
    data = tmp_path / "data"
    folder = data / "opencode" / "tool-output"
    folder.mkdir(parents=True)
    (folder / "tool_saved").write_text(WHOLE)
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not OpenCode's: a file named by some output\n")
    (folder / "tool_link").symlink_to(elsewhere)
    (folder / "tool_big").write_bytes(b"x" * (FULL_OUTPUT_BYTES + 1))
    paths = [str(folder / "tool_saved"), str(elsewhere), str(folder / "tool_link"),
             str(folder / "tool_big"), "tool-output/tool_saved", str(folder / "tool_gone"),
             str(folder / ".." / "tool-output" / "tool_saved")]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "XDG_DATA_HOME": str(data),
           "CTXD_SOCKET": str(shared_daemon.socket)}
    assert NODE is not None
    done = subprocess.run([NODE, "--input-type=module", "-e", SCRIPT, PLUGIN, sid,
                           json.dumps(paths)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    result: dict[str, Any] = json.loads(done.stdout)

    def cut(i: int) -> str:
        return f"...output truncated...\n\nFull output saved to: {paths[i]}\n\ntail {i}"

    with shared_daemon.client() as ctxd:
        messages = ctxd.call("message.list", {"session_id": sid})["messages"]
        session = ctxd.call("session.get", {"session_id": sid})["session"]
    # A file in OpenCode's tool-output folder is stored whole (the model then sees ctxd's
    # stub); any other path (outside it, a link out of it, too large, relative, missing)
    # leaves the output as OpenCode cut it.
    assert [m["content"] for m in messages] == [WHOLE, *[cut(i) for i in range(1, 6)],
                                                WHOLE]
    assert session["project"] == "/p/opencode"
    assert [f'ref_id="{m.get("ref_id")}"' in shown
            for m, shown in zip(messages, result["shown"], strict=True)] == [
        True, False, False, False, False, False, True]
    assert result["shown"][1:6] == [cut(i) for i in range(1, 6)]

    # A call of ctxd's MCP tools names the conversation's session and project (other _meta
    # kept); another tool's is left alone; the model is sent the arguments without them.
    assert result["ours"] == {"ref_id": "res_0123456789abcdef", "_meta": {
        "progressToken": 7, "ctxd/session_id": sid, "ctxd/project": "/p/opencode"}}
    assert result["other"] == {"command": "ls"}
    assert result["sent"] == [{"ref_id": "res_0123456789abcdef", "_meta": {"progressToken": 7}},
                              {"query": "q"}]
