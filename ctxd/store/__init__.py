"""Storage: the single apsw writer connection, the schema migrations, checks and recovery."""

from ctxd.store._recover import recover
from ctxd.store._store import (
    MARKER,
    DatabaseError,
    Store,
    Transaction,
    WorkerThread,
    integrity_problems,
    migrate,
    scalar_int,
    schema_version,
)

__all__ = ["MARKER", "DatabaseError", "Store", "Transaction", "WorkerThread",
           "integrity_problems", "migrate", "recover", "scalar_int", "schema_version"]
