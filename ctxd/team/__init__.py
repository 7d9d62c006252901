"""Team memory: memories of shared scopes (``team:<name>``, ``org:<name>``) kept in a
PostgreSQL database that teammates' ctxds share (docs/decisions.md, "Team memory")."""

from ctxd.team._link import TeamLink, redacted
from ctxd.team._postgres import (
    CHANNEL,
    Applied,
    Change,
    Delete,
    Listener,
    Operation,
    Record,
    Signal,
    apply,
    changes_since,
    content_key,
    last_change,
    migrate,
)

__all__ = ["CHANNEL", "Applied", "Change", "Delete", "Listener", "Operation", "Record",
           "Signal", "TeamLink", "apply", "changes_since", "content_key",
           "last_change", "migrate", "redacted"]
