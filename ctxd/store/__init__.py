"""Storage: the single apsw writer connection and the schema migrations."""

from ctxd.store._store import (
    Store,
    Transaction,
    WorkerThread,
    migrate,
    scalar_int,
    schema_version,
)

__all__ = ["Store", "Transaction", "WorkerThread", "migrate", "scalar_int", "schema_version"]
