"""The basic path an agent harness takes: open, append, render, measure."""

from conftest import DaemonProcess


def test_open_append_render(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        opened = client.call("session.open", {"session_id": sid, "project": "demo"})
        assert opened["created"] is True
        appended = client.call("message.append", {"session_id": sid, "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "hello world"},
        ]})
        # 3 framing + 1 role + 4 content ("You are helpful.") and 3 + 1 + 2 ("hello world")
        assert [m["tokens"] for m in appended["appended"]] == [8, 6]
        rendered = client.call("ctxd.render", {"session_id": sid})
        assert rendered["tokens"] == 8 + 6 + 3
        assert rendered["messages"] == [{"role": "system", "content": "You are helpful."},
                                        {"role": "user", "content": "hello world"}]
