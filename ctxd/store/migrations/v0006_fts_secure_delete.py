"""Version 6: the memories' full-text index forgets a deleted memory's words at once.

FTS5 records a delete as a tombstone beside the entry it cancels, so a deleted memory's
words stayed readable in ``memories_fts_data`` until segments happened to merge; with its
``secure-delete`` option a delete removes them (docs/security.md "Deleted data"). The
rebuild drops what the deletes before this version left behind.
"""

SQL = """
INSERT INTO memories_fts (memories_fts, rank) VALUES ('secure-delete', 1);
INSERT INTO memories_fts (memories_fts) VALUES ('rebuild');
"""
