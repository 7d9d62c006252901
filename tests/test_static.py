"""ruff over the tree and mypy --strict over ctxd/ run with the test suite."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)


def test_ruff() -> None:
    result = run("ruff", "check", "ctxd", "clients", "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = run("mypy", "--strict", "ctxd", "clients/ctxclient")
    assert result.returncode == 0, result.stdout + result.stderr
