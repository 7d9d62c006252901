"""Context hygiene: the prompt builder (docs/protocol.md, Prompt builder)."""

from ctxd.hygiene._prompt import register as register_prompt

__all__ = ["register_prompt"]
