"""Memory: ReasoningBank items, hybrid FTS5 + FAISS retrieval, embedders."""

from ctxd.memory._embedders import (
    Embedder,
    EmbedderError,
    HashingEmbedder,
    HttpEmbedder,
    SentenceTransformerEmbedder,
    make_embedder,
    stem,
)
from ctxd.memory._index import MemoryIndex
from ctxd.memory._injection import INJECT_SHARE, Injected
from ctxd.memory._methods import (
    memory_context,
    memory_delete,
    memory_feedback,
    memory_get,
    memory_outcome,
    memory_reindex,
)
from ctxd.memory._queries import MemoryCandidate
from ctxd.memory._retrieval import fuse
from ctxd.memory._service import Memory
from ctxd.wire.types import project_scope

__all__ = ["INJECT_SHARE", "Embedder", "EmbedderError", "HashingEmbedder", "HttpEmbedder",
           "Injected", "Memory", "MemoryCandidate", "MemoryIndex", "SentenceTransformerEmbedder",
           "fuse", "make_embedder", "memory_context", "memory_delete", "memory_feedback",
           "memory_get", "memory_outcome", "memory_reindex", "project_scope", "stem"]
