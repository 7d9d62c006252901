"""Configuration: TOML file, then ``CTXD_*`` environment variables, then flags (DESIGN §12).

Every key is optional. An unknown key in any of the three sources stops start-up with
the key's name, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import argparse
import itertools
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import tiktoken
from msgspec import Meta

from ctxd.errors import CtxdError, ErrorCode
from ctxd.paths import default_config_path, default_data_dir, default_socket_path

Ratio = Annotated[float, Meta(gt=0.0, le=1.0)]
Positive = Annotated[int, Meta(ge=1)]
NonNegative = Annotated[int, Meta(ge=0)]
THRESHOLD_ORDER = ("warn", "caution", "compact_trigger", "hard_block")


def threshold_order_error(budget: Any) -> str | None:
    """Why a budget's thresholds are out of order (warn ≤ caution ≤ compact ≤ hard block)."""
    for lower, higher in itertools.pairwise(THRESHOLD_ORDER):
        if getattr(budget, lower) > getattr(budget, higher):
            return (f"{lower} ({getattr(budget, lower)}) must not exceed "
                    f"{higher} ({getattr(budget, higher)})")
    if budget.max_output_tokens >= budget.context_window:
        return (f"max_output_tokens ({budget.max_output_tokens}) must be smaller than "
                f"context_window ({budget.context_window})")
    return None


class BudgetDefaults(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The budget a session gets when `session.open` does not pass one."""

    context_window: Annotated[int, Meta(ge=1024)] = 200_000
    max_output_tokens: NonNegative = 8_192
    compact_trigger: Ratio = 0.95
    hard_block: Ratio = 0.98
    warn: Ratio = 0.70
    caution: Ratio = 0.80


class MemoryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``[memory]`` table: the embedder and retrieval of memory items (DESIGN §9)."""

    embedder: Literal["hashing", "sentence-transformers", "http"] = "hashing"
    model_path: str = ""
    embedding_url: str = ""
    embedding_model: str = ""
    api_key_env: str = ""
    hash_dim: Annotated[int, Meta(ge=64, le=65_536)] = 1_024
    rrf_k: Annotated[int, Meta(ge=1, le=1_000)] = 10
    lexical_weight: Annotated[float, Meta(ge=0.0, le=10.0)] = 1.0
    dense_weight: Annotated[float, Meta(ge=0.0, le=10.0)] = 0.25
    dense_min_score: Annotated[float, Meta(ge=-1.0, le=1.0)] = 0.2
    ann_threshold: Positive = 10_000
    nprobe: Annotated[int, Meta(ge=1, le=4_096)] = 64


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The daemon's effective configuration."""

    socket: str = ""
    data_dir: str = ""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    durability: Literal["normal", "full"] = "normal"
    encoding: str = "cl100k_base"
    max_request_bytes: Annotated[int, Meta(ge=1024)] = 16 * 1024 * 1024
    max_connections: Positive = 256
    max_inflight_per_connection: Positive = 64
    max_open_sessions: Positive = 100_000
    max_db_bytes: NonNegative = 0
    session_idle_s: Annotated[float, Meta(gt=0)] = 600.0
    session_ttl_h: Annotated[float, Meta(ge=0)] = 24.0
    shutdown_timeout_s: Annotated[float, Meta(ge=0)] = 10.0
    allow_root: bool = False
    max_subscriptions_per_connection: Positive = 16
    event_buffer: Positive = 1024
    event_history: Positive = 10_000
    branch_budget: Annotated[int, Meta(ge=1, le=32_768)] = 8_192
    branch_timeout_s: Annotated[float, Meta(gt=0, le=600)] = 300.0
    max_branch_depth: Annotated[int, Meta(ge=1, le=16)] = 3
    max_live_branches_per_session: Positive = 10
    max_live_branches: Positive = 10_000
    budget: BudgetDefaults = BudgetDefaults()
    memory: MemoryConfig = MemoryConfig()


TABLES: dict[str, type[msgspec.Struct]] = {"budget": BudgetDefaults, "memory": MemoryConfig}
"""The TOML tables of the configuration, by name."""

_HELP = {
    "socket": "Unix socket path "
              "(default $XDG_RUNTIME_DIR/ctxd/ctxd.sock or /tmp/ctxd-$UID/ctxd.sock)",
    "data_dir": "folder of the database (default $XDG_DATA_HOME/ctxd)",
    "durability": "normal = survives a daemon kill; full = survives power loss (fsync per commit)",
    "max_db_bytes": "cap on the database size; writes past it get -32008 (0 = no cap)",
    "session_ttl_h": "hours after close before a session is deleted (0 = keep)",
    "allow_root": "accept connections from root as well as from the daemon's own user",
    "branch_budget": "tokens a branch may add when branch.create gives no budget (max 32768)",
    "branch_timeout_s": "seconds a branch may run when branch.create gives no timeout (max 600)",
    "max_branch_depth": "how deeply branches may nest",
    "max_live_branches_per_session": "active branches one session may hold at once",
    "max_live_branches": "active branches the whole daemon may hold at once",
    "embedder": "how memories are embedded: hashing (built in, no model), "
                "sentence-transformers (model_path) or http (embedding_url)",
    "model_path": "folder of a local sentence-transformers model (empty: the all-MiniLM-L6-v2 "
                  "that the `semantic` extra installs)",
    "embedding_url": "base URL of an OpenAI-compatible API (…/v1) that serves /embeddings",
    "embedding_model": "the model name sent to embedding_url",
    "api_key_env": "name of the environment variable that holds the embedding API key",
    "dense_min_score": "cosine similarity below which the dense leg does not propose a memory",
}


def _keys() -> list[tuple[str, ...]]:
    """Every configurable key as a path: ("socket",), ("budget", "warn"), …"""
    paths: list[tuple[str, ...]] = []
    for name in Config.__struct_fields__:
        if name in TABLES:
            paths.extend((name, sub) for sub in TABLES[name].__struct_fields__)
        else:
            paths.append((name,))
    return paths


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    tree[path[-1]] = value


def _merge(base: dict[str, Any], override: dict[str, Any]) -> None:
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


NOT_DAEMON_KEYS = frozenset({"CTXD_CONFIG", "CTXD_CALL_TRANSPORT"})
"""CTXD_* variables that are not daemon settings: the config file's path, and the shell
client's transport (clients/shell/ctxd-call)."""


def _from_env(environ: dict[str, str]) -> dict[str, Any]:
    by_name = {"CTXD_" + "_".join(path).upper(): path for path in _keys()}
    tree: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith("CTXD_") or name in NOT_DAEMON_KEYS:
            continue
        path = by_name.get(name)
        if path is None:
            raise CtxdError(
                ErrorCode.INVALID_PARAMS,
                f"unknown environment variable {name}: ctxd has no such setting "
                "(see `ctxd --print-config` for the keys)",
            )
        _set(tree, path, value)
    return tree


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One `--key` flag per configuration key (`--budget-warn` for budget.warn)."""
    for path in _keys():
        flag = "--" + "-".join(path).replace("_", "-")
        parser.add_argument(flag, dest="cfg:" + ".".join(path), default=None,
                            help=_HELP.get(path[-1]), metavar="VALUE")


def load(flags: argparse.Namespace | None = None, environ: dict[str, str] | None = None,
         config_path: Path | None = None) -> Config:
    """Build the effective configuration.

    Args:
        flags: parsed command-line flags (from a parser set up by `add_flags`).
        environ: the environment (default: ``os.environ``).
        config_path: the TOML file (default: `default_config_path`); a missing file is fine.

    Returns:
        The configuration with `socket` and `data_dir` resolved to absolute paths.

    Raises:
        CtxdError: a key is unknown or a value has the wrong type; the message names it.
    """
    environ = dict(os.environ if environ is None else environ)
    path = config_path or default_config_path(environ)
    tree: dict[str, Any] = {}
    if path.exists():
        try:
            tree = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise CtxdError(ErrorCode.INVALID_PARAMS, f"{path}: {exc}") from None
    _merge(tree, _from_env(environ))
    if flags is not None:
        for dest, value in vars(flags).items():
            if dest.startswith("cfg:") and value is not None:
                _set(tree, tuple(dest[4:].split(".")), value)
    try:
        config = msgspec.convert(tree, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise CtxdError(ErrorCode.INVALID_PARAMS, f"configuration ({path}): {exc}") from None
    order = threshold_order_error(config.budget)
    if order:
        raise CtxdError(ErrorCode.INVALID_PARAMS, f"configuration ({path}): budget: {order}")
    known = set(tiktoken.list_encoding_names())
    if config.encoding not in known and config.encoding + "_offline" not in known:
        raise CtxdError(ErrorCode.INVALID_PARAMS,
                        f"configuration ({path}): unknown encoding {config.encoding!r}; "
                        f"known: {', '.join(sorted(known))}")
    socket = Path(config.socket) if config.socket else default_socket_path(environ)
    data_dir = Path(config.data_dir) if config.data_dir else default_data_dir(environ)
    return msgspec.structs.replace(
        config, socket=str(socket.absolute()), data_dir=str(data_dir.absolute())
    )


def to_toml(config: Config) -> str:
    """The configuration as a TOML document (what `ctxd --print-config` prints)."""

    def literal(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            return msgspec.json.encode(value).decode()
        return repr(value)

    lines = [f"{key} = {literal(getattr(config, key))}"
             for key in Config.__struct_fields__ if key not in TABLES]
    for table, struct in TABLES.items():
        lines += ["", f"[{table}]", *(f"{key} = {literal(getattr(getattr(config, table), key))}"
                                      for key in struct.__struct_fields__)]
    return "\n".join(lines) + "\n"


__all__ = ["TABLES", "BudgetDefaults", "Config", "MemoryConfig", "add_flags",
           "default_config_path", "default_data_dir", "default_socket_path", "load", "to_toml"]
