"""man/: the pages render without warnings and document every flag, key and command."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from pathlib import Path

import pytest
from tests_support import installed_prefix, needs

from ctxclient.cli import parser as ctxctl_parser
from ctxd import __version__
from ctxd.config import TABLES, Config, TeamConfig, to_toml
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


needs_groff = needs("groff")


@needs_groff
@pytest.mark.parametrize("page", PAGES)
def test_renders_without_warnings(page: str) -> None:
    proc = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(MAN / page)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stderr) == (0, "")
    rendered = render(page)
    assert (rendered.returncode, rendered.stderr) == (0, "")


QUOTED_OUTPUT = {"ctxd.1": ["ctxd: --log-level: invalid choice 'loud' (choose from debug, "
                             "info, warning, error)"]}
"""Lines a page quotes as a program prints them, one line however wide."""


@needs_groff
@pytest.mark.parametrize("page", PAGES)
def test_a_terminal_of_80_columns_shows_every_line_whole(page: str) -> None:
    """Synopses and examples are broken by hand (groff cannot break them); the rest it
    fills."""
    proc = subprocess.run(["groff", "-man", "-Tascii", "-P-cbou", "-rLL=78n", str(MAN / page)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0
    wide = [line.strip() for line in proc.stdout.splitlines() if len(line) > 80]
    assert wide == QUOTED_OUTPUT.get(page, [])


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
    """Every command, ``memory show`` as well as ``memory``."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                found[name] = command
                found.update({f"{name} {sub}": subcommand
                              for sub, subcommand in subcommands(command).items()})
    return found


def test_ctxctl_page_documents_every_command_and_option() -> None:
    text = source("ctxctl.1")
    cli = ctxctl_parser()
    commands = subcommands(cli)
    assert len(commands) == 43
    missing = [flag for flag in long_options(cli) if roff(flag) not in text]
    for name, command in commands.items():
        # An entry of its own: `.B events`, `.BI branches " SESSION"`, `.BI "memory show " ID`.
        if not re.search(rf'^\.B[IR]? "?{re.escape(roff(name))}\b', text, re.MULTILINE):
            missing.append(name)
        missing += [f"{name} {flag}" for flag in long_options(command) if roff(flag) not in text]
    assert missing == []


@needs_groff
def test_ctxctl_page_shows_the_shell_clients_usage() -> None:
    usage = subprocess.run([str(SCRIPT), "-h"], capture_output=True, text=True, timeout=60,
                           check=True).stdout.splitlines()[0]
    assert usage.startswith("usage: ")
    assert usage.removeprefix("usage: ") in render("ctxctl.1").stdout


KIND = {int: "integer", float: "float", bool: "boolean", str: "string", dict: "table",
        TeamConfig: "table"}
RATIOS = {("budget", "compact_trigger"), ("budget", "hard_block"), ("budget", "warn"),
          ("budget", "caution")}


def key_lines() -> dict[tuple[str | None, str], str]:
    """Each documented key's heading line, by (table, key): ``.BR key " (type, default …)"``.

    A key belongs to the table of the ``.SS "[table]"`` it follows, or to no table (None)
    when no subsection opened since the last ``.SH``; any other subsection counts as a
    table of its own name, so a key under it is reported as unexpected.
    """
    lines: dict[tuple[str | None, str], str] = {}
    table: str | None = None
    for line in source("ctxd.toml.5").splitlines():
        if line.startswith(".SH "):
            table = None
        elif line.startswith(".SS "):
            heading = re.fullmatch(r'\.SS "\[([a-z_]+)\]"', line)
            table = heading[1] if heading else line
        found = re.match(r'\.BR ([a-z_]+) " \((.*)', line)
        if found:
            assert (table, found[1]) not in lines, f"documented twice: {table}.{found[1]}"
            lines[table, found[1]] = found[2]
    return lines


def toml_literals() -> dict[tuple[str | None, str], str]:
    """The default of every key as ``ctxd --print-config`` writes it, by (table, key)."""
    literals: dict[tuple[str | None, str], str] = {}
    table: str | None = None
    for line in to_toml(Config()).splitlines():
        heading = re.fullmatch(r"\[([a-z_]+)\]", line)
        if heading:
            table = heading[1]
        elif " = " in line:
            key, value = line.split(" = ", 1)
            literals[table, key] = value
    return literals


def defaults() -> dict[tuple[str | None, str], object]:
    """Every configuration key's default value, by (table, key)."""
    config = Config()
    values: dict[tuple[str | None, str], object] = {
        (None, key): getattr(config, key) for key in Config.__struct_fields__
        if key not in TABLES}
    for table, struct in TABLES.items():
        values.update({(table, key): getattr(getattr(config, table), key)
                       for key in struct.__struct_fields__})
    return values


def test_every_table_is_a_config_field() -> None:
    assert [table for table in TABLES if table not in Config.__struct_fields__] == []
    assert {table: type(getattr(Config(), table)) for table in TABLES} == TABLES


def test_toml_page_documents_every_key_with_its_default() -> None:
    documented = key_lines()
    values = defaults()
    literals = toml_literals()
    assert sorted(documented, key=str) == sorted(values, key=str)
    wrong = []
    for (table, key), heading in documented.items():
        value = values[table, key]
        kind = "ratio" if (table, key) in RATIOS else KIND[type(value)]
        if (table, key) in ((None, "socket"), (None, "data_dir")):
            continue  # resolved from the environment; the page says how
        if isinstance(value, str):
            # A value with spaces is one quoted roff argument (so that it may break).
            default = (f'default " "\\(dq{value}\\(dq )"' if " " in value
                       else f'default " \\(dq{value}\\(dq )')
        else:
            # An inline table's strings: roff's \(dq for their quotes.
            default = f"default {literals[table, key].replace(chr(34), chr(92) + '(dq')})\""
        if not heading.startswith(f"{kind}, {default}"):
            wrong.append((table, key, heading, f"{kind}, {default}"))
    assert wrong == []


@needs("man")
def test_the_wheel_installs_the_pages_where_man_finds_them() -> None:
    prefix = installed_prefix()
    installed = [prefix / "share" / "man" / f"man{page.rsplit('.', 1)[1]}" / page
                 for page in PAGES]
    for page, path in zip(PAGES, installed, strict=True):
        assert path.read_bytes() == source(page).encode()
    # No MANPATH: man derives share/man from each bin/ on PATH, as it does for an
    # activated virtualenv, ~/.local (pip install --user) or a pipx environment.
    env = {key: value for key, value in os.environ.items() if key != "MANPATH"}
    env["PATH"] = f"{prefix / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    found = subprocess.run(["man", "-w", "ctxd", "ctxctl", "ctxd.toml"], env=env,
                           capture_output=True, text=True, timeout=60, check=False)
    assert (found.returncode, found.stdout.split()) == (0, [str(path) for path in installed])
