"""The model gateway: an agent's model requests, reconciled with its session and sent with
the session's substitutions (docs/architecture.md, Gateway)."""

from ctxd.gateway._rewrite import Api, Endpoint, GatewayRequest, Prepared, prepare, session_of

__all__ = ["Api", "Endpoint", "GatewayRequest", "Prepared", "prepare", "session_of"]
