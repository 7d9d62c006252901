"""Context hygiene: what keeps a session's context small without losing a byte — tool
results offloaded to ``tool_result_blobs`` (docs/architecture.md), the prompt builder
(docs/protocol.md, Prompt builder), and tool deferral over ``session_tools``
(docs/protocol.md, Tool deferral). The session actor calls it and stages its rows in its
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
from ctxd.hygiene._summarize import Summarizer, SummarizerError, make_summarizer
from ctxd.hygiene._tools import (
    SessionTool,
    called_tools,
    check_tools,
    counted_form,
    defer,
    deferred_note,
    load_tools,
    rank,
    stage_promote,
    stage_register,
    stage_use,
)

__all__ = [
    "HEAD_CHARS",
    "LINE_CHARS",
    "BlobInfo",
    "SessionTool",
    "Summarizer",
    "SummarizerError",
    "ToolResultBlob",
    "called_tools",
    "check_tools",
    "compile_pattern",
    "counted_form",
    "defer",
    "deferred_note",
    "grep",
    "is_error_result",
    "load_blob",
    "load_tools",
    "make_summarizer",
    "offload",
    "originals",
    "page",
    "rank",
    "register_prompt",
    "stage_blobs",
    "stage_promote",
    "stage_register",
    "stage_use",
    "stub_text",
]
