"""``ctxctl install opencode`` and ``ctxctl uninstall opencode``: ctxd's plugin file in
OpenCode's plugin directory and ctxd's MCP server entry in ``opencode.json`` (README.md,
"OpenCode"; docs/decisions.md, "OpenCode plugin")."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Scope = Literal["user", "project"]

PLUGIN_NAME = "ctxd.js"
PLUGIN_MARKER = "// ctxd's OpenCode plugin"
"""The plugin's first line: uninstall removes a plugin file only when it starts so."""
SERVER_NAME = "ctxd"


class InstallError(Exception):
    """What stops an install or uninstall, with what to do about it."""


@dataclass(frozen=True)
class Target:
    """Where OpenCode reads the configuration and the plugins of one scope."""

    config: Path
    plugin_dir: Path


def target(scope: Scope, project: Path | None = None,
           environ: dict[str, str] | None = None) -> Target:
    """The files of ``scope``: the project's ``opencode.json`` and ``.opencode/plugin/``,
    or the user's ``$XDG_CONFIG_HOME/opencode/`` (``~/.config/opencode/``)."""
    env = os.environ if environ is None else environ
    if scope == "project":
        root = (project or Path.cwd()).resolve()
        return Target(root / "opencode.json", root / ".opencode" / "plugin")
    config_home = Path(env.get("XDG_CONFIG_HOME") or Path(env.get("HOME", "~")) / ".config")
    base = config_home.expanduser() / "opencode"
    return Target(base / "opencode.json", base / "plugin")


def plugin_source() -> Path:
    """The plugin file shipped with ctxd: the checkout's ``clients/opencode/ctxd.js``
    (an editable install), else the copy under the environment's ``share/ctxd``."""
    for candidate in (Path(__file__).resolve().parents[1] / "opencode" / PLUGIN_NAME,
                      Path(sys.prefix) / "share" / "ctxd" / "opencode" / PLUGIN_NAME):
        if candidate.is_file():
            return candidate
    raise InstallError(f"ctxd's OpenCode plugin ({PLUGIN_NAME}) is not installed with "
                       f"ctxctl; reinstall ctxd (pip install ctxd)")


def ctxctl_path() -> str:
    """The absolute path of this ``ctxctl``, for OpenCode to start ``ctxctl mcp`` with."""
    beside = Path(sys.executable).parent / "ctxctl"
    if beside.is_file():
        return str(beside)
    found = shutil.which("ctxctl")
    if found is None:
        raise InstallError("ctxctl is not on PATH; install ctxd (pip install ctxd) first")
    return str(Path(found).resolve())


def server_entry(ctxctl: str) -> dict[str, Any]:
    """ctxd's entry under ``mcp`` in ``opencode.json``."""
    return {"type": "local", "command": [ctxctl, "mcp"], "enabled": True}


def _is_ours(entry: Any) -> bool:
    """Whether an ``mcp.ctxd`` entry is one an install wrote (``[…/ctxctl, "mcp"]``)."""
    command = entry.get("command") if isinstance(entry, dict) else None
    return (isinstance(command, list) and len(command) == 2
            and isinstance(command[0], str) and Path(command[0]).name == "ctxctl"
            and command[1] == "mcp")


def _read_config(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InstallError(f"{path} is not valid JSON ({exc}); fix it or move it away, "
                           f"then run this again (nothing was changed)") from exc
    if not isinstance(config, dict):
        raise InstallError(f"{path} holds a JSON {type(config).__name__}, not an object; "
                           f"fix it, then run this again (nothing was changed)")
    if "mcp" in config and not isinstance(config["mcp"], dict):
        raise InstallError(f"{path}: `mcp` is not an object; fix it, then run this again "
                           f"(nothing was changed)")
    return config


def _write_config(path: Path, config: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(path.name + ".ctxd-tmp")
    staged.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    staged.replace(path)


def install(scope: Scope, project: Path | None = None, ctxctl: str | None = None,
            environ: dict[str, str] | None = None) -> list[str]:
    """Installs the plugin file and the MCP entry of ``scope``.

    Returns:
        What changed, one line each; empty when everything was already in place.

    Raises:
        InstallError: ``opencode.json`` is not a JSON object, or already names another
            MCP server ``ctxd``; nothing was changed.
    """
    where = target(scope, project, environ)
    entry = server_entry(ctxctl or ctxctl_path())
    config = _read_config(where.config)
    existing = (config or {}).get("mcp", {}).get(SERVER_NAME)
    if existing is not None and not _is_ours(existing):
        raise InstallError(f"{where.config} already has an MCP server named {SERVER_NAME!r} "
                           f"that ctxctl did not write; rename or remove it, then run this "
                           f"again (nothing was changed)")
    changes = []
    source = plugin_source().read_bytes()
    plugin = where.plugin_dir / PLUGIN_NAME
    if not plugin.exists() or plugin.read_bytes() != source:
        verb = "updated" if plugin.exists() else "added"
        plugin.parent.mkdir(parents=True, exist_ok=True)
        plugin.write_bytes(source)
        changes.append(f"{verb} the plugin {plugin}")
    if existing != entry:
        config = config if config is not None else {}
        config.setdefault("mcp", {})[SERVER_NAME] = entry
        _write_config(where.config, config)
        verb = "updated" if existing is not None else "added"
        changes.append(f"{verb} the MCP server {SERVER_NAME!r} in {where.config}")
    return changes


def _remove_empty(directory: Path, stop: Path) -> None:
    """Removes ``directory`` and its parents up to (not including) ``stop`` while empty."""
    while directory != stop and directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()
        directory = directory.parent


def uninstall(scope: Scope, project: Path | None = None,
              environ: dict[str, str] | None = None) -> list[str]:
    """Removes what `install` added to ``scope``: the plugin file (when it is ctxd's) and
    the ``mcp.ctxd`` entry (when ctxctl wrote it); an ``mcp`` left empty goes, and an
    ``opencode.json`` left empty is deleted.

    Returns:
        What changed, one line each; empty when nothing of ctxd's was there.

    Raises:
        InstallError: ``opencode.json`` is not a JSON object; nothing was changed.
    """
    where = target(scope, project, environ)
    config = _read_config(where.config)
    changes = []
    plugin = where.plugin_dir / PLUGIN_NAME
    if plugin.is_file() and plugin.read_text(encoding="utf-8", errors="replace").startswith(
            PLUGIN_MARKER):
        plugin.unlink()
        changes.append(f"removed the plugin {plugin}")
        stop = where.config.parent if scope == "project" else where.plugin_dir.parent
        _remove_empty(where.plugin_dir, stop)
    servers = (config or {}).get("mcp", {})
    if config is not None and _is_ours(servers.get(SERVER_NAME)):
        del servers[SERVER_NAME]
        if not servers:
            del config["mcp"]
        if config:
            _write_config(where.config, config)
        else:
            where.config.unlink()
        changes.append(f"removed the MCP server {SERVER_NAME!r} from {where.config}")
    return changes
