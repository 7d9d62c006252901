"""Version 4: each memory's content tokens as injection shows them, counted once (see
``ctxd.memory._injection``), and the encoding they were counted with."""

SQL = """
ALTER TABLE memories ADD COLUMN content_tokens INTEGER;
ALTER TABLE memory_index_state ADD COLUMN tokens_encoding TEXT;
"""
