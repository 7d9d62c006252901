"""`ctxctl install|uninstall TARGET`: wire an agent tool to ctxd by merging ctxd's entries
into the tool's own settings files, and take exactly those entries out again (README,
"Claude Code"; docs/decisions.md, "Install").

A target is a module-level object with ``install(scope, root, command, socket, gateway)``,
``uninstall(scope, root, command)`` and ``check(scope, root)``: the first two return the
list of changes made (empty: nothing to do), the third the problems found. At user scope,
``gateway`` (the model gateway's base URL) also points the tool's model calls at ctxd;
the value it replaced is kept in ctxd's state directory, and uninstall puts it back
(docs/decisions.md, "Gateway"). Settings files
are JSON objects read whole and written atomically (a temporary file renamed over the
original, with its mode kept); a file that is not a JSON object is refused, never
overwritten. OpenCode's are JSONC, edited in place: comments and layout are kept.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from ctxclient import _jsonc

SCOPES = ("project", "user")


class SettingsError(Exception):
    """A settings file that cannot be merged into (malformed JSON, not an object, a
    foreign entry under ctxd's name): nothing was written."""


@dataclass(frozen=True)
class Change:
    """One edit: ``action`` is ``added``, ``updated`` or ``removed``."""

    file: str
    action: str
    what: str

    def line(self) -> str:
        return f"{self.action} {self.what} in {self.file}"

    def to_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Problem:
    """What ``doctor`` found wrong, and the command that fixes it."""

    file: str
    problem: str
    fix: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


class Target(Protocol):
    name: str

    def install(self, scope: str, root: Path, command: str, socket: str | None,
                gateway: str | None = None, tools: str | None = None) -> list[Change]: ...

    def uninstall(self, scope: str, root: Path, command: str) -> list[Change]: ...

    def installed(self, scope: str, root: Path) -> bool: ...

    def check(self, scope: str, root: Path) -> list[Problem]: ...


# ---- settings files ----------------------------------------------------------------------

def read(path: Path) -> str:
    """A settings file's text; ``""`` when the file does not exist."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read it ({exc.strerror})") from exc


def parse(path: Path, raw: str, jsonc: bool = False) -> dict[str, Any]:
    """A settings file's object from its text ``raw``; ``{}`` for an empty one. ``jsonc``:
    comments and trailing commas allowed (OpenCode's files, `ctxclient._jsonc`)."""
    if not raw.strip():
        return {}
    try:
        data = _jsonc.loads(raw) if jsonc else json.loads(raw)
    except ValueError as exc:
        kind = "JSON (comments and trailing commas allowed)" if jsonc else "JSON"
        raise SettingsError(f"{path}: not valid {kind} ({exc}); fix or move the file, then "
                            "run the command again") from exc
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: holds a JSON {type(data).__name__}, not an object; fix "
                            "or move the file, then run the command again")
    return data


def load(path: Path, jsonc: bool = False) -> dict[str, Any]:
    """A settings file's object; ``{}`` when the file does not exist."""
    return parse(path, read(path), jsonc)


def save(path: Path, data: dict[str, Any], original: str = "", private: bool = False
         ) -> None:
    """Write ``data`` atomically, keeping the file's mode (0600 for a new ``.claude.json``
    would be Claude Code's own; new files get the umask's mode), or with ``private`` (the
    file holds the gateway's URL, whose path is the user's secret) readable by its owner
    only; an empty object removes the file. ``original``: the file's JSONC text as it was
    read, whose comments and layout are kept where ``data`` did not change
    (`ctxclient._jsonc.patch`); it is also kept, as ``{}`` and its comments, when ``data``
    is empty."""
    if not data and not (original.strip() and _jsonc.has_comments(original)):
        path.unlink(missing_ok=True)
        return
    if original.strip():
        text = _jsonc.patch(original, data)
    else:
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode: int | None = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode & ~0o077 if private else mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ctxctl_command() -> str:
    """The absolute path of the running ``ctxctl`` (hooks run without the user's PATH
    guarantees): the console script next to this interpreter, else argv[0]."""
    beside = Path(sys.executable).with_name("ctxctl")
    if beside.exists():
        return str(beside)
    return str(Path(sys.argv[0]).resolve())


def is_ctxctl(argv0: object) -> bool:
    return isinstance(argv0, str) and os.path.basename(argv0) == "ctxctl"


# ---- the gateway's entries ---------------------------------------------------------------

SAVED_NAME = "install-saved.json"
"""In ctxd's state directory: what each gateway entry replaced, by settings file."""
_ABSENT = object()


def saved_path() -> Path:
    from ctxclient._mcp import state_dir

    return state_dir(os.environ) / SAVED_NAME


class Saved:
    """The values install's gateway entries replaced (``previous``, missing when there was
    none), the value written (``value``) and how many enclosing objects it created
    (``created``), by settings file and key path: uninstall restores exactly that."""

    def __init__(self, path: Path | None = None):
        self.path = saved_path() if path is None else path
        self.records = load(self.path)

    def record(self, file: Path, keys: tuple[str, ...]) -> dict[str, Any] | None:
        found = self.records.get(str(file), {}).get("/".join(keys))
        return found if isinstance(found, dict) else None

    def put(self, file: Path, keys: tuple[str, ...], record: dict[str, Any] | None) -> None:
        entries = self.records.setdefault(str(file), {})
        if record is None:
            entries.pop("/".join(keys), None)
            if not entries:
                del self.records[str(file)]
        else:
            entries["/".join(keys)] = record

    def save(self) -> None:
        save(self.path, self.records)
        if self.path.exists():
            self.path.chmod(0o600)


def set_entry(data: dict[str, Any], file: Path, keys: tuple[str, ...], value: str,
              saved: Saved) -> Change | None:
    """Set ``keys`` (a path of object keys) to ``value`` in ``data``, the settings of
    ``file``, keeping what it replaces in ``saved``; None when it is set already."""
    parent, created = data, 0
    for depth, key in enumerate(keys[:-1]):
        child = parent.get(key)
        if child is None:
            child = parent[key] = {}
            created += 1
        elif not isinstance(child, dict):
            raise SettingsError(f"{file}: {'.'.join(keys[:depth + 1])} is not a JSON object; "
                                "fix or move the file")
        parent = child
    current = parent.get(keys[-1], _ABSENT)
    if current == value:
        return None
    record = saved.record(file, keys)
    if record is not None and current == record.get("value"):
        record = {**record, "value": value}  # ours, from an earlier install: keep what it replaced
    else:
        # The file's mode too: the URL makes it private (`save`), uninstall gives it back.
        record = {"value": value, "created": created,
                  **({} if current is _ABSENT else {"previous": current}),
                  **({"mode": file.stat().st_mode & 0o7777} if file.exists() else {})}
    parent[keys[-1]] = value
    saved.put(file, keys, record)
    return Change(str(file), "added" if current is _ABSENT else "updated", ".".join(keys))


def mode_before(file: Path, keys: tuple[str, ...], saved: Saved) -> int | None:
    """The mode ``file`` had before `set_entry` made it private (None: unknown, or the
    file was new)."""
    record = saved.record(file, keys)
    mode = record.get("mode") if record is not None else None
    return mode if isinstance(mode, int) and 0 <= mode <= 0o7777 else None


def give_mode_back(file: Path, mode: int | None) -> None:
    """Put back the mode `mode_before` found, when the file is still there."""
    if mode is not None and file.exists():
        file.chmod(mode)


def restore_entry(data: dict[str, Any], file: Path, keys: tuple[str, ...],
                  saved: Saved) -> Change | None:
    """Put back what `set_entry` replaced at ``keys``: the value that was there, or
    nothing (with the objects it created). A value changed since install is the user's,
    left alone; without a record, a value of a gateway URL's shape is taken out. None when
    nothing changed."""
    from ctxclient._gateway import is_gateway_url

    record = saved.record(file, keys)
    saved.put(file, keys, None)
    parents = [data]
    for key in keys[:-1]:
        child = parents[-1].get(key)
        if not isinstance(child, dict):
            return None
        parents.append(child)
    current = parents[-1].get(keys[-1], _ABSENT)
    if record is not None and current == record.get("value"):
        if "previous" in record:
            parents[-1][keys[-1]] = record["previous"]
            return Change(str(file), "restored", ".".join(keys))
        created = record.get("created", 0)
    elif record is None and is_gateway_url(current):
        created = len(keys) - 1  # unknown: the objects it leaves empty
    else:
        return None
    del parents[-1][keys[-1]]
    for depth in range(len(keys) - 1, len(keys) - 1 - created, -1):
        if parents[depth]:
            break
        del parents[depth - 1][keys[depth - 1]]
    return Change(str(file), "removed", ".".join(keys))


# ---- Claude Code -------------------------------------------------------------------------

HOOK_EVENTS = ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse",
               "PostToolUseFailure", "PreCompact", "Stop", "SubagentStart", "SubagentStop",
               "SessionEnd")
HOOK_TIMEOUT_S = 10
"""Claude Code's limit for one hook run; ``ctxctl hook`` gives up on the daemon sooner."""
MCP_NAME = "ctxd"
GATEWAY_KEYS = ("env", "ANTHROPIC_BASE_URL")
"""Claude Code's settings entry that sends its model calls to the gateway."""


def _hook_argv(command: object) -> list[str] | None:
    """A hook command's words, when it is ``ctxctl hook ...``."""
    if not isinstance(command, str):
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    return words if len(words) >= 2 and is_ctxctl(words[0]) and words[1] == "hook" else None


def _is_ours_hook(hook: object) -> bool:
    return isinstance(hook, dict) and _hook_argv(hook.get("command")) is not None


def _is_ours_server(server: object) -> bool:
    return (isinstance(server, dict) and is_ctxctl(server.get("command"))
            and (server.get("args") or [None])[0] == "mcp")


class ClaudeCode:
    """Claude Code 2.1: hooks in ``settings.json``; the MCP server in ``.mcp.json``
    (project) or ``~/.claude.json`` (user), pre-approved in the project's settings."""

    name = "claude-code"

    @staticmethod
    def config_dir() -> Path:
        configured = os.environ.get("CLAUDE_CONFIG_DIR")
        return Path(configured) if configured else Path.home() / ".claude"

    def settings_path(self, scope: str, root: Path) -> Path:
        return (root / ".claude" / "settings.json" if scope == "project"
                else self.config_dir() / "settings.json")

    def mcp_path(self, scope: str, root: Path) -> Path:
        if scope == "project":
            return root / ".mcp.json"
        configured = os.environ.get("CLAUDE_CONFIG_DIR")
        return Path(configured) / ".claude.json" if configured else Path.home() / ".claude.json"

    def install(self, scope: str, root: Path, command: str, socket: str | None,
                gateway: str | None = None, tools: str | None = None) -> list[Change]:
        settings_path, mcp_path = self.settings_path(scope, root), self.mcp_path(scope, root)
        settings_text, mcp_text = read(settings_path), read(mcp_path)
        # Both read before any write; written back with their layout (`save`'s original).
        settings, mcp = parse(settings_path, settings_text), parse(mcp_path, mcp_text)
        saved = Saved()
        socket_args = ["--socket", socket] if socket else []
        hook_command = shlex.join([command, "hook", *socket_args])
        changes: list[Change] = []
        hooks = _object(settings, "hooks", settings_path)
        for event in HOOK_EVENTS:
            groups = hooks.setdefault(event, [])
            if not isinstance(groups, list):
                raise SettingsError(f"{settings_path}: hooks.{event} is not a list")
            ours = [(g, h) for g in groups if isinstance(g, dict)
                    for h in g.get("hooks") or [] if _is_ours_hook(h)]
            entry = {"type": "command", "command": hook_command, "timeout": HOOK_TIMEOUT_S}
            if not ours:
                groups.append({"hooks": [entry]})
                changes.append(Change(str(settings_path), "added", f"hook {event}"))
            elif any(h != entry for _, h in ours) or len(ours) > 1:
                for group, hook in ours[1:]:
                    group["hooks"].remove(hook)
                ours[0][1].clear()
                ours[0][1].update(entry)
                _drop_empty_groups(groups)
                changes.append(Change(str(settings_path), "updated", f"hook {event}"))
        servers = _object(mcp, "mcpServers", mcp_path)
        server = {"type": "stdio", "command": command,
                  "args": ["mcp", *socket_args, *(["--tools", tools] if tools else [])]}
        current = servers.get(MCP_NAME)
        if current is not None and not _is_ours_server(current):
            raise SettingsError(f"{mcp_path}: an MCP server named {MCP_NAME!r} that is not "
                                "ctxctl's is already there; rename or remove it first")
        if current != server:
            servers[MCP_NAME] = server
            changes.append(Change(str(mcp_path), "added" if current is None else "updated",
                                  f"MCP server {MCP_NAME}"))
        if scope == "project":
            # A project's .mcp.json servers wait for the user's approval; this pre-approves
            # ctxd's alone (not enableAllProjectMcpServers).
            enabled = settings.setdefault("enabledMcpjsonServers", [])
            if not isinstance(enabled, list):
                raise SettingsError(f"{settings_path}: enabledMcpjsonServers is not a list")
            if MCP_NAME not in enabled:
                enabled.append(MCP_NAME)
                changes.append(Change(str(settings_path), "added",
                                      f"{MCP_NAME} to enabledMcpjsonServers"))
        if gateway is not None:
            change = set_entry(settings, settings_path, GATEWAY_KEYS, gateway, saved)
            changes += [change] if change else []
        if any(c.file == str(settings_path) for c in changes):
            save(settings_path, settings, settings_text, private=gateway is not None)
        if any(c.file == str(mcp_path) for c in changes):
            save(mcp_path, mcp, mcp_text)
        if gateway is not None:
            saved.save()
        return changes

    def uninstall(self, scope: str, root: Path, command: str) -> list[Change]:
        settings_path, mcp_path = self.settings_path(scope, root), self.mcp_path(scope, root)
        settings_text, mcp_text = read(settings_path), read(mcp_path)
        settings, mcp = parse(settings_path, settings_text), parse(mcp_path, mcp_text)
        changes: list[Change] = []
        hooks = settings.get("hooks")
        if isinstance(hooks, dict):
            known = {event: i for i, event in enumerate(HOOK_EVENTS)}
            for event in sorted(hooks, key=lambda e: (known.get(e, len(known)), e)):
                groups = hooks[event]
                if not isinstance(groups, list):
                    continue
                removed = False
                for group in groups:
                    if isinstance(group, dict) and isinstance(group.get("hooks"), list):
                        kept = [h for h in group["hooks"] if not _is_ours_hook(h)]
                        removed |= len(kept) != len(group["hooks"])
                        group["hooks"] = kept
                if removed:
                    _drop_empty_groups(groups)
                    if not groups:
                        del hooks[event]
                    changes.append(Change(str(settings_path), "removed", f"hook {event}"))
            if not hooks:
                del settings["hooks"]
        enabled = settings.get("enabledMcpjsonServers")
        if scope == "project" and isinstance(enabled, list) and MCP_NAME in enabled:
            enabled.remove(MCP_NAME)
            if not enabled:
                del settings["enabledMcpjsonServers"]
            changes.append(Change(str(settings_path), "removed",
                                  f"{MCP_NAME} from enabledMcpjsonServers"))
        servers = mcp.get("mcpServers")
        if isinstance(servers, dict) and _is_ours_server(servers.get(MCP_NAME)):
            del servers[MCP_NAME]
            if not servers:
                del mcp["mcpServers"]
            changes.append(Change(str(mcp_path), "removed", f"MCP server {MCP_NAME}"))
        saved = Saved()
        mode = None
        if scope == "user":
            mode = mode_before(settings_path, GATEWAY_KEYS, saved)
            change = restore_entry(settings, settings_path, GATEWAY_KEYS, saved)
            changes += [change] if change else []
        if any(c.file == str(settings_path) for c in changes):
            save(settings_path, settings, settings_text)
            give_mode_back(settings_path, mode)
        if any(c.file == str(mcp_path) for c in changes):
            save(mcp_path, mcp, mcp_text)
        if scope == "user":
            saved.save()
        return changes

    def _ours(self, scope: str, root: Path) -> tuple[dict[str, list[list[str]]], Any]:
        """ctxd's hook commands (as words) by event, and its MCP server entry."""
        settings = load(self.settings_path(scope, root))
        mcp = load(self.mcp_path(scope, root))
        found: dict[str, list[list[str]]] = {}
        hooks = settings.get("hooks")
        for event, groups in (hooks.items() if isinstance(hooks, dict) else []):
            for group in groups if isinstance(groups, list) else []:
                for hook in group.get("hooks") or [] if isinstance(group, dict) else []:
                    words = _hook_argv(hook.get("command")) if isinstance(hook, dict) else None
                    if words:
                        found.setdefault(event, []).append(words)
        servers = mcp.get("mcpServers")
        server = servers.get(MCP_NAME) if isinstance(servers, dict) else None
        return found, server if _is_ours_server(server) else None

    def installed(self, scope: str, root: Path) -> bool:
        try:
            hooks, server = self._ours(scope, root)
        except SettingsError:
            return True  # a broken file where ctxd may be installed: check() says why
        return bool(hooks) or server is not None

    def check(self, scope: str, root: Path) -> list[Problem]:
        fix = f"ctxctl install claude-code --scope {scope}"
        settings_path = str(self.settings_path(scope, root))
        try:
            hooks, server = self._ours(scope, root)
        except SettingsError as exc:
            return [Problem(str(exc).partition(":")[0], str(exc).partition(": ")[2],
                            "fix the file's JSON")]
        problems: list[Problem] = []
        missing = [e for e in HOOK_EVENTS if e not in hooks]
        if missing:
            problems.append(Problem(settings_path, "no ctxd hook for " + ", ".join(missing),
                                    fix))
        commands = [words for lists in hooks.values() for words in lists]
        if server is not None:
            commands.append([server["command"], *server.get("args", [])])
        else:
            problems.append(Problem(str(self.mcp_path(scope, root)),
                                    f"no MCP server {MCP_NAME}", fix))
        for program in sorted({words[0] for words in commands}):
            if not os.access(program, os.X_OK):
                problems.append(Problem(settings_path, f"{program} does not exist or is "
                                        "not executable", fix))
        for socket in sorted({w[w.index("--socket") + 1] for w in commands
                              if "--socket" in w[:-1]}):
            if not Path(socket).is_socket():
                problems.append(Problem(settings_path, f"the socket {socket} the hooks use "
                                        "does not exist (is ctxd running there?)",
                                        f"start ctxd, or {fix} --socket PATH"))
        return problems


def _object(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = data.setdefault(key, {})
    if not isinstance(value, dict):
        raise SettingsError(f"{path}: {key} is not a JSON object; fix or move the file")
    return value


def _drop_empty_groups(groups: list[Any]) -> None:
    groups[:] = [g for g in groups if not (isinstance(g, dict) and g.get("hooks") == [])]


# ---- OpenCode ----------------------------------------------------------------------------

PLUGIN_NAME = "ctxd.js"
OPENCODE_GATEWAY_KEYS = ("provider", "anthropic", "options", "baseURL")
"""OpenCode's setting that sends its Anthropic calls to the gateway (docs/decisions.md,
"Gateway": its OpenAI provider speaks the Responses API, which the gateway does not
rewrite, so it is left alone)."""
PLUGIN_MARKER = "// ctxd's OpenCode plugin"
"""The plugin's first line: uninstall removes a plugin file only when it starts so."""


def plugin_source() -> Path:
    """The plugin file shipped with ctxd: the checkout's ``clients/opencode/ctxd.js``
    (an editable install), else the copy under the environment's ``share/ctxd``."""
    for candidate in (Path(__file__).resolve().parents[1] / "opencode" / PLUGIN_NAME,
                      Path(sys.prefix) / "share" / "ctxd" / "opencode" / PLUGIN_NAME):
        if candidate.is_file():
            return candidate
    raise SettingsError(f"ctxd's OpenCode plugin ({PLUGIN_NAME}) is not installed with "
                        "ctxctl; reinstall ctxd (pip install ctxd)")


def _is_ours_local_server(entry: object) -> bool:
    """An ``mcp.ctxd`` entry an install wrote: ``{type: local, command: [ctxctl, "mcp", …]}``."""
    command = entry.get("command") if isinstance(entry, dict) else None
    return (isinstance(command, list) and len(command) >= 2 and is_ctxctl(command[0])
            and command[1] == "mcp")


class OpenCode:
    """OpenCode 1.18: the plugin file in ``.opencode/plugin/`` (project) or
    ``$XDG_CONFIG_HOME/opencode/plugin/`` (user), the MCP server under ``mcp`` in the
    same scope's ``opencode.json``, or its ``opencode.jsonc`` when only that exists. OpenCode
    reads both as JSONC: comments and trailing commas are allowed, and kept."""

    name = "opencode"

    @staticmethod
    def base(scope: str, root: Path) -> Path:
        if scope == "project":
            return root
        config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        return Path(config_home) / "opencode"

    def config_path(self, scope: str, root: Path) -> Path:
        """The scope's ``opencode.json``; its ``opencode.jsonc`` when only that one exists
        (a second file beside it would split the settings)."""
        base = self.base(scope, root)
        json_path, jsonc_path = base / "opencode.json", base / "opencode.jsonc"
        return jsonc_path if jsonc_path.exists() and not json_path.exists() else json_path

    def plugin_path(self, scope: str, root: Path) -> Path:
        plugin_dir = ".opencode/plugin" if scope == "project" else "plugin"
        return self.base(scope, root) / plugin_dir / PLUGIN_NAME

    def install(self, scope: str, root: Path, command: str, socket: str | None,
                gateway: str | None = None, tools: str | None = None) -> list[Change]:
        config_path, plugin = self.config_path(scope, root), self.plugin_path(scope, root)
        original = read(config_path)
        config = parse(config_path, original, jsonc=True)  # refused when malformed, first
        servers = _object(config, "mcp", config_path)
        current = servers.get(MCP_NAME)
        if current is not None and not _is_ours_local_server(current):
            raise SettingsError(f"{config_path}: an MCP server named {MCP_NAME!r} that is not "
                                "ctxctl's is already there; rename or remove it first")
        changes: list[Change] = []
        source = plugin_source().read_bytes()
        if not plugin.is_file() or plugin.read_bytes() != source:
            action = "updated" if plugin.exists() else "added"
            plugin.parent.mkdir(parents=True, exist_ok=True)
            _save_bytes(plugin, source)
            changes.append(Change(str(plugin), action, "the plugin"))
        socket_args = ["--socket", socket] if socket else []
        server = {"type": "local", "command": [
            command, "mcp", *socket_args, *(["--tools", tools] if tools else [])],
            "enabled": True}
        if current != server:
            servers[MCP_NAME] = server
            changes.append(Change(str(config_path), "added" if current is None else "updated",
                                  f"MCP server {MCP_NAME}"))
        saved = Saved()
        if gateway is not None:
            from ctxclient._gateway import openai_url

            # The AI SDK's Anthropic provider puts /messages after its baseURL, whose
            # default is https://api.anthropic.com/v1.
            change = set_entry(config, config_path, OPENCODE_GATEWAY_KEYS,
                               openai_url(gateway), saved)
            changes += [change] if change else []
        if any(c.file == str(config_path) for c in changes):
            save(config_path, config, original, private=gateway is not None)
        if gateway is not None:
            saved.save()
        return changes

    def uninstall(self, scope: str, root: Path, command: str) -> list[Change]:
        config_path, plugin = self.config_path(scope, root), self.plugin_path(scope, root)
        original = read(config_path)
        config = parse(config_path, original, jsonc=True)
        changes: list[Change] = []
        if plugin.is_file() and plugin.read_text(encoding="utf-8", errors="replace") \
                .startswith(PLUGIN_MARKER):
            plugin.unlink()
            changes.append(Change(str(plugin), "removed", "the plugin"))
            directory = plugin.parent
            while directory != self.base(scope, root) and directory.is_dir() \
                    and not any(directory.iterdir()):
                directory.rmdir()
                directory = directory.parent
        servers = config.get("mcp")
        if isinstance(servers, dict) and _is_ours_local_server(servers.get(MCP_NAME)):
            del servers[MCP_NAME]
            if not servers:
                del config["mcp"]
            changes.append(Change(str(config_path), "removed", f"MCP server {MCP_NAME}"))
        saved = Saved()
        mode = None
        if scope == "user":
            mode = mode_before(config_path, OPENCODE_GATEWAY_KEYS, saved)
            change = restore_entry(config, config_path, OPENCODE_GATEWAY_KEYS, saved)
            changes += [change] if change else []
        if any(c.file == str(config_path) for c in changes):
            save(config_path, config, original)
            give_mode_back(config_path, mode)
        if scope == "user":
            saved.save()
        return changes

    def installed(self, scope: str, root: Path) -> bool:
        if self.plugin_path(scope, root).is_file():
            return True
        try:
            servers = load(self.config_path(scope, root), jsonc=True).get("mcp")
        except SettingsError:
            return True  # a broken file where ctxd may be installed: check() says why
        return isinstance(servers, dict) and _is_ours_local_server(servers.get(MCP_NAME))

    def check(self, scope: str, root: Path) -> list[Problem]:
        fix = f"ctxctl install opencode --scope {scope}"
        config_path, plugin = self.config_path(scope, root), self.plugin_path(scope, root)
        try:
            servers = load(config_path, jsonc=True).get("mcp")
        except SettingsError as exc:
            return [Problem(str(config_path), str(exc).partition(": ")[2], "fix the file's JSON")]
        problems: list[Problem] = []
        if not plugin.is_file():
            problems.append(Problem(str(plugin), "no ctxd plugin", fix))
        elif plugin.read_bytes() != plugin_source().read_bytes():
            problems.append(Problem(str(plugin), "the plugin is not this ctxd's version", fix))
        server = servers.get(MCP_NAME) if isinstance(servers, dict) else None
        if server is None or not _is_ours_local_server(server):
            problems.append(Problem(str(config_path), f"no MCP server {MCP_NAME}", fix))
        elif not os.access(program := server["command"][0], os.X_OK):
            problems.append(Problem(str(config_path), f"{program} does not exist or is not "
                                    "executable", fix))
        return problems


def _save_bytes(path: Path, data: bytes) -> None:
    """Write a file atomically (temporary file, then rename)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


TARGETS: dict[str, Callable[[], Target]] = {"claude-code": ClaudeCode, "opencode": OpenCode}


# ---- the commands --------------------------------------------------------------------------

EXIT_REFUSED = 3
"""A settings file ctxctl will not touch (malformed, or a foreign entry under ctxd's name)."""


AGENT_NAMES = {"claude-code": "Claude Code", "opencode": "OpenCode"}


def gateway_note(target_name: str, base_url: str, socket_unit: Path | None) -> str:
    """What install says once the tool's model calls go through the gateway: the tool
    now depends on the daemon, and what starts a stopped one."""
    from ctxclient._gateway import shown

    agent = AGENT_NAMES[target_name]
    head = f"{agent}'s model calls now go through ctxd's gateway ({shown(base_url)}). "
    if socket_unit is not None:
        return head + (f"The systemd socket unit ({socket_unit}) starts ctxd when a call "
                       "finds it stopped.")
    return head + (f"Without systemd's socket unit only ctxd's MCP server starts it, when "
                   f"{agent} starts: stopped while {agent} runs, ctxd fails its model calls "
                   f"until it is started again. Keep `ctxd` running, or install the units "
                   f"(README, \"Running it as a service\").")


def run(action: str, target_name: str, scope: str, root: Path, socket: str | None,
        as_json: bool, gateway: str | None = None, gateway_problem: str | None = None,
        socket_unit: Path | None = None, tools: str | None = None) -> int:
    """``install``/``uninstall``: apply, then print the changes (plain or JSON).

    Args:
        gateway: the gateway's base URL to point the tool at (install at user scope).
        gateway_problem: why there is none although install was asked for it: the rest
            is installed, this said, and the exit status is 1.
        socket_unit: ctxd's systemd socket unit, when installed (what install says).
        tools: the MCP server's ``--tools`` (None: its default set).
    """
    target = TARGETS[target_name]()
    command = ctxctl_command()
    try:
        if action == "install":
            changes = target.install(scope, root, command,
                                     str(Path(socket).absolute()) if socket else None,
                                     gateway, tools)
        else:
            changes = target.uninstall(scope, root, command)
    except SettingsError as exc:
        if as_json:
            print(json.dumps({"error": {"code": None, "message": str(exc)}}, indent=2))
        print(f"ctxctl: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    wired = gateway is not None and any(c.what in (".".join(GATEWAY_KEYS),
                                                   ".".join(OPENCODE_GATEWAY_KEYS))
                                        for c in changes)
    note = gateway_note(target_name, gateway, socket_unit) if wired and gateway else None
    if as_json:
        # "gateway" only when install was asked to wire it (user scope, no --no-gateway).
        asked = gateway is not None or gateway_problem is not None
        print(json.dumps({"target": target_name, "scope": scope, "changed": bool(changes),
                          "changes": [c.to_json() for c in changes],
                          **({"gateway": {"base_url": gateway, "error": gateway_problem,
                                          "note": note}} if asked else {})}, indent=2))
    elif changes:
        for change in changes:
            print(change.line())
    else:
        print(f"{target_name} ({scope}): "
              + ("already installed, nothing changed" if action == "install"
                 else "ctxd is not installed there, nothing changed"))
    if note is not None and not as_json:
        print(note)
    if gateway_problem is not None:
        print(f"ctxctl: {AGENT_NAMES[target_name]}'s model calls do not go through ctxd's "
              f"gateway: {gateway_problem}; then run `ctxctl install {target_name}` again "
              "(or add --no-gateway to install without it)", file=sys.stderr)
        return 1
    return 0


GATEWAY_ENTRIES: dict[str, tuple[Callable[[], Path], tuple[str, ...], str]] = {
    "claude-code": (lambda: ClaudeCode().settings_path("user", Path()), GATEWAY_KEYS, ""),
    "opencode": (lambda: OpenCode().config_path("user", Path()), OPENCODE_GATEWAY_KEYS, "/v1")}
"""Where each target's user settings point its model calls at the gateway, and what the
gateway's base URL is followed by there."""
GATEWAY_UNKNOWN = "unknown"
"""`doctor`'s ``gateway`` when no daemon said what it is (its entries are not checked)."""


def gateway_problems(name: str, gateway: str | None) -> list[Problem]:
    """Whether a target's user settings point at the running gateway (``gateway``, its
    base URL; None: disabled): a gateway URL of another port or token, or one of a
    disabled gateway, leaves the tool's model calls failing."""
    from ctxclient._gateway import is_gateway_url, shown

    path_of, keys, suffix = GATEWAY_ENTRIES[name]
    path = path_of()
    value: Any = load(path, jsonc=name == "opencode")
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    if value == (gateway and gateway.rstrip("/") + suffix):
        return []
    at_gateway = (isinstance(value, str) and gateway is not None
                  and urlsplit(value).netloc == urlsplit(gateway).netloc)
    if not (is_gateway_url(value) or at_gateway):  # another proxy of the user's: theirs
        return []
    what = ".".join(keys)
    if gateway is None:
        return [Problem(str(path), f"{what} points at ctxd's gateway, which is disabled",
                        f"enable it ([gateway] enabled = true), or ctxctl uninstall {name}")]
    return [Problem(str(path), f"{what} is not the running gateway's URL ({shown(gateway)}"
                               f"{suffix}: another port or token)", f"ctxctl install {name}")]


def doctor(root: Path, gateway: str | None = GATEWAY_UNKNOWN
           ) -> tuple[list[dict[str, Any]], bool]:
    """Each target's state in each scope where ctxd's entries are (a target ctxd was never
    installed for is no problem): the JSON rows, and whether all is well. ``gateway``: the
    running gateway's base URL (None: disabled), against which the user settings' entries
    are checked."""
    rows: list[dict[str, Any]] = []
    for name, make in TARGETS.items():
        target = make()
        for scope in SCOPES:
            if not target.installed(scope, root):
                continue
            problems = target.check(scope, root)
            if scope == "user" and gateway != GATEWAY_UNKNOWN:
                try:
                    problems += gateway_problems(name, gateway)
                except SettingsError:
                    pass  # check() said why
            rows.append({"target": name, "scope": scope, "ok": not problems,
                         "problems": [p.to_json() for p in problems]})
    return rows, all(row["ok"] for row in rows)


def doctor_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        where = f"{row['target']} ({row['scope']})"
        if row["ok"]:
            lines.append(f"{where}: ok")
        lines += [f"{where}: {p['file']}: {p['problem']}; fix: {p['fix']}"
                  for p in row["problems"]]
    return lines
