"""Configuration sources, precedence, unknown keys, --print-config."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ctxd import config
from ctxd.errors import CtxdError


def _flags(*argv: str) -> object:
    import argparse

    parser = argparse.ArgumentParser()
    config.add_flags(parser)
    return parser.parse_args(list(argv))


def test_defaults(tmp_path: Path) -> None:
    cfg = config.load(environ={"HOME": str(tmp_path)}, config_path=tmp_path / "none.toml")
    assert cfg.max_request_bytes == 16 * 1024 * 1024
    assert cfg.max_connections == 256
    assert cfg.session_idle_s == 600.0
    assert cfg.budget.context_window == 200_000
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


def test_unknown_nested_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[budget]\nwarnn = 0.5\n")
    with pytest.raises(CtxdError, match=r"warnn.*\$\.budget"):
        config.load(environ={"HOME": str(tmp_path)}, config_path=path)


def test_unknown_env_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(CtxdError, match="CTXD_SESION_IDLE_S"):
        config.load(environ={"HOME": str(tmp_path), "CTXD_SESION_IDLE_S": "1"},
                    config_path=tmp_path / "none.toml")


def test_bad_value_type_is_named(tmp_path: Path) -> None:
    with pytest.raises(CtxdError, match="max_connections"):
        config.load(environ={"HOME": str(tmp_path), "CTXD_MAX_CONNECTIONS": "many"},
                    config_path=tmp_path / "none.toml")


def _run_ctxd(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
               "PATH": "/usr/bin:/bin", **env}
    return subprocess.run([sys.executable, "-m", "ctxd", *args], capture_output=True,
                          text=True, env=environ, timeout=60, check=False)


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


@pytest.mark.parametrize(("env", "named"), [
    ({"CTXD_MAX_CONNECTIONS": "0"}, "max_connections"),
    ({"CTXD_BUDGET_WARN": "5"}, "budget.warn"),
    ({"CTXD_SESSION_IDLE_S": "-1"}, "session_idle_s"),
    ({"CTXD_BUDGET_WARN": "0.9", "CTXD_BUDGET_CAUTION": "0.8"}, "warn (0.9) must not exceed"),
    ({"CTXD_ENCODING": "nope"}, "unknown encoding 'nope'"),
])
def test_out_of_range_values_are_named(tmp_path: Path, env: dict[str, str], named: str) -> None:
    with pytest.raises(CtxdError, match=named.replace("(", r"\(").replace(")", r"\)")):
        config.load(environ={"HOME": str(tmp_path), **env}, config_path=tmp_path / "none.toml")


def test_the_shell_clients_variable_is_not_a_daemon_key(tmp_path: Path) -> None:
    cfg = config.load(environ={"HOME": str(tmp_path), "CTXD_CALL_TRANSPORT": "python"},
                      config_path=tmp_path / "none.toml")
    assert cfg.max_connections == 256


def test_a_bad_encoding_is_a_clean_start_up_error(tmp_path: Path) -> None:
    result = _run_ctxd(tmp_path, "--encoding", "nope")
    assert result.returncode == 2
    assert result.stderr.startswith("ctxd: configuration")
    assert "unknown encoding 'nope'" in result.stderr
    assert "Traceback" not in result.stderr
