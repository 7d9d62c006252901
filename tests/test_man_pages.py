"""man/: the pages render without warnings and document every flag, key and command."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ctxclient.cli import parser as ctxctl_parser
from ctxd import __version__
from ctxd.config import BudgetDefaults, Config, to_toml
from ctxd.daemon import parser as ctxd_parser

MAN = Path(__file__).resolve().parents[1] / "man"
PAGES = ["ctxd.1", "ctxctl.1", "ctxd.toml.5"]
SCRIPT = Path(__file__).resolve().parents[1] / "clients" / "shell" / "ctxd-call"


def source(page: str) -> str:
    return (MAN / page).read_text(encoding="utf-8")


def roff(text: str) -> str:
    """How ``text`` is written in the pages' source (a dash is ``\\-``)."""
    return text.replace("-", "\\-")


def render(page: str) -> subprocess.CompletedProcess[str]:
    # -ww: every warning; ascii without overstriking, long lines, so text can be searched.
    return subprocess.run(
        ["groff", "-man", "-Tascii", "-P-cbou", "-rLL=200n", "-ww", str(MAN / page)],
        capture_output=True, text=True, timeout=60, check=False)


needs_groff = pytest.mark.skipif(
    shutil.which("groff") is None, reason="groff is not installed (apt-get install groff-base)")


@needs_groff
@pytest.mark.parametrize("page", PAGES)
def test_renders_without_warnings(page: str) -> None:
    proc = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(MAN / page)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stderr) == (0, "")
    rendered = render(page)
    assert (rendered.returncode, rendered.stderr) == (0, "")


@pytest.mark.parametrize("page", PAGES)
def test_header_names_the_page_and_version(page: str) -> None:
    name, section = page.rsplit(".", 1)
    first = source(page).splitlines()[0]
    assert first.startswith(f'.TH {name.upper()} {section} "')
    assert f'"ctxd {__version__}"' in first


def long_options(parser: argparse.ArgumentParser) -> list[str]:
    return [option for action in parser._actions for option in action.option_strings
            if option.startswith("--")]


def test_ctxd_page_documents_every_flag() -> None:
    text = source("ctxd.1")
    assert [flag for flag in long_options(ctxd_parser()) if roff(flag) not in text] == []


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [commands] = [action for action in parser._actions
                  if isinstance(action, argparse._SubParsersAction)]
    return dict(commands.choices)


def test_ctxctl_page_documents_every_command_and_option() -> None:
    text = source("ctxctl.1")
    cli = ctxctl_parser()
    missing = [flag for flag in long_options(cli) if roff(flag) not in text]
    for name, command in subcommands(cli).items():
        if not re.search(rf"^\.BI? {name}\b", text, re.MULTILINE):
            missing.append(name)
        missing += [f"{name} {flag}" for flag in long_options(command) if roff(flag) not in text]
    assert missing == []


@needs_groff
def test_ctxctl_page_shows_the_shell_clients_usage() -> None:
    usage = subprocess.run([str(SCRIPT), "-h"], capture_output=True, text=True, timeout=60,
                           check=True).stdout.splitlines()[0]
    assert usage.startswith("usage: ")
    assert usage.removeprefix("usage: ") in render("ctxctl.1").stdout


KIND = {int: "integer", float: "float", bool: "boolean", str: "string"}
RATIOS = {"compact_trigger", "hard_block", "warn", "caution"}


def key_lines() -> dict[str, str]:
    """Each documented key's heading line: ``.BR key " (type, default …)"``."""
    lines = {}
    for line in source("ctxd.toml.5").splitlines():
        found = re.match(r'\.BR ([a-z_]+) " \((.*)', line)
        if found:
            lines[found[1]] = found[2]
    return lines


def test_toml_page_documents_every_key_with_its_default() -> None:
    documented = key_lines()
    literals = dict(line.split(" = ", 1) for line in to_toml(Config()).splitlines()
                    if " = " in line)
    expected_keys = [*Config.__struct_fields__, *BudgetDefaults.__struct_fields__]
    expected_keys.remove("budget")
    assert sorted(documented) == sorted(expected_keys)
    wrong = []
    for key, heading in documented.items():
        value = getattr(Config(), key) if key in Config.__struct_fields__ else getattr(
            BudgetDefaults(), key)
        kind = "ratio" if key in RATIOS else KIND[type(value)]
        if key in ("socket", "data_dir"):
            continue  # resolved from the environment; the page says how
        if isinstance(value, str):
            default = f'default " \\(dq{value}\\(dq )'
        else:
            default = f"default {literals[key]})\""
        if not heading.startswith(f"{kind}, {default}"):
            wrong.append((key, heading, f"{kind}, {default}"))
    assert wrong == []
