"""README.md: its two commands, and the tools beside Python that the tests need, named
where a new user reads them and installed by .ci/run."""

import re
from pathlib import Path

from tests_support import NPM_TOOLS, OPTIONAL_TOOLS, REPOSITORY

README = (REPOSITORY / "README.md").read_text(encoding="utf-8")
CI = (REPOSITORY / ".ci" / "run").read_text(encoding="utf-8")


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second() -> None:
    block = re.search(r"```sh\n(.*?)```", README, re.DOTALL)
    assert block is not None
    assert README.index(block.group(0)) < README.index("## ")
    assert block.group(1).splitlines() == [
        "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/ctxd",
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/pytest"]
    assert "grep -m 2 '^python3 -m venv' README.md | tail -n 1" in CI


def test_the_tools_the_tests_need_are_named_and_installed() -> None:
    install = re.search(r"`sudo apt-get install ([a-z0-9 -]+)`", README)
    assert install is not None
    assert sorted(install.group(1).split()) == sorted(OPTIONAL_TOOLS.values())
    for tool in OPTIONAL_TOOLS:
        assert f"`{tool}`" in README, tool
    assert sorted(re.findall(r"([a-z-]+):([a-z-]+)", CI.split("wanted=()")[1].split("; do")[0])
                  ) == sorted(OPTIONAL_TOOLS.items())


def test_the_npm_tools_the_tests_need_are_named_and_installed() -> None:
    for tool, package in NPM_TOOLS.items():
        assert f"`{tool}` (npm package `{package}`)" in README, tool
        assert f" {package}@" in CI, package
        assert f"command -v {tool} " in CI, tool


def test_every_tool_a_test_looks_for_is_an_optional_tool() -> None:
    named = {tool for path in Path(REPOSITORY / "tests").rglob("*.py")
             for tool in re.findall(r"(?:which|needs)\(\"([\w-]+)\"", path.read_text())}
    assert named == set(OPTIONAL_TOOLS)
    used = {tool for path in Path(REPOSITORY / "tests").rglob("*.py")
            for tool in re.findall(r"npm_tool\(\"([\w-]+)\"", path.read_text())}
    assert used == set(NPM_TOOLS)
