"""Giving the C heap's freed memory back to the system after a load or a rebuild of the
memory indexes (docs/decisions.md, Memory)."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger("ctxd.memory")


def _malloc_trim() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"),
                       "malloc_trim", None)
    except OSError:
        return None


_TRIM = _malloc_trim()


def give_back_freed_memory() -> None:
    """Return the heap's free pages to the system (glibc's ``malloc_trim``; nothing where
    there is none). Blocking: tens of milliseconds on a heap of gigabytes.

    Tokenizing a million memories frees as much as the mirror it leaves (its token lists,
    the postings' regions as they grew); glibc keeps what it freed in the heap, so the
    daemon held 2.3 GB after such a load against 1.9 GB after a load from the file.
    """
    if _TRIM is not None:
        _TRIM(0)  # type: ignore[operator]
