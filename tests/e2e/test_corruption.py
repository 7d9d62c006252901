"""A corrupt, missing or unreachable database, and a damaged memory index file: one clear
line and the right exit code at start-up, `ctxd --check` and `ctxd --recover`, corruption
reported as such while serving (docs/security.md, Corruption and recovery)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from conftest import DaemonProcess, kill_leftovers, short_root
from tests_support import (
    LESSONS,
    NO_PROVIDER_NOTE,
    doctor_gateway_lines,
    hello_text,
    rpc_error,
    search,
)

from ctxclient import Client, RpcError

SESSIONS = 60
PAGE = 4096


def record(client: Client, title: str, content: str) -> None:
    client.call("memory.record", {"title": title, "content": content})


def wait_index_ready(client: Client) -> dict[str, Any]:
    while True:
        index: dict[str, Any] = client.call("daemon.status")["memory_index"]
        if index["state"] == "ready" and index["lexical"] == "ready":
            return index
        time.sleep(0.02)


def populate(client: Client) -> dict[str, list[str]]:
    """SESSIONS sessions of three messages each; session id → its messages' contents."""
    written: dict[str, list[str]] = {}
    for n in range(SESSIONS):
        session_id = f"s{n:03d}"
        client.call("session.open", {"session_id": session_id, "title": f"title {n}"})
        contents = [f"{session_id} message {i}: " + hello_text(60) for i in range(3)]
        client.call("message.append", {"session_id": session_id, "messages": [
            {"role": "user", "content": text} for text in contents]})
        written[session_id] = contents
    return written


@pytest.fixture(scope="module")
def sound_data() -> Iterator[tuple[Path, dict[str, list[str]]]]:
    """A data directory that a daemon filled and stopped cleanly, and what it holds."""
    root = short_root()
    process = DaemonProcess(root)
    with process.running(), process.client() as client:
        written = populate(client)
    yield process.data_dir, written
    kill_leftovers(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def copied(daemon_root: Path, sound_data: tuple[Path, dict[str, list[str]]]) -> DaemonProcess:
    """A daemon (not started) on a copy of the sound data directory."""
    process = DaemonProcess(daemon_root)
    shutil.copytree(sound_data[0], process.data_dir)
    return process


def run_ctxd(process: DaemonProcess, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*process.command(), *extra], capture_output=True, text=True,
                          timeout=120, env=process.environment(), check=False,
                          cwd=Path(__file__).resolve().parents[2])


def page_of(database: Path, table: str, kind: str = "leaf", which: int = 1) -> int:
    """The page number of the ``which``-th ``kind`` page of ``table`` (SQLite's dbstat)."""
    conn = apsw.Connection(str(database), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        pages = [row[0] for row in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = ? ORDER BY pageno",
            (table, kind))]
    finally:
        conn.close()
    return int(pages[which])


def zero_page(database: Path, page: int) -> None:
    with database.open("r+b") as file:
        file.seek((page - 1) * PAGE)
        file.write(bytes(PAGE))


def corrupt(database: Path, how: str) -> str:
    """Damage the file; returns what SQLite says of it."""
    if how == "truncated":
        os.truncate(database, database.stat().st_size // 2)
        return "database disk image is malformed"
    if how == "garbage-header":
        with database.open("r+b") as file:
            file.write(b"\xa5" * 100)
        return "file is not a database"
    if how == "not-a-database":
        database.write_text("these are notes, not a database\n" * 400)
        return "file is not a database"
    zero_page(database, 2)
    return "database disk image is malformed"


@pytest.mark.parametrize("how", ["truncated", "garbage-header", "not-a-database",
                                 "zeroed-page-2"])
def test_a_corrupt_database_stops_the_start_with_one_line_and_78(
        copied: DaemonProcess, how: str) -> None:
    database = copied.data_dir / "ctxd.db"
    detail = corrupt(database, how)
    result = run_ctxd(copied)
    lines = result.stderr.splitlines()
    assert (result.returncode, result.stdout, len(lines)) == (78, "", 1), result.stderr
    assert lines[0].split(" ", 2)[2] == (
        f"CRITICAL ctxd: the database {database} is corrupt ({detail}); run `ctxd --recover` "
        "to salvage what can be read into a new file (the corrupt one is kept aside)")
    assert not copied.socket.exists()


def test_check_says_ok_on_a_sound_database(copied: DaemonProcess) -> None:
    result = run_ctxd(copied, "--check")
    database = copied.data_dir / "ctxd.db"
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{database}: ok\n", "")


def test_check_lists_what_is_wrong_and_fails(copied: DaemonProcess) -> None:
    database = copied.data_dir / "ctxd.db"
    zero_page(database, page_of(database, "messages"))
    result = run_ctxd(copied, "--check")
    assert result.returncode == 1
    found = result.stdout.splitlines()
    assert found, result
    assert all(line.startswith(f"{database}: ") for line in found)
    assert result.stderr == (f"ctxd: the database {database} is corrupt; stop ctxd and run "
                             "`ctxd --recover`\n")


def test_recover_keeps_what_survived_and_sets_the_corrupt_file_aside(
        copied: DaemonProcess, sound_data: tuple[Path, dict[str, list[str]]]) -> None:
    written = sound_data[1]
    database = copied.data_dir / "ctxd.db"
    before = database.read_bytes()
    zero_page(database, page_of(database, "sessions", which=1))
    assert run_ctxd(copied).returncode == 78
    result = run_ctxd(copied, "--recover")
    assert result.returncode == 0, result.stderr
    aside = [path for path in copied.data_dir.iterdir() if path.name.startswith(
        "ctxd.db.corrupt-") and path.name.count("-") == 1]
    assert len(aside) == 1
    assert aside[0].read_bytes()[:PAGE] == before[:PAGE]  # the corrupt file, kept as it was
    assert f"the corrupt database is kept at {aside[0]}\n" in result.stdout
    assert "sessions: " in result.stdout
    assert "1 unreadable range(s) skipped" in result.stdout
    assert run_ctxd(copied, "--check").returncode == 0
    with copied.running(), copied.client() as client:
        listed = client.call("session.list", {"limit": 1000})["sessions"]
        survivors = sorted(session["session_id"] for session in listed)
        # A zeroed leaf page loses the sessions on it (a contiguous run), and their messages.
        assert 0 < len(survivors) < SESSIONS
        lost = sorted(set(written) - set(survivors))
        assert lost == [f"s{n:03d}" for n in range(int(lost[0][1:]), int(lost[-1][1:]) + 1)]
        for session_id in survivors:
            messages = client.call("message.list", {"session_id": session_id})["messages"]
            assert [message["content"] for message in messages] == written[session_id]
            assert rpc_error(client, "message.list", {"session_id": lost[0]}).code == -32004


def test_corruption_found_while_serving_is_reported_as_corruption(
        copied: DaemonProcess) -> None:
    database = copied.data_dir / "ctxd.db"
    leaves = [page_of(database, "messages", which=n) for n in range(2)]
    with copied.running(), copied.client() as client:
        for page in leaves:
            zero_page(database, page)
        # Another connection's commit makes the daemon's connection drop its page cache.
        other = apsw.Connection(str(database))
        other.execute("UPDATE sessions SET title = 'changed' WHERE id = 's059'")
        other.close()
        error = rpc_error(client, "message.list", {"session_id": "s000"})
        assert (error.code, error.message) == (-32008, (
            f"the database {database} is corrupt (database disk image is malformed); stop "
            "ctxd and run `ctxd --recover` to salvage what can be read into a new file (the "
            "corrupt one is kept aside)"))
        assert error.data == {"sqlite_error": "CorruptError", "corrupt": True,
                              "fix": "stop ctxd, run `ctxd --recover`, start ctxd again"}
        assert rpc_error(client, "message.list", {"session_id": "s000"}).code == -32008
    assert copied.log().count(f"ERROR ctxd.store: the database {database} is corrupt") == 1


@pytest.mark.parametrize("how", ["deleted", "emptied"])
def test_a_lost_database_is_a_loud_warning(daemon_root: Path, how: str) -> None:
    process = DaemonProcess(daemon_root)
    with process.running(), process.client() as client:
        client.call("session.open", {"session_id": "kept"})
    marker = process.data_dir / "ctxd.created"
    assert marker.read_text().startswith("created ")
    assert "is missing" not in process.log()
    database = process.data_dir / "ctxd.db"
    if how == "deleted":
        database.unlink()
        what = "is missing"
    else:
        database.write_bytes(b"")
        what = "is empty (0 bytes)"
    with process.running(), process.client() as client:
        assert client.call("session.list", {})["sessions"] == []
    assert (f"ERROR ctxd.store: the database {database} {what}, but ctxd created one there "
            f"({marker.read_text().strip()}, says {marker}): every session and memory it "
            "held is gone; starting with an empty database.") in process.log()


def test_an_unwritable_data_directory_is_one_line(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root)
    process.data_dir.mkdir(mode=0o700)
    lock = process.data_dir / "ctxd.lock"
    if os.geteuid() == 0:
        # Root writes whatever the permission bits say: a directory where the lock file
        # goes fails the same open (EISDIR instead of EACCES/EROFS).
        lock.mkdir()
        reason = "Is a directory"
    else:
        os.chmod(process.data_dir, 0o500)
        reason = "Permission denied"
    result = run_ctxd(process)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", (
        f"ctxd: cannot open the lock file {lock} ({reason}); ctxd needs to write in "
        f"{process.data_dir}: check its permissions and that its file system is not "
        "mounted read-only, or choose another --socket/--data-dir\n"))


def test_a_damaged_index_file_fails_its_checksum_and_is_rebuilt(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root)
    with process.running(), process.client() as client:
        wait_index_ready(client)
        for title, content in LESSONS:
            record(client, title, content)
        expected = [search(client, title, mode="dense", k=4) for title, _ in LESSONS]
    index_file = process.data_dir / "memory.faiss"
    size = index_file.stat().st_size
    assert size > 3 * PAGE
    with index_file.open("r+b") as file:
        file.seek(size // 2 - PAGE // 2)
        file.write(b"\x5a" * PAGE)
    with process.running(), process.client() as client:
        index = wait_index_ready(client)
        assert (index["state"], index["vectors"]) == ("ready", 4)
        assert [search(client, title, mode="dense", k=4) for title, _ in LESSONS] == expected
    log = process.log()
    assert f"memory index file {index_file} is corrupt (its checksum is " in log
    assert "memory index rebuilt: 4 vectors" in log


def test_max_db_bytes_counts_the_wal(daemon_root: Path) -> None:
    cap = 2 * 1024 * 1024
    process = DaemonProcess(daemon_root, ["--max-db-bytes", str(cap)])
    database = process.data_dir / "ctxd.db"
    with process.running(), process.client() as client:
        client.call("session.open", {"session_id": "s", "budget": {
            "context_window": 10_000_000}})
        batch = [{"role": "user", "content": hello_text(1000) + f" {i}"} for i in range(8)]
        failure = None
        for _ in range(100):
            sizes = (database.stat().st_size, Path(f"{database}-wal").stat().st_size)
            try:
                client.call("message.append", {"session_id": "s", "messages": batch})
            except RpcError as error:
                failure = error
                break
        assert failure is not None, "the store never filled up"
        assert failure.code == -32008
        # Refused while the file alone was below the cap, once the file and its WAL
        # reached it (passed by at most the last accepted write's pages in the WAL; counted
        # without the WAL, the refusal came with both at 1.4 times the cap).
        assert sizes[0] < cap
        total = database.stat().st_size + Path(f"{database}-wal").stat().st_size
        assert total <= cap + len(batch) * 6 * 1024, total
        assert client.call("daemon.ping")["pong"] is True


def ctxctl(socket: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ctxclient.cli", "--socket", str(socket),
                           *args], capture_output=True, text=True, timeout=120, check=False,
                          cwd=Path(__file__).resolve().parents[2])


def test_doctor_asks_the_running_daemon(copied: DaemonProcess) -> None:
    database = copied.data_dir / "ctxd.db"
    with copied.running():
        with copied.client() as client:
            gateway = doctor_gateway_lines(client)
        sound = ctxctl(copied.socket, "doctor")
        assert (sound.returncode, sound.stderr) == (0, NO_PROVIDER_NOTE)
        assert re.fullmatch(rf"{re.escape(str(database))}: ok \(integrity_check, "
                            rf"\d+\.\d\d s\)\n{re.escape(chr(10).join(gateway))}\n",
                            sound.stdout), sound.stdout
        zero_page(database, page_of(database, "messages"))
        corrupt = ctxctl(copied.socket, "doctor")
        assert corrupt.returncode == 1
        lines = corrupt.stdout.splitlines()
        found, gateway_found = lines[:-len(gateway)], lines[-len(gateway):]
        assert gateway_found == gateway
        assert found
        assert all(line.startswith(f"{database}: ") for line in found)
        assert corrupt.stderr == (f"ctxctl: the database {database} is corrupt; stop ctxd "
                                  "and run `ctxd --recover`\n") + NO_PROVIDER_NOTE
        as_json = json.loads(ctxctl(copied.socket, "doctor", "--json").stdout)
        assert (as_json["database"], as_json["ok"], as_json["problems"]) == (
            str(database), False, [line.split(": ", 1)[1] for line in found])


def test_doctor_without_a_daemon_points_to_ctxd_check(daemon_root: Path) -> None:
    result = ctxctl(daemon_root / "none.sock", "doctor")
    assert result.returncode == 2
    assert result.stderr.startswith(
        "ctxctl: doctor asks the running daemon; start it (`ctxd`, or `systemctl --user start "
        "ctxd.socket` with the units), or check its files with `ctxd --check`\n")


def test_an_unclean_shutdown_is_known_by_its_wal(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root)
    database = process.data_dir / "ctxd.db"
    with process.running():
        pass
    assert not Path(f"{database}-wal").exists()  # a clean stop removes it
    process.start()
    process.kill()
    assert Path(f"{database}-wal").exists()
    with process.running():
        pass
    checks = [line.split(" ", 2)[2] for line in process.log().splitlines()
              if "database checked" in line]
    assert [check.split(": ok in ")[0] for check in checks] == [
        "INFO ctxd.store: database checked (quick_check)",
        "INFO ctxd.store: database checked (quick_check)",
        "INFO ctxd.store: database checked (quick_check, after an unclean shutdown)"]


def test_a_database_that_cannot_be_opened_is_one_line(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root)
    database = process.data_dir / "ctxd.db"
    process.data_dir.mkdir(mode=0o700)
    database.mkdir()  # what no permission bits can make writable, even for root
    result = run_ctxd(process)
    lines = result.stderr.splitlines()
    assert (result.returncode, result.stdout, len(lines)) == (1, "", 1), result.stderr
    assert lines[0].split(" ", 2)[2] == (
        f"CRITICAL ctxd: cannot open the database {database} for writing (unable to open "
        "database file); ctxd needs a data directory it can write (check its permissions, "
        "and that its file system is not mounted read-only), or choose another --data-dir")


def read_only_mount_works(folder: Path) -> bool:
    """Whether a read-only bind mount can be made in a mount namespace of its own (root,
    and util-linux's unshare)."""
    try:
        probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind {folder} "
                                f"{folder} && mount -o remount,bind,ro {folder}"],
                               capture_output=True, timeout=30, check=False)
    except FileNotFoundError:
        return False
    return probe.returncode == 0


def test_a_read_only_file_system_is_one_line(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root)
    process.data_dir.mkdir(mode=0o700)
    if not read_only_mount_works(process.data_dir):
        pytest.skip("a read-only bind mount needs root and unshare -m (mount namespaces)")
    data = shlex.quote(str(process.data_dir))
    command = shlex.join(process.command())
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount --bind {data} {data} && "
         f"mount -o remount,bind,ro {data} && exec {command}"],
        capture_output=True, text=True, timeout=120, env=process.environment(), check=False,
        cwd=Path(__file__).resolve().parents[2])
    lock = process.data_dir / "ctxd.lock"
    assert (result.returncode, result.stdout, result.stderr) == (1, "", (
        f"ctxd: cannot open the lock file {lock} (Read-only file system); ctxd needs to "
        f"write in {process.data_dir}: check its permissions and that its file system is "
        "not mounted read-only, or choose another --socket/--data-dir\n"))
