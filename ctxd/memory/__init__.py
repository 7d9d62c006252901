"""Memory: ReasoningBank items, hybrid FTS5 + FAISS retrieval, embedders."""

from ctxd.memory._build import CODES, REGROW, fix_code_range, lists_for
from ctxd.memory._embedders import (
    Embedder,
    EmbedderError,
    HashingEmbedder,
    HttpEmbedder,
    SentenceTransformerEmbedder,
    feature_bucket,
    make_embedder,
    stem,
)
from ctxd.memory._index import MemoryIndex
from ctxd.memory._injection import INJECT_SHARE, PROMPT_HEADER, Injected
from ctxd.memory._lexical import LOAD_CHUNK, LexicalIndex
from ctxd.memory._methods import (
    memory_context,
    memory_delete,
    memory_feedback,
    memory_get,
    memory_outcome,
    memory_reindex,
    memory_share,
)
from ctxd.memory._queries import PRIOR_RECORDED, MemoryCandidate, NewMemory, by_ids, insert, lexical
from ctxd.memory._retrieval import fuse
from ctxd.memory._service import Memory
from ctxd.wire.types import project_scope

__all__ = ["CODES", "INJECT_SHARE", "LOAD_CHUNK", "PRIOR_RECORDED", "PROMPT_HEADER", "REGROW",
           "Embedder",
           "EmbedderError", "HashingEmbedder", "HttpEmbedder", "Injected", "LexicalIndex", "Memory",
           "MemoryCandidate", "MemoryIndex", "NewMemory", "SentenceTransformerEmbedder", "by_ids",
           "feature_bucket", "fix_code_range", "fuse", "insert", "lexical", "lists_for",
           "make_embedder", "memory_context", "memory_delete", "memory_feedback", "memory_get",
           "memory_outcome", "memory_reindex", "memory_share", "project_scope", "stem"]
