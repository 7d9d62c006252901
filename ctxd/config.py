"""Configuration: TOML file, then ``CTXD_*`` environment variables, then flags (see ctxd.toml(5)).

Every key is optional. An unknown key in any of the three sources stops start-up with
the key's name, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import ipaddress
import itertools
import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, get_args, get_origin

import msgspec
import tiktoken
from msgspec import Meta

from ctxd.errors import CtxdError, ErrorCode
from ctxd.paths import default_config_path, default_data_dir, default_socket_path
from ctxd.wire.types import BranchBudget, BranchTimeout, Budget

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


class TeamConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``[memory.team]`` table: the team whose memories this ctxd shares, and where
    the team database's URL is (an environment variable: the secret stays out of files)."""

    name: Annotated[str, Meta(pattern=r"^[^\s]{1,128}\Z")] = ""
    url_env: Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*\Z")] = (
        "TEAM_MEMORY_DATABASE_URL")
    poll_interval_s: Annotated[float, Meta(gt=0, le=3_600)] = 5.0
    share_identity: bool = True


class MemoryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``[memory]`` table: the embedder and retrieval of memory items."""

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
    hook_inject_tokens: Annotated[int, Meta(ge=1, le=100_000)] = 1_000
    inject_shared_words: Annotated[int, Meta(ge=0, le=10)] = 2
    team: TeamConfig = msgspec.field(default_factory=TeamConfig)


DEFAULT_CONTEXT_NOTE = ("[Context: {percent}% used. Call compact_context to free space "
                        "before large operations.]")


class HygieneConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``[hygiene]`` table: offload, the compaction chain and its summarizer, the
    context note, tool deferral (docs/protocol.md)."""

    offload_threshold_bytes: Annotated[int, Meta(ge=256, le=1 << 30)] = 4_096
    offload_inputs: bool = True
    keep_tool_results: Annotated[int, Meta(ge=0, le=1_000)] = 5
    clear_at_least: Annotated[int, Meta(ge=1_000, le=1_000_000)] = 20_000
    auto_compact: bool = True
    compact_target: Annotated[float, Meta(ge=0.05, le=0.95)] = 0.60
    summarizer: Literal["extractive", "command", "http"] = "extractive"
    summarizer_command: str = ""
    summarizer_url: str = ""
    summarizer_model: str = ""
    summarizer_api_key_env: str = ""
    summarizer_timeout_s: Annotated[float, Meta(gt=0, le=600)] = 30.0
    summary_max_tokens: Annotated[int, Meta(ge=64, le=32_768)] = 2_000
    context_note: str = DEFAULT_CONTEXT_NOTE
    tool_deferral_threshold: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.10


PerMillion = Annotated[float, Meta(ge=0.0, le=1_000_000.0)]


class ModelPrice(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One model's prices in ``[usage.prices."<model>"]``: per million tokens of each
    counter (docs/protocol.md, "Usage")."""

    input: PerMillion = 0.0
    output: PerMillion = 0.0
    cache_read: PerMillion = 0.0
    cache_write: PerMillion = 0.0
    thinking: PerMillion = 0.0


class UsageConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``[usage]`` table: the price table that turns usage totals into cost."""

    prices: dict[str, ModelPrice] = msgspec.field(default_factory=dict)


class GatewayConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``[gateway]`` table: the model gateway's address, upstreams and bounds
    (docs/security.md, "The model gateway")."""

    enabled: bool = True
    listen: str = "127.0.0.1:8788"
    anthropic_upstream: str = "https://api.anthropic.com"
    openai_upstream: str = "https://api.openai.com"
    max_body_bytes: Annotated[int, Meta(ge=1024, le=1 << 30)] = 64 * 1024 * 1024
    max_connections: Annotated[int, Meta(ge=1, le=65_536)] = 128
    max_upstream_calls: Annotated[int, Meta(ge=1, le=4_096)] = 64
    allow_non_loopback: bool = False


def listen_address(listen: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as a host IP literal and a port.

    Raises:
        ValueError: it is not an IP literal and a port from 0 to 65535.
    """
    host, colon, port = listen.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not port.isdigit() or int(port) > 65_535:
        raise ValueError(f"expected HOST:PORT with a port from 0 to 65535, got {listen!r}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"the host must be an IP address (127.0.0.1, [::1]), got "
                         f"{host!r}") from None
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether an IP literal is a loopback address."""
    return ipaddress.ip_address(host).is_loopback


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
    max_inflight_bytes: Annotated[int, Meta(ge=1024 * 1024)] = 256 * 1024 * 1024
    partial_line_timeout_s: Annotated[float, Meta(gt=0)] = 60.0
    idle_timeout_s: Annotated[float, Meta(ge=0)] = 0.0
    max_open_sessions: Positive = 100_000
    max_db_bytes: NonNegative = 0
    session_idle_s: Annotated[float, Meta(gt=0)] = 600.0
    session_ttl_h: Annotated[float, Meta(ge=0)] = 24.0
    shutdown_timeout_s: Annotated[float, Meta(ge=0)] = 10.0
    allow_root: bool = False
    scrub_at_rest: bool = False
    max_subscriptions_per_connection: Positive = 16
    event_buffer: Positive = 1024
    events_keep: Positive = 100_000
    events_retention_days: Annotated[float, Meta(gt=0)] = 7.0
    branch_budget: BranchBudget = 8_192
    branch_timeout_s: BranchTimeout = 300.0
    max_branch_depth: Annotated[int, Meta(ge=1, le=16)] = 3
    max_live_branches_per_session: Positive = 10
    max_live_branches: Positive = 10_000
    max_fold_tokens: Annotated[int, Meta(ge=16, le=32_768)] = 1_000
    inject_redeliver_s: Annotated[float, Meta(gt=0, le=86_400)] = 60.0
    cancel_timeout_s: Annotated[float, Meta(gt=0, le=3_600)] = 10.0
    budget: Budget = Budget()
    memory: MemoryConfig = MemoryConfig()
    hygiene: HygieneConfig = HygieneConfig()
    usage: UsageConfig = UsageConfig()
    gateway: GatewayConfig = GatewayConfig()


TABLES: dict[str, type[msgspec.Struct]] = {"budget": Budget, "memory": MemoryConfig,
                                           "hygiene": HygieneConfig, "usage": UsageConfig,
                                           "gateway": GatewayConfig}
"""The TOML tables of the configuration, by name."""

FILE_ONLY = frozenset({("usage", "prices"), ("memory", "team")})
"""Keys that only the file can set: a table of models has no flag or variable (its keys
are model names, unknown in advance)."""

_HELP = {
    "socket": "Unix socket path "
              "(default $XDG_RUNTIME_DIR/ctxd/ctxd.sock or /tmp/ctxd-$UID/ctxd.sock)",
    "data_dir": "folder of the database (default $XDG_DATA_HOME/ctxd)",
    "durability": "normal = survives a daemon kill; full = survives power loss (fsync per commit)",
    "max_db_bytes": "cap on the database size; writes past it get -32008 (0 = no cap)",
    "max_inflight_bytes": "bytes of requests and replies the daemon holds at once (partial "
                          "lines too); a request past it gets -32007",
    "partial_line_timeout_s": "seconds a connection may take to finish a line it began; "
                              "then it is closed",
    "idle_timeout_s": "seconds a connection may sit idle (nothing asked, no subscription) "
                      "before it is closed (0 = never)",
    "session_ttl_h": "hours after close before a session is deleted (0 = keep)",
    "allow_root": "accept connections from root as well as from the daemon's own user",
    "scrub_at_rest": "also scrub secrets from a session's own messages before they are "
                     "stored (what leaves a session is always scrubbed)",
    "branch_budget": "tokens a branch may add when branch.create gives no budget",
    "branch_timeout_s": "seconds a branch may run when branch.create gives no timeout",
    "max_branch_depth": "how deeply branches may nest",
    "max_live_branches_per_session": "active branches one session may hold at once",
    "max_live_branches": "active branches the whole daemon may hold at once",
    "max_fold_tokens": "tokens a fold message may take in its parent (never more than a "
                       "quarter of the branch's budget); a longer result is cut, head and "
                       "tail kept",
    "inject_redeliver_s": "seconds an injection handed out by inject.pull may wait for its "
                          "inject.ack; then the next inject.pull hands it out again",
    "cancel_timeout_s": "seconds an agent has to answer turn.cancel with turn.end; then "
                        "ctxd ends the turn itself (terminated), stops the session's model "
                        "calls in flight and logs it",
    "offload_threshold_bytes": "a tool result longer than this (UTF-8 bytes) is stored aside "
                               "and rendered as a stub that result.read reads back",
    "offload_inputs": "the gateway stores the long arguments (1 KiB or more, not a command "
                      "or a path) of a call that writes a file (Write, Edit, ...) aside the "
                      "first time it sees them and sends a marker that result.read reads "
                      "back, as the compaction chain would later (free for the prompt "
                      "cache: nothing sent changes)",
    "tool_deferral_threshold": "share of the effective window a session's registered tool "
                               "definitions may take before some are deferred (tools.search "
                               "finds them)",
    "keep_tool_results": "newest tool results, and newest tool calls' inputs, that "
                         "compaction never clears (error results are never cleared either)",
    "clear_at_least": "tokens the gateway's automatic compaction point clears at least, in "
                      "one step, once a request passes compact_trigger (or it clears "
                      "nothing)",
    "auto_compact": "compact a thread by itself when it reaches budget.compact_trigger (or "
                    "an append would pass budget.hard_block)",
    "compact_target": "share of the effective window compaction brings a thread under "
                      "(never above the session's compact_trigger)",
    "summarizer": "what summarises the oldest span: extractive (built in, no model), command "
                  "(summarizer_command) or http (summarizer_url)",
    "summarizer_command": "program run for summarizer = command: the span as JSON on stdin, "
                          "the summary on stdout (split like a shell command line)",
    "summarizer_url": "base URL of an OpenAI-compatible API (…/v1) that serves "
                      "/chat/completions, for summarizer = http",
    "summarizer_model": "the model name sent to summarizer_url",
    "summarizer_api_key_env": "name of the environment variable that holds the summarizer's "
                              "API key",
    "summarizer_timeout_s": "seconds a summarizer may take; then compaction goes on to "
                            "truncation",
    "summary_max_tokens": "tokens a summary may take in the thread (a longer one is cut)",
    "context_note": "note ctxd.render adds above budget.warn; {percent} is the usage "
                    "(empty: no note)",
    "embedder": "how memories are embedded: hashing (built in, no model), "
                "sentence-transformers (model_path) or http (embedding_url)",
    "model_path": "folder of a local sentence-transformers model (empty: the all-MiniLM-L6-v2 "
                  "that the `semantic` extra installs)",
    "embedding_url": "base URL of an OpenAI-compatible API (…/v1) that serves /embeddings",
    "embedding_model": "the model name sent to embedding_url",
    "api_key_env": "name of the environment variable that holds the embedding API key",
    "hook_inject_tokens": "tokens of memories memory.context (the Claude Code hooks) adds to "
                          "a prompt or a session's start",
    "inject_shared_words": "uncommon words of a prompt a memory must share to be injected "
                           "beside it (all of them when it has fewer; 0: any match)",
    "dense_min_score": "cosine similarity below which the dense leg does not propose a memory",
    "enabled": "serve the model gateway (an Anthropic/OpenAI API base URL on loopback)",
    "listen": "the gateway's HOST:PORT (an IP address; port 0: any free port)",
    "anthropic_upstream": "where the gateway sends Anthropic API requests (an http(s) URL)",
    "openai_upstream": "where the gateway sends OpenAI API requests (an http(s) URL)",
    "max_body_bytes": "largest request body the gateway accepts; a larger one gets 413",
    "max_upstream_calls": "model calls the gateway makes at once; more wait their turn",
    "allow_non_loopback": "let gateway.listen be a non-loopback address (the token in the "
                          "URL is then the only guard)",
    "team": "the team whose memories this ctxd shares through PostgreSQL: name, url_env "
            "(the variable holding the database URL), poll_interval_s, share_identity; "
            "file only",
    "prices": "per model, the price per million tokens of each counter (input, output, "
              "cache_read, cache_write, thinking); file only",
}


def _keys() -> list[tuple[str, ...]]:
    """Every key a flag or a variable can set, as a path: ("socket",), ("budget", "warn"),
    … (not the `FILE_ONLY` ones)."""
    paths: list[tuple[str, ...]] = []
    for name in Config.__struct_fields__:
        if name in TABLES:
            paths.extend((name, sub) for sub in TABLES[name].__struct_fields__
                         if (name, sub) not in FILE_ONLY)
        else:
            paths.append((name,))
    return paths


@functools.cache
def _fields(struct: type[msgspec.Struct]) -> dict[str, msgspec.structs.FieldInfo]:
    # Once per struct: msgspec.structs.fields resolves every annotation of the struct at
    # each call: once per key, 80 ms of the daemon's start-up (10 ms now).
    return {field.name: field for field in msgspec.structs.fields(struct)}


def _field(path: tuple[str, ...]) -> msgspec.structs.FieldInfo:
    return _fields(TABLES[path[0]] if len(path) == 2 else Config)[path[-1]]


def flag_name(path: tuple[str, ...]) -> str:
    """The daemon flag of a key: ``--budget-warn`` for budget.warn."""
    return "--" + "-".join(path).replace("_", "-")


def env_name(path: tuple[str, ...]) -> str:
    """The environment variable of a key: ``CTXD_BUDGET_WARN`` for budget.warn."""
    return "CTXD_" + "_".join(path).upper()


def choices(path: tuple[str, ...]) -> tuple[str, ...] | None:
    """The values a key accepts when they are a fixed list, in the order declared."""
    kind = _field(path).type
    return tuple(get_args(kind)) if get_origin(kind) is Literal else None


def _bounds(info: Any) -> str:
    if info.ge is not None and info.le is not None:
        return f" from {info.ge} to {info.le}"
    parts = []
    if info.ge is not None or info.gt is not None:
        parts.append(f">= {info.ge}" if info.ge is not None else f"> {info.gt}")
    if info.le is not None or info.lt is not None:
        parts.append(f"<= {info.le}" if info.le is not None else f"< {info.lt}")
    return " " + " and ".join(parts) if parts else ""


def describe(path: tuple[str, ...]) -> str:
    """What a key accepts, in words: ``an integer >= 1``, ``one of normal, full``."""
    options = choices(path)
    if options is not None:
        return "one of " + ", ".join(options)
    info = msgspec.inspect.type_info(_field(path).type)
    if isinstance(info, msgspec.inspect.BoolType):
        return "true or false"
    if isinstance(info, msgspec.inspect.IntType):
        return "an integer" + _bounds(info)
    if isinstance(info, msgspec.inspect.FloatType):
        return "a number" + _bounds(info)
    if isinstance(info, msgspec.inspect.DictType):
        return "a table of tables"
    return "text"


def default_of(path: tuple[str, ...]) -> Any:
    """A key's default value."""
    value: Any = Config()
    for part in path:
        value = getattr(value, part)
    return value


class Source(NamedTuple):
    """Where a setting came from, as its error names it."""

    where: str
    """``--max-connections``, ``CTXD_MAX_CONNECTIONS`` or ``/path/config.toml:3``."""
    key: str | None = None
    """The key as the file spells it (only for a file)."""

    def __str__(self) -> str:
        return f"{self.where}: {self.key}" if self.key else self.where


def _error(source: object, problem: str) -> CtxdError:
    return CtxdError(ErrorCode.INVALID_PARAMS, f"{source}: {problem}")


def _convert(path: tuple[str, ...], value: Any, source: Source) -> Any:
    """``value`` as the key's type, or an error that names its source and what it accepts."""
    try:
        return msgspec.convert(value, _field(path).type, strict=False)
    except msgspec.ValidationError as exc:
        if isinstance(value, dict):
            # A table of tables (usage.prices): name the entry that is wrong.
            _, item_type = get_args(_field(path).type)
            for name, item in value.items():
                try:
                    msgspec.convert(item, item_type, strict=False)
                except msgspec.ValidationError as item_exc:
                    where = f"{'.'.join(path)}.{json_key(name)}"
                    text = str(item_exc)
                    text = (text.replace("`$", f"`{where}") if " - at `$" in text
                            else f"{text} - in `{where}`")
                    raise _error(source, text) from None
            raise _error(source, str(exc)) from None
        shown = value if isinstance(value, str) else msgspec.json.encode(value).decode()
        options = choices(path)
        if options is not None:
            raise _error(source, f"invalid choice {shown!r} (choose from "
                                 f"{', '.join(options)})") from None
        raise _error(source, f"expected {describe(path)}, got {shown!r}") from None


def json_key(name: str) -> str:
    """A TOML key as written in a dotted path: bare when it can be, else quoted."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else msgspec.json.encode(name).decode()


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {close[0]}?" if close else ""


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """The line of each ``key =`` in a TOML text, by key path (tomllib keeps no positions).

    Table headers and dotted keys are followed; a key it cannot place gets no line.
    """
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        header = re.fullmatch(r"\[\s*([A-Za-z0-9_.\s-]+?)\s*\]\s*(#.*)?", line)
        if header:
            table = tuple(part.strip() for part in header[1].split("."))
            lines.setdefault(table, number)
            continue
        key = re.match(r"([A-Za-z0-9_.\s-]+?)\s*=", line)
        if key:
            lines.setdefault((*table, *(part.strip() for part in key[1].split("."))), number)
    return lines


def _from_file(path: Path, explicit: str | None) -> dict[tuple[str, ...], tuple[Any, Source]]:
    """The settings of a TOML file, each with its file and line.

    Args:
        path: the file.
        explicit: what named the file (``--config``, ``CTXD_CONFIG``), or None for the
            default path, which may be missing.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit is None:
            return {}
        raise _error(explicit, f"configuration file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _error(path, f"cannot be read: {exc}") from None
    try:
        tree = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _error(path, str(exc)) from None
    lines = _key_lines(text)

    def where(*key: str) -> Source:
        line = lines.get(key)
        return Source(f"{path}:{line}" if line else str(path), ".".join(key))

    settings: dict[tuple[str, ...], tuple[Any, Source]] = {}
    top = list(Config.__struct_fields__)
    for name, value in tree.items():
        if name in TABLES:
            if not isinstance(value, dict):
                raise _error(where(name), f"expected a table [{name}], got {value!r}")
            fields = list(TABLES[name].__struct_fields__)
            for sub, sub_value in value.items():
                if sub not in fields:
                    raise _error(where(name, sub), f"unknown key in [{name}]"
                                                   f"{_suggest(sub, fields)}")
                settings[name, sub] = (sub_value, where(name, sub))
        elif name in top:
            settings[name,] = (value, where(name))
        else:
            raise _error(where(name), f"unknown key{_suggest(name, top)} "
                                      "(`ctxd --print-config` shows every key)")
    return settings


CLIENT_VARIABLES = {
    "CTXD_CALL_TRANSPORT": "the shell client's transport (clients/shell/ctxd-call)",
    "CTXD_PLUGIN_TIMEOUT_MS": "the OpenCode plugin's time limit a call (clients/opencode)",
}
"""CTXD_* variables that configure a client, not the daemon: the daemon knows and ignores
them, so a shell that sets one for its clients still starts ctxd (docs/decisions.md,
"Agents end to end")."""
NOT_DAEMON_KEYS = frozenset({"CTXD_CONFIG", *CLIENT_VARIABLES})
"""CTXD_* variables that are not daemon settings: the config file's path, and the
clients' own (`CLIENT_VARIABLES`). Any other unknown CTXD_* name stops start-up (a typo)."""


def _from_env(environ: Mapping[str, str]) -> dict[tuple[str, ...], tuple[Any, Source]]:
    by_name = {env_name(path): path for path in _keys()}
    settings: dict[tuple[str, ...], tuple[Any, Source]] = {}
    for name, value in environ.items():
        if not name.startswith("CTXD_") or name in NOT_DAEMON_KEYS:
            continue
        path = by_name.get(name)
        if path is None:
            raise _error(name, "unknown environment variable: ctxd has no such setting"
                               f"{_suggest(name, sorted(by_name))} "
                               "(`ctxd --print-config` shows every key)")
        settings[path] = (value, Source(name))
    return settings


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One `--key` flag per configuration key (`--budget-warn` for budget.warn), its help
    saying what it accepts and its default, from the `Config` struct."""
    for path in _keys():
        options = choices(path)
        text = _HELP.get(path[-1])
        if path in (("socket",), ("data_dir",)):
            help_text, metavar = f"{text}; a path", "PATH"  # the default depends on the user
        else:
            default = default_of(path)
            shown = ('""' if default == "" else str(default).lower()
                     if isinstance(default, bool) else str(default))
            accepts = describe(path) if options is None else "choices: " + ", ".join(options)
            help_text = f"{text + '; ' if text else ''}{accepts}; default {shown}"
            metavar = ("{" + ",".join(options) + "}" if options else
                       _METAVAR[type(msgspec.inspect.type_info(_field(path).type)).__name__])
        parser.add_argument(flag_name(path), dest="cfg:" + ".".join(path), default=None,
                            metavar=metavar, help=help_text.replace("%", "%%"))  # argparse


_METAVAR = {"IntType": "N", "FloatType": "X", "BoolType": "{true,false}", "StrType": "TEXT"}


def load(flags: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None,
         config_path: Path | None = None) -> Config:
    """Build the effective configuration.

    Args:
        flags: parsed command-line flags (from a parser set up by `add_flags`).
        environ: the environment (default: ``os.environ``).
        config_path: the TOML file given with ``--config``. Without it, ``$CTXD_CONFIG``,
            else `default_config_path`. A file named by either must exist; the default
            one may be missing.

    Returns:
        The configuration with `socket` and `data_dir` resolved to absolute paths.

    Raises:
        CtxdError: a key is unknown, a value is of the wrong type or out of range, or a
            named file is missing; the message names the flag, the variable or the file
            and line it came from.
    """
    environ = dict(os.environ if environ is None else environ)
    explicit = ("--config" if config_path is not None
                else "CTXD_CONFIG" if environ.get("CTXD_CONFIG") else None)
    path = config_path or default_config_path(environ)
    settings = _from_file(path, explicit)
    settings.update(_from_env(environ))
    if flags is not None:
        for dest, value in vars(flags).items():
            if dest.startswith("cfg:") and value is not None:
                key = tuple(dest[4:].split("."))
                settings[key] = (value, Source(flag_name(key)))
    tree: dict[str, Any] = {}
    for key, (value, source) in settings.items():
        node = tree
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = _convert(key, value, source)
    config = msgspec.convert(tree, Config)

    def named(*key: str) -> str:
        return str(settings[key][1]) if key in settings else "the default"

    budget = config.budget
    for lower, higher in itertools.pairwise(THRESHOLD_ORDER):
        if getattr(budget, lower) > getattr(budget, higher):
            raise _error(named("budget", lower),
                         f"budget.{lower} ({getattr(budget, lower)}) must not exceed "
                         f"budget.{higher} ({getattr(budget, higher)}, from "
                         f"{named('budget', higher)})")
    if budget.max_output_tokens >= budget.context_window:
        raise _error(named("budget", "max_output_tokens"),
                     f"budget.max_output_tokens ({budget.max_output_tokens}) must be smaller "
                     f"than budget.context_window ({budget.context_window}, from "
                     f"{named('budget', 'context_window')})")
    hygiene = config.hygiene
    if hygiene.summarizer == "command" and not hygiene.summarizer_command.strip():
        raise _error(named("hygiene", "summarizer"),
                     "hygiene.summarizer = command needs hygiene.summarizer_command (the "
                     "program to run)")
    if hygiene.summarizer == "command":
        try:
            shlex.split(hygiene.summarizer_command)
        except ValueError as exc:
            raise _error(named("hygiene", "summarizer_command"),
                         f"cannot be split into a command line: {exc}") from None
    if hygiene.summarizer == "http" and not (hygiene.summarizer_url and hygiene.summarizer_model):
        raise _error(named("hygiene", "summarizer"),
                     "hygiene.summarizer = http needs hygiene.summarizer_url and "
                     "hygiene.summarizer_model")
    try:
        hygiene.context_note.format(percent=0)
    except (KeyError, IndexError, ValueError) as exc:
        raise _error(named("hygiene", "context_note"),
                     f"the only placeholder it may hold is {{percent}} ({exc!r}); write "
                     "{{ and }} for literal braces") from None
    _check_gateway(config.gateway, named)
    known = set(tiktoken.list_encoding_names())
    if config.encoding not in known and config.encoding + "_offline" not in known:
        raise _error(named("encoding"), f"unknown encoding {config.encoding!r}; "
                                        f"known: {', '.join(sorted(known))}")
    socket = Path(config.socket) if config.socket else default_socket_path(environ)
    data_dir = Path(config.data_dir) if config.data_dir else default_data_dir(environ)
    return msgspec.structs.replace(
        config, socket=str(socket.absolute()), data_dir=str(data_dir.absolute())
    )


def _check_gateway(gateway: GatewayConfig, named: Any) -> None:
    """Raises: CtxdError naming the setting when ``[gateway]`` cannot serve."""
    try:
        host, _ = listen_address(gateway.listen)
    except ValueError as exc:
        raise _error(named("gateway", "listen"), str(exc)) from None
    if not is_loopback(host) and not gateway.allow_non_loopback:
        raise _error(named("gateway", "listen"),
                     f"{host} is not a loopback address: the gateway serves this user's "
                     "sessions to whoever reaches it; set gateway.allow_non_loopback = true "
                     "to listen there anyway")
    for key in ("anthropic_upstream", "openai_upstream"):
        url = getattr(gateway, key)
        if not re.fullmatch(r"https?://[^/\s?#]+(/[^\s?#]*)?", url):
            raise _error(named("gateway", key),
                         f"expected an http:// or https:// URL without query, got {url!r}")


def to_toml(config: Config) -> str:
    """The configuration as a TOML document (what `ctxd --print-config` prints)."""

    def literal(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            return msgspec.json.encode(value).decode()
        if isinstance(value, dict):
            return "{" + ", ".join(f"{literal(name)} = {literal(item)}"
                                   for name, item in value.items()) + "}"
        if isinstance(value, msgspec.Struct):
            return "{" + ", ".join(f"{name} = {literal(getattr(value, name))}"
                                   for name in value.__struct_fields__) + "}"
        return repr(value)

    lines = [f"{key} = {literal(getattr(config, key))}"
             for key in Config.__struct_fields__ if key not in TABLES]
    for table, struct in TABLES.items():
        lines += ["", f"[{table}]", *(f"{key} = {literal(getattr(getattr(config, table), key))}"
                                      for key in struct.__struct_fields__)]
    return "\n".join(lines) + "\n"


__all__ = [
    "CLIENT_VARIABLES",
    "FILE_ONLY",
    "NOT_DAEMON_KEYS",
    "TABLES",
    "Config",
    "GatewayConfig",
    "MemoryConfig",
    "ModelPrice",
    "Source",
    "UsageConfig",
    "add_flags",
    "choices",
    "default_config_path",
    "default_data_dir",
    "default_of",
    "default_socket_path",
    "describe",
    "env_name",
    "flag_name",
    "is_loopback",
    "listen_address",
    "load",
    "to_toml",
]
