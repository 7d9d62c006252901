"""The lexical mirror's file: its postings saved, so that a start loads them instead of
tokenizing every memory again (docs/decisions.md, Memory: the mirror's file).

At 100,000 memories tokenizing them all takes about 9 s, during which FTS5 ranks (40 ms
and more a query); reading the file and checking it against SQLite takes well under a
second. The file is a cache: SQLite is the truth. It holds, per scope, the memory ids in
slot order, their lengths in tokens and their postings by term (the terms, how many
postings each, then all slots and all frequencies, term after term); `LexicalIndex`
compares it with the memories SQLite holds when it loads it (a memory deleted since is
left out, one recorded or moved since is tokenized), so a file of any age gives the
mirror SQLite's memories. Confidence is not in it: it is read from SQLite.

Saved atomically (temp file + rename) as an uncompressed ``.npz``: every array carries
its zip CRC, checked as it is read, so a damaged file is refused, not loaded.
"""

from __future__ import annotations

import os
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

MAX_ID = 1 << 40
"""A file naming a memory id past this is refused (the mirror sizes arrays by id)."""
FORMAT = 1
"""Bumped when the layout or the tokenizer changes: a file of another format is not read."""


@dataclass
class ShardImage:
    """One scope's part of the mirror, as saved."""

    scope: str
    ids: npt.NDArray[np.int32]
    """Slot → memory id (-1: a deleted memory's slot)."""
    length: npt.NDArray[np.float64]
    terms: list[str]
    sizes: npt.NDArray[np.int64]
    """Postings per term, in the order of ``terms``."""
    slots: npt.NDArray[np.int32]
    """Every term's slots, ascending, term after term."""
    frequencies: npt.NDArray[np.uint16]


@dataclass
class MirrorImage:
    """The mirror's postings, for the file."""

    max_id: int
    """The highest memory id the mirror held: those above it are not in the image."""
    shards: list[ShardImage]


def starts_of(sizes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Where each of regions of these sizes starts when they lie one after another."""
    starts = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    return starts


def gathered(starts: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
             ) -> npt.NDArray[np.int64]:
    """The pool positions of regions (``starts``, ``sizes``), region after region: what
    to take from the pool to lay them one after another."""
    return np.repeat(starts - starts_of(sizes), sizes) + np.arange(int(sizes.sum()))


class Capture:
    """What the store's thread takes of a shard (copies of its small arrays, the pool's
    arrays themselves) for another thread to turn into a `ShardImage`: the mirror never
    changes a region of the pool under the postings it holds (appends go past them, a
    changed region is copied elsewhere, a compaction makes new arrays)."""

    def __init__(self, scope: str, ids: Any, length: Any, terms: list[str], starts: Any,
                 sizes: Any, slots: Any, frequencies: Any):
        self.scope, self.ids, self.length, self.terms = scope, ids, length, terms
        self.starts, self.sizes = starts, sizes
        self.slots, self.frequencies = slots, frequencies

    def image(self) -> ShardImage:
        kept = self.sizes > 0
        sizes = self.sizes[kept].astype(np.int64)
        terms = [term for term, keep in zip(self.terms, kept.tolist(), strict=True) if keep]
        taken = gathered(self.starts[kept], sizes)
        return ShardImage(self.scope, self.ids, self.length, terms, sizes,
                          self.slots[taken], self.frequencies[taken])


def write(path: Path, max_id: int, captures: list[Capture]) -> None:
    """Write the mirror's image to ``path`` atomically (blocking).

    Raises:
        OSError: the file could not be written.
    """
    arrays: dict[str, Any] = {"format": np.array([FORMAT, max_id, len(captures)], np.int64)}
    for at, capture in enumerate(captures):
        shard = capture.image()
        arrays[f"{at}_scope"] = np.frombuffer(shard.scope.encode(), np.uint8)
        arrays[f"{at}_ids"] = shard.ids
        arrays[f"{at}_length"] = shard.length
        arrays[f"{at}_terms"] = np.frombuffer("\n".join(shard.terms).encode(), np.uint8)
        arrays[f"{at}_sizes"] = shard.sizes
        arrays[f"{at}_slots"] = shard.slots
        arrays[f"{at}_frequencies"] = shard.frequencies
    # A name of its own: a save abandoned at shutdown may still be writing its own.
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with temporary.open("wb") as file:
        np.savez(file, **arrays)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


class Unreadable(Exception):
    """The file is damaged, of another format, or inconsistent; the message says how."""


def read(path: Path) -> MirrorImage | None:
    """The image in ``path`` (blocking); None when there is no file.

    Raises:
        Unreadable: the file cannot be used (it is then ignored and written again).
    """
    try:
        with path.open("rb") as file, np.load(file, allow_pickle=False) as saved:
            header = saved["format"]
            if header.shape != (3,) or int(header[0]) != FORMAT:
                raise Unreadable(f"format {header.ravel()[:1].tolist()}, not {FORMAT}")
            max_id, count = int(header[1]), int(header[2])
            if not 0 <= max_id < MAX_ID or not 0 <= count <= len(saved.files):
                raise Unreadable(f"a header of {max_id} and {count} shards")
            shards = [_shard(saved, at, max_id) for at in range(count)]
    except FileNotFoundError:
        return None
    except (OSError, KeyError, ValueError, TypeError, IndexError, zipfile.BadZipFile,
            UnicodeDecodeError) as exc:
        raise Unreadable(str(exc) or type(exc).__name__) from exc
    return MirrorImage(max_id, shards)


def _shard(saved: Any, at: int, max_id: int) -> ShardImage:
    terms_text = bytes(saved[f"{at}_terms"]).decode()
    terms = terms_text.split("\n") if terms_text else []
    shard = ShardImage(bytes(saved[f"{at}_scope"]).decode(),
                       saved[f"{at}_ids"].astype(np.int32, copy=False),
                       saved[f"{at}_length"].astype(np.float64, copy=False), terms,
                       saved[f"{at}_sizes"].astype(np.int64, copy=False),
                       saved[f"{at}_slots"].astype(np.int32, copy=False),
                       saved[f"{at}_frequencies"].astype(np.uint16, copy=False))
    count = len(shard.ids)
    if any(array.ndim != 1 for array in (shard.ids, shard.length, shard.sizes, shard.slots,
                                          shard.frequencies)):
        raise Unreadable(f"scope {shard.scope!r}: an array of more than one dimension")
    if (len(shard.sizes) != len(terms) or len(set(terms)) != len(terms)
            or (count and int(shard.ids.max()) > max_id)
            or len(np.unique(shard.ids[shard.ids >= 0])) != int((shard.ids >= 0).sum())
            or int(shard.sizes.sum()) != len(shard.slots)
            or len(shard.frequencies) != len(shard.slots) or len(shard.length) != count
            or (len(shard.slots) and (int(shard.slots.min()) < 0
                                      or int(shard.slots.max()) >= count))
            or (len(shard.sizes) and int(shard.sizes.min()) <= 0)):
        raise Unreadable(f"scope {shard.scope!r}: its arrays do not agree")
    return shard
