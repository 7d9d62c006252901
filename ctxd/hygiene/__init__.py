"""Context hygiene: what keeps a session's context small without losing a byte — tool
results offloaded to ``tool_result_blobs`` (docs/architecture.md), and the prompt builder
(docs/protocol.md, Prompt builder). The session actor calls it and stages its rows in its
own transactions."""

from ctxd.hygiene._offload import (
    HEAD_CHARS,
    LINE_CHARS,
    BlobInfo,
    ToolResultBlob,
    compile_pattern,
    grep,
    is_error_result,
    load_blob,
    offload,
    originals,
    page,
    stage_blobs,
    stub_text,
)
from ctxd.hygiene._prompt import register as register_prompt

__all__ = ["HEAD_CHARS", "LINE_CHARS", "BlobInfo", "ToolResultBlob", "compile_pattern", "grep",
           "is_error_result", "load_blob", "offload", "originals", "page", "register_prompt",
           "stage_blobs", "stub_text"]
