"""Schema migrations, one module per version: ``vNNNN_<what>.py`` with ``SQL``.

Version N's module brings a database at ``user_version`` N-1 to N in one transaction:
its ``SQL``, then its ``migrate(conn)`` when it has one (a step SQLite cannot express).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType

import apsw


def load_all() -> list[tuple[int, ModuleType]]:
    """Every migration module in version order."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        match = re.fullmatch(r"v(\d{4})_\w+", info.name)
        if match:
            found.append((int(match.group(1)), importlib.import_module(f"{__name__}.{info.name}")))
    found.sort(key=lambda pair: pair[0])
    versions = [version for version, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise RuntimeError(f"migration versions must be 1..N without gaps, got {versions}")
    return found


def apply(conn: apsw.Connection, module: ModuleType) -> None:
    """One version's step (inside the caller's transaction): its SQL, then its Python."""
    conn.execute(module.SQL)
    step = getattr(module, "migrate", None)
    if step is not None:
        step(conn)
