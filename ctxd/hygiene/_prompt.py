"""The prompt builder: prompt.build orders a system prompt's sections static → dynamic and
says where its cache breakpoints go (docs/protocol.md, Prompt builder). Owns no table."""

from __future__ import annotations

from collections.abc import Sequence

from ctxd.errors import CtxdError, ErrorCode, params_error
from ctxd.memory import Memory, project_scope
from ctxd.tokens import TokenCounter
from ctxd.wire.types import (
    PROMPT_FORMATS,
    CacheBreakpoint,
    MemoryListParams,
    PromptBuildParams,
    PromptBuildResult,
    PromptSection,
    PromptSectionInfo,
    SessionResult,
    SystemBlock,
)

KNOWN_SECTIONS: dict[str, bool] = {
    "base_instructions": True,
    "project_rules": True,
    "memories": True,
    "skills": True,
    "scratchpad": False,
    "context_status": False,
}
"""The known section names in their order (static → dynamic), each with whether it is
cacheable when the caller does not say."""
SEPARATOR = "\n\n"
"""Between two sections' contents in the prompt's text."""
MAX_BREAKPOINTS = 4
"""Anthropic's limit on ``cache_control`` blocks in one request."""
SESSION_MEMORIES = 10
"""The most memories a session's prompt carries (its project's oldest: the ones that stay)."""
EPHEMERAL = {"type": "ephemeral"}


def order_sections(sections: Sequence[PromptSection]) -> list[tuple[PromptSection, bool]]:
    """The sections in prompt order, each with whether it is cacheable.

    Cacheable sections first, then the others; within each group the known names in
    their order (`KNOWN_SECTIONS`), then the other names in the order given
    (docs/decisions.md, Context hygiene).
    """
    ranks = {name: rank for rank, name in enumerate(KNOWN_SECTIONS)}
    resolved = [(section, section.cacheable if section.cacheable is not None
                 else KNOWN_SECTIONS.get(section.name, False)) for section in sections]
    order = sorted(range(len(resolved)), key=lambda index: (
        not resolved[index][1], ranks.get(resolved[index][0].name, len(ranks)), index))
    return [resolved[index] for index in order]


def breakpoint_indexes(cacheable: int) -> list[int]:
    """Which of the first ``cacheable`` sections (all cacheable) get a breakpoint: the last
    one always, and the earliest others while fewer than `MAX_BREAKPOINTS` are taken.

    A change in a section invalidates every cached prefix that includes it; the earliest
    sections change least (static → dynamic), so their prefixes earn their own entry.
    """
    if cacheable == 0:
        return []
    return [*range(min(cacheable - 1, MAX_BREAKPOINTS - 1)), cacheable - 1]


def check_params(p: PromptBuildParams) -> None:
    """What the types cannot say: exactly one source, unique names, a known format.

    Raises:
        CtxdError: -32602 naming the field to fix.
    """
    if (p.session_id is None) == (p.sections is None):
        raise params_error("$", "give exactly one of session_id and sections")
    if p.format not in PROMPT_FORMATS:
        error = params_error("$.format", f"unknown format {p.format!r}; one of "
                             + ", ".join(PROMPT_FORMATS))
        raise CtxdError(ErrorCode.INVALID_PARAMS, error.message,
                        (error.data or {}) | {"allowed": list(PROMPT_FORMATS)})
    seen: set[str] = set()
    for index, section in enumerate(p.sections or ()):
        if section.name in seen:
            raise params_error(f"$.sections[{index}].name",
                               f"section name {section.name!r} given twice; names must be "
                               "unique")
        seen.add(section.name)


async def build(counter: TokenCounter, sections: Sequence[PromptSection],
                prompt_format: str) -> PromptBuildResult:
    """The prompt of ``sections``: its text, exact tokens and cache breakpoints.

    Cancellation: while counting, between chunks of text (`TokenCounter.count_texts`).
    """
    ordered = order_sections(sections)
    text_parts: list[str] = []
    offsets: list[int] = []
    position = 0
    for index, (section, _) in enumerate(ordered):
        if index:
            text_parts.append(SEPARATOR)
            position += len(SEPARATOR)
        offsets.append(position)
        text_parts.append(section.content)
        position += len(section.content)
    text = "".join(text_parts)
    cacheable = sum(1 for _, is_cacheable in ordered if is_cacheable)
    marks = breakpoint_indexes(cacheable)
    ends = [offsets[index] + len(ordered[index][0].content) for index in marks]
    counts = await counter.count_texts([section.content for section, _ in ordered]
                                       + [text] + [text[:end] for end in ends])
    section_tokens, total, prefix_tokens = (counts[:len(ordered)], counts[len(ordered)],
                                            counts[len(ordered) + 1:])
    infos = [PromptSectionInfo(name=section.name, cacheable=is_cacheable,
                               tokens=section_tokens[index], offset=offsets[index],
                               length=len(section.content))
             for index, (section, is_cacheable) in enumerate(ordered)]
    breakpoints = [CacheBreakpoint(section=ordered[index][0].name, index=index, offset=end,
                                   prefix_tokens=tokens)
                   for index, end, tokens in zip(marks, ends, prefix_tokens, strict=True)]
    system = None
    if prompt_format == "anthropic":
        marked = set(marks)
        system = [SystemBlock(type="text", text=section.content,
                              cache_control=dict(EPHEMERAL) if index in marked else None)
                  for index, (section, _) in enumerate(ordered)]
    return PromptBuildResult(format=prompt_format, text=text, tokens=total, sections=infos,
                             cache_breakpoints=breakpoints, system=system)


async def session_sections(session: SessionResult, memory: Memory) -> list[PromptSection]:
    """What ctxd knows of a session, as sections: ``memories`` (cacheable: the oldest
    `SESSION_MEMORIES` memories in the scope of its project, without their confidence, which
    moves) when there are any, and ``context_status`` (its usage and health)."""
    sections = []
    listed = await memory.list(MemoryListParams(scope=project_scope(session.session.project),
                                                limit=SESSION_MEMORIES))
    if listed.memories:
        lines = [f"- {item.title}: {item.content}" for item in listed.memories]
        sections.append(PromptSection(
            name="memories", cacheable=True,
            content="Memories from earlier work:\n" + "\n".join(lines)))
    state = session.context_state
    sections.append(PromptSection(
        name="context_status", cacheable=False,
        content=f"[Context: {round(state.usage * 100)}% used ({state.total_tokens:,} of "
                f"{state.effective_window:,} tokens); health: {state.health}.]"))
    return sections
