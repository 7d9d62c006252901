"""Context hygiene: what keeps a session's context small without losing a byte — tool
results offloaded to ``tool_result_blobs`` (docs/architecture.md), the compaction chain's
choices and its summarizers, snapshots in ``session_snapshots``, the prompt builder
(docs/protocol.md, Prompt builder), and tool deferral over ``session_tools``
(docs/protocol.md, Tool deferral). The session actor calls it and stages its rows in its
own transactions."""

from ctxd.hygiene._compact import (
    COMPACTION_META,
    ThreadMessage,
    clear_candidates,
    cleared_text,
    oldest_span,
    summary_text,
    truncated_text,
)
from ctxd.hygiene._offload import (
    HEAD_CHARS,
    LINE_CHARS,
    BlobInfo,
    ToolResultBlob,
    blob_refs,
    compile_pattern,
    grep,
    is_error_result,
    load_blob,
    offload,
    originals,
    page,
    ref_id_for,
    result_size,
    stage_blobs,
    stub_text,
)
from ctxd.hygiene._prompt import register as register_prompt
from ctxd.hygiene._snapshots import Snapshot, drop_snapshot_after, load_snapshot, save_snapshot
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
    "COMPACTION_META",
    "HEAD_CHARS",
    "LINE_CHARS",
    "BlobInfo",
    "SessionTool",
    "Snapshot",
    "Summarizer",
    "SummarizerError",
    "ThreadMessage",
    "ToolResultBlob",
    "blob_refs",
    "called_tools",
    "check_tools",
    "clear_candidates",
    "cleared_text",
    "compile_pattern",
    "counted_form",
    "defer",
    "deferred_note",
    "drop_snapshot_after",
    "grep",
    "is_error_result",
    "load_blob",
    "load_snapshot",
    "load_tools",
    "make_summarizer",
    "offload",
    "oldest_span",
    "originals",
    "page",
    "rank",
    "ref_id_for",
    "register_prompt",
    "result_size",
    "save_snapshot",
    "stage_blobs",
    "stage_promote",
    "stage_register",
    "stage_use",
    "stub_text",
    "summary_text",
    "truncated_text",
]
