"""Configuration sources, precedence, unknown keys, --print-config."""

import contextlib
import io
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from ctxd import config
from ctxd.daemon import main
from ctxd.errors import CtxdError


def _flags(*argv: str) -> object:
    import argparse

    parser = argparse.ArgumentParser()
    config.add_flags(parser)
    return parser.parse_args(list(argv))


def _load(tmp_path: Path, **env: str) -> config.Config:
    """The configuration with no file at the default path and ``env`` as the environment."""
    return config.load(environ={"HOME": str(tmp_path), **env})


def test_defaults(tmp_path: Path) -> None:
    cfg = _load(tmp_path)
    assert cfg.max_request_bytes == 16 * 1024 * 1024
    assert cfg.max_connections == 256
    assert cfg.session_idle_s == 600.0
    assert cfg.budget.context_window == 200_000
    assert cfg.hygiene.tool_deferral_threshold == 0.10
    assert cfg.data_dir == str(tmp_path / ".local" / "share" / "ctxd")


def test_file_then_env_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('max_connections = 10\nsession_idle_s = 5\n[budget]\nwarn = 0.5\n')
    env = {"HOME": str(tmp_path), "CTXD_SESSION_IDLE_S": "7", "CTXD_BUDGET_CAUTION": "0.6"}
    cfg = config.load(_flags("--budget-caution", "0.65"), environ=env,  # type: ignore[arg-type]
                      config_path=path)
    assert (cfg.max_connections, cfg.session_idle_s) == (10, 7.0)
    assert (cfg.budget.warn, cfg.budget.caution) == (0.5, 0.65)


def test_unknown_file_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("max_conections = 10\n")
    with pytest.raises(CtxdError, match="max_conections"):
        config.load(environ={"HOME": str(tmp_path)}, config_path=path)


def test_unknown_nested_key_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("log_level = 'debug'\n\n[budget]\nwarnn = 0.5\n")
    with pytest.raises(CtxdError) as caught:
        config.load(environ={"HOME": str(tmp_path)}, config_path=path)
    assert caught.value.message == (f"{path}:4: budget.warnn: unknown key in [budget]; "
                                    "did you mean warn?")


def test_unknown_env_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(CtxdError) as caught:
        _load(tmp_path, CTXD_SESION_IDLE_S="1")
    assert caught.value.message == (
        "CTXD_SESION_IDLE_S: unknown environment variable: ctxd has no such setting; did you "
        "mean CTXD_SESSION_IDLE_S? (`ctxd --print-config` shows every key)")


def test_bad_value_type_is_named(tmp_path: Path) -> None:
    with pytest.raises(CtxdError) as caught:
        _load(tmp_path, CTXD_MAX_CONNECTIONS="many")
    assert caught.value.message == "CTXD_MAX_CONNECTIONS: expected an integer >= 1, got 'many'"


def _run_ctxd(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``ctxd ARGS`` with ``env`` (beside HOME and XDG_CONFIG_HOME) as its whole environment:
    its exit status, standard output and error. In this process (``ctxd.daemon.main``, what
    ``python -m ctxd`` runs): only for runs that end before the daemon serves (a refused
    configuration, ``--print-config``, ``--help``)."""
    environ = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
               "PATH": "/usr/bin:/bin", **env}
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        for key in list(os.environ):
            patch.delenv(key)
        for key, value in environ.items():
            patch.setenv(key, value)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit:  # argparse's --help and usage errors
                code = (0 if exit.code is None else exit.code if isinstance(exit.code, int)
                        else 1)
    return subprocess.CompletedProcess(["ctxd", *args], code, out.getvalue(), err.getvalue())


def test_print_config_is_valid_toml_of_the_effective_values(tmp_path: Path) -> None:
    result = _run_ctxd(tmp_path, "--print-config", "--max-connections", "12",
                       CTXD_BUDGET_WARN="0.6")
    assert result.returncode == 0, result.stderr
    printed = tomllib.loads(result.stdout)
    assert printed["max_connections"] == 12
    assert printed["budget"]["warn"] == 0.6
    assert printed["data_dir"] == str(tmp_path / ".local" / "share" / "ctxd")
    assert set(printed) == {*config.Config.__struct_fields__}


def test_daemon_refuses_to_start_with_an_unknown_key(tmp_path: Path) -> None:
    (tmp_path / "cfg" / "ctxd").mkdir(parents=True)
    (tmp_path / "cfg" / "ctxd" / "config.toml").write_text("sesion_idle_s = 3\n")
    result = _run_ctxd(tmp_path)
    assert result.returncode == 2
    assert "sesion_idle_s" in result.stderr


@pytest.mark.parametrize(("env", "message"), [
    ({"CTXD_MAX_CONNECTIONS": "0"}, "CTXD_MAX_CONNECTIONS: expected an integer >= 1, got '0'"),
    ({"CTXD_BUDGET_WARN": "5"},
     "CTXD_BUDGET_WARN: expected a number > 0.0 and <= 1.0, got '5'"),
    ({"CTXD_SESSION_IDLE_S": "-1"}, "CTXD_SESSION_IDLE_S: expected a number > 0, got '-1'"),
    ({"CTXD_BUDGET_WARN": "0.9", "CTXD_BUDGET_CAUTION": "0.8"},
     "CTXD_BUDGET_WARN: budget.warn (0.9) must not exceed budget.caution (0.8, from "
     "CTXD_BUDGET_CAUTION)"),
    ({"CTXD_BUDGET_MAX_OUTPUT_TOKENS": "300000"},
     "CTXD_BUDGET_MAX_OUTPUT_TOKENS: budget.max_output_tokens (300000) must be smaller than "
     "budget.context_window (200000, from the default)"),
    ({"CTXD_HYGIENE_OFFLOAD_THRESHOLD_BYTES": "255"},
     "CTXD_HYGIENE_OFFLOAD_THRESHOLD_BYTES: expected an integer from 256 to 1073741824, got '255'"),
    ({"CTXD_HYGIENE_TOOL_DEFERRAL_THRESHOLD": "0"},
     "CTXD_HYGIENE_TOOL_DEFERRAL_THRESHOLD: expected a number > 0.0 and <= 1.0, got '0'"),
    ({"CTXD_HYGIENE_TOOL_DEFERRAL_THRESHOLD": "1.5"},
     "CTXD_HYGIENE_TOOL_DEFERRAL_THRESHOLD: expected a number > 0.0 and <= 1.0, got '1.5'"),
    ({"CTXD_HYGIENE_COMPACT_TARGET": "0.99"},
     "CTXD_HYGIENE_COMPACT_TARGET: expected a number from 0.05 to 0.95, got '0.99'"),
    ({"CTXD_HYGIENE_SUMMARIZER": "command"},
     "CTXD_HYGIENE_SUMMARIZER: hygiene.summarizer = command needs "
     "hygiene.summarizer_command (the program to run)"),
    ({"CTXD_HYGIENE_SUMMARIZER": "command", "CTXD_HYGIENE_SUMMARIZER_COMMAND": "sum 'x"},
     "CTXD_HYGIENE_SUMMARIZER_COMMAND: cannot be split into a command line: No closing "
     "quotation"),
    ({"CTXD_HYGIENE_SUMMARIZER": "http", "CTXD_HYGIENE_SUMMARIZER_URL": "http://h/v1"},
     "CTXD_HYGIENE_SUMMARIZER: hygiene.summarizer = http needs hygiene.summarizer_url and "
     "hygiene.summarizer_model"),
    ({"CTXD_HYGIENE_CONTEXT_NOTE": "used {pct}"},
     "CTXD_HYGIENE_CONTEXT_NOTE: the only placeholder it may hold is {percent} "
     "(KeyError('pct')); write {{ and }} for literal braces"),
    ({"CTXD_LOG_LEVEL": "loud"},
     "CTXD_LOG_LEVEL: invalid choice 'loud' (choose from debug, info, warning, error)"),
])
def test_out_of_range_values_are_named(tmp_path: Path, env: dict[str, str],
                                       message: str) -> None:
    with pytest.raises(CtxdError) as caught:
        _load(tmp_path, **env)
    assert caught.value.message == message


def test_an_unknown_encoding_is_named_with_its_source(tmp_path: Path) -> None:
    with pytest.raises(CtxdError) as caught:
        _load(tmp_path, CTXD_ENCODING="nope")
    assert caught.value.message.startswith("CTXD_ENCODING: unknown encoding 'nope'; known: ")


def test_the_clients_variables_are_not_daemon_keys(tmp_path: Path) -> None:
    """A shell that configures its clients still starts ctxd (the plugin's time limit is
    documented in README), and what the variables say is not taken as a setting."""
    cfg = _load(tmp_path, CTXD_CALL_TRANSPORT="python", CTXD_PLUGIN_TIMEOUT_MS="5000")
    assert cfg == _load(tmp_path)


def test_every_ctxd_variable_a_client_reads_is_known_to_the_daemon() -> None:
    """Each CTXD_* name in the clients' code (Python, the OpenCode plugin, the shell client)
    is a daemon setting the client shares (CTXD_SOCKET) or one the daemon knows it must
    ignore: a new client variable cannot stop ctxd from starting."""
    clients = Path(__file__).resolve().parents[2] / "clients"
    read = {name for path in clients.rglob("*") if path.is_file()
            and path.suffix in (".py", ".js", "")
            for name in re.findall(r"\bCTXD_[A-Z_]*[A-Z]\b", path.read_text())}
    settings = {config.env_name(path) for path in config._keys()}
    assert {"CTXD_SOCKET", "CTXD_CALL_TRANSPORT", "CTXD_PLUGIN_TIMEOUT_MS"} <= read
    assert read - settings - config.NOT_DAEMON_KEYS == set()
    assert set(config.CLIENT_VARIABLES) & settings == set()


def test_ctxd_starts_with_a_client_variable_set(tmp_path: Path) -> None:
    shown = _run_ctxd(tmp_path, "--print-config", CTXD_PLUGIN_TIMEOUT_MS="5000",
                      CTXD_LOG_LEVEL="debug")
    assert (shown.returncode, shown.stderr) == (0, "")
    assert tomllib.loads(shown.stdout)["log_level"] == "debug"
    assert "5000" not in shown.stdout
    typo = _run_ctxd(tmp_path, "--print-config", CTXD_PLUGIN_TIMEOUT="5000")
    assert typo.returncode == 2
    assert typo.stderr.startswith("ctxd: CTXD_PLUGIN_TIMEOUT: unknown environment variable")


def test_a_bad_encoding_is_a_clean_start_up_error(tmp_path: Path) -> None:
    result = _run_ctxd(tmp_path, "--encoding", "nope")
    assert result.returncode == 2
    assert result.stderr.startswith("ctxd: --encoding: unknown encoding 'nope'; known: ")
    assert "unknown encoding 'nope'" in result.stderr
    assert "Traceback" not in result.stderr


def test_help_shows_every_key_and_a_default_with_a_percent_sign(tmp_path: Path) -> None:
    result = _run_ctxd(tmp_path, "--help")
    assert (result.returncode, result.stderr) == (0, "")
    flags = {line.split()[0] for line in result.stdout.splitlines()
             if line.startswith("  --")}
    assert {config.flag_name(path) for path in config._keys()} <= flags
    note = " ".join(result.stdout.rpartition("--hygiene-context-note TEXT")[2].split())
    assert note.startswith("note ctxd.render adds above budget.warn; {percent} is the usage "
                           "(empty: no note); text; default [Context: {percent}% used. Call "
                           "compact_context to free space before large operations.]")


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--max-connections", "lots"], {}, "--max-connections: expected an integer >= 1, got 'lots'"),
    (["--log-level", "loud"], {},
     "--log-level: invalid choice 'loud' (choose from debug, info, warning, error)"),
    (["--allow-root", "yes"], {}, "--allow-root: expected true or false, got 'yes'"),
    (["--budget-caution", "0.5"], {"CTXD_BUDGET_WARN": "0.6"},
     "CTXD_BUDGET_WARN: budget.warn (0.6) must not exceed budget.caution (0.5, from "
     "--budget-caution)"),
    ([], {"CTXD_MAX_CONNECTIONS": "lots"},
     "CTXD_MAX_CONNECTIONS: expected an integer >= 1, got 'lots'"),
], ids=["int", "choice", "bool", "order", "env"])
def test_the_daemon_names_the_flag_or_variable_of_a_bad_value(
        tmp_path: Path, args: list[str], env: dict[str, str], message: str) -> None:
    result = _run_ctxd(tmp_path, *args, "--print-config", **env)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"ctxd: {message}\n")


@pytest.mark.parametrize(("text", "message"), [
    ("# limits\nmax_connections = 'lots'\n", "{path}:2: max_connections: expected an integer "
                                              ">= 1, got 'lots'"),
    ("[memory]\nembedder = 'openai'\n", "{path}:2: memory.embedder: invalid choice 'openai' "
                                        "(choose from hashing, sentence-transformers, http)"),
    ("budget.warn = 2\n", "{path}:1: budget.warn: expected a number > 0.0 and <= 1.0, got '2'"),
    ("max_conections = 10\n", "{path}:1: max_conections: unknown key; did you mean "
                              "max_connections? (`ctxd --print-config` shows every key)"),
    ("budget = 3\n", "{path}:1: budget: expected a table [budget], got 3"),
    ("log_level = \n", "{path}: Invalid value (at line 1, column 13)"),
], ids=["int", "choice", "dotted", "unknown", "table", "syntax"])
def test_a_bad_file_value_is_named_with_its_file_and_line(tmp_path: Path, text: str,
                                                          message: str) -> None:
    path = tmp_path / "cfg" / "ctxd" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    result = _run_ctxd(tmp_path, "--print-config")
    assert (result.returncode, result.stderr) == (2, f"ctxd: {message.format(path=path)}\n")


def test_an_explicit_config_file_must_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent.toml"
    by_flag = _run_ctxd(tmp_path, "--config", str(missing), "--print-config")
    assert (by_flag.returncode, by_flag.stdout, by_flag.stderr) == (
        2, "", f"ctxd: --config: configuration file {missing} does not exist\n")
    by_env = _run_ctxd(tmp_path, "--print-config", CTXD_CONFIG=str(missing))
    assert (by_env.returncode, by_env.stderr) == (
        2, f"ctxd: CTXD_CONFIG: configuration file {missing} does not exist\n")
    # The default path ($XDG_CONFIG_HOME/ctxd/config.toml) may be missing.
    assert _run_ctxd(tmp_path, "--print-config").returncode == 0
    present = tmp_path / "present.toml"
    present.write_text("max_connections = 9\n")
    shown = _run_ctxd(tmp_path, "--print-config", CTXD_CONFIG=str(present))
    assert tomllib.loads(shown.stdout)["max_connections"] == 9


def test_help_shows_each_keys_type_default_and_choices() -> None:
    from ctxd.daemon import parser

    helps = {action.option_strings[0]: (action.metavar, action.help)
             for action in parser()._actions if action.option_strings}
    assert helps["--log-level"] == ("{debug,info,warning,error}",
                                    "choices: debug, info, warning, error; default info")
    assert helps["--max-connections"] == ("N", "an integer >= 1; default 256")
    assert helps["--budget-warn"] == ("X", "a number > 0.0 and <= 1.0; default 0.7")
    assert helps["--max-branch-depth"] == (
        "N", "how deeply branches may nest; an integer from 1 to 16; default 3")
    assert helps["--allow-root"] == (
        "{true,false}", "accept connections from root as well as from the daemon's own user; "
                        "true or false; default false")
    assert helps["--encoding"] == ("TEXT", "text; default cl100k_base")
    # Every other key's flag says what it accepts and its default too.
    for path in config._keys():
        if path not in (("socket",), ("data_dir",)):
            accepts = "choices: " if config.choices(path) else config.describe(path)
            assert f"{accepts}" in helps[config.flag_name(path)][1], path
            assert "; default " in helps[config.flag_name(path)][1], path


def test_usage_prices_come_from_the_file_only(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[usage.prices."claude-sonnet-4"]\ninput = 3\noutput = 15.0\n'
                    '[usage.prices.small]\ncache_read = 0.01\n')
    cfg = config.load(environ={"HOME": str(tmp_path)}, config_path=path)
    assert cfg.usage.prices == {
        "claude-sonnet-4": config.ModelPrice(input=3.0, output=15.0),
        "small": config.ModelPrice(cache_read=0.01)}
    assert tomllib.loads(config.to_toml(cfg))["usage"] == {"prices": {
        "claude-sonnet-4": {"input": 3.0, "output": 15.0, "cache_read": 0.0,
                            "cache_write": 0.0, "thinking": 0.0},
        "small": {"input": 0.0, "output": 0.0, "cache_read": 0.01, "cache_write": 0.0,
                  "thinking": 0.0}}}
    with pytest.raises(CtxdError, match="unknown environment variable"):
        config.load(environ={"HOME": str(tmp_path), "CTXD_USAGE_PRICES": "{}"})
    with pytest.raises(SystemExit):
        _flags("--usage-prices", "{}")


@pytest.mark.parametrize(("text", "problem"), [
    ('[usage.prices.m]\ninptu = 1.0\n', "Object contains unknown field `inptu` - in "
                                        "`usage.prices.m`"),
    ('[usage.prices."a.b"]\ninput = -1.0\n', 'Expected `float` >= 0.0 - at '
                                             '`usage.prices."a.b".input`')])
def test_a_bad_price_is_named(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(CtxdError) as caught:
        config.load(environ={"HOME": str(tmp_path)}, config_path=path)
    assert caught.value.message == f"{path}: usage.prices: {problem}"
