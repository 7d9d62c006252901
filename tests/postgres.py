"""A real PostgreSQL server for the tests, in a temporary folder: ``initdb`` and ``pg_ctl``
from the distribution's packages (Debian's ``postgresql``; .ci/run installs it), run as the
``postgres`` user when the tests run as root (initdb refuses root). Listening on a Unix
socket in that folder only. Tests that need it are skipped, with the reason, when the
binaries are absent."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
"""Debian installs each major version's server binaries there (not on PATH)."""


def binaries() -> Path | None:
    """The folder holding initdb and pg_ctl, or None."""
    for folder in [*BIN_DIRS, *(Path(p) for p in os.environ.get("PATH", "").split(":"))]:
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder
    return None


def _as_owner(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    if shutil.which("runuser") is None:
        pytest.skip("PostgreSQL refuses to run as root and runuser is missing")
    return ["runuser", "-u", "postgres", "--", *command]


class Postgres:
    """One server: `conninfo` for psycopg; `kill` (SIGKILL) and `start` again for the
    crash tests; `stop` at the end."""

    def __init__(self) -> None:
        folder = binaries()
        if folder is None:
            pytest.skip("PostgreSQL's server binaries (initdb, pg_ctl) are absent: apt-get "
                        "install postgresql (.ci/run does)")
        self.bin = folder
        self.root = Path(tempfile.mkdtemp(prefix="ctxd-pg-"))
        self.root.chmod(0o755)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        self.data = self.root / "data"
        subprocess.run(_as_owner([str(folder / "initdb"), "-D", str(self.data), "-A", "trust",
                                  "-U", "postgres", "--no-sync"]),
                       check=True, capture_output=True, timeout=120)
        self.port = 5432
        self._databases = itertools.count()
        self.start()

    @property
    def conninfo(self) -> str:
        return f"host={self.root} port={self.port} user=postgres dbname=postgres"

    def start(self) -> None:
        subprocess.run(_as_owner([
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
            "-w", "-o", f"-k {self.root} -p {self.port} -c listen_addresses='' "
                        "-c fsync=off -c synchronous_commit=on", "start"]),
            check=True, capture_output=True, timeout=120)

    def pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def kill(self) -> None:
        """SIGKILL the server (its children die with it): a crash, mid-transaction."""
        subprocess.run(_as_owner([str(self.bin / "pg_ctl"), "-D", str(self.data), "kill",
                                  "KILL", str(self.pid())]), check=True, capture_output=True)
        subprocess.run(_as_owner([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m",
                                  "immediate", "-w", "stop"]), capture_output=True)

    def database(self) -> str:
        """A new, empty database on this server: its conninfo."""
        name = f"db_{next(self._databases)}"
        with psycopg.connect(self.conninfo, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return self.conninfo.replace("dbname=postgres", f"dbname={name}")

    def stop(self) -> None:
        subprocess.run(_as_owner([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m",
                                  "immediate", "-w", "stop"]), capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)
