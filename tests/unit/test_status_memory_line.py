"""`ctxctl status`'s memory line: the memories, and what search still waits for."""

from typing import Any

import pytest

from ctxclient._cli_daemon import memory_line


def _index(**changed: Any) -> dict[str, Any]:
    return {"state": "ready", "reason": None, "vectors": 120_000, "memories": 120_000,
            "embedder": "hashing-v1-1024", "lexical": "ready", "whole": True} | changed


@pytest.mark.parametrize(("index", "line"), [
    (_index(), "memories 120,000 (hashing-v1-1024): search ready"),
    (_index(lexical="loading", whole=False),
     "memories 120,000 (hashing-v1-1024): lexical loading"),
    (_index(vectors=119_990, whole=False),
     "memories 120,000 (hashing-v1-1024): dense 119,990 indexed"),
    (_index(state="rebuilding", vectors=0, whole=False),
     "memories 120,000 (hashing-v1-1024): dense rebuilding"),
    (_index(state="loading", lexical="loading", vectors=0, memories=1_000_000, whole=False),
     "memories 1,000,000 (hashing-v1-1024): lexical loading, dense loading"),
])
def test_the_memory_line_says_what_search_waits_for(index: dict[str, Any], line: str) -> None:
    assert memory_line(index) == line
    assert len(line) <= 80
