"""Version 15: the gateway's sent ledger (docs/decisions.md, Gateway).

One row per message position of an agent's conversation as the gateway last saw it, by
``thread`` (a digest of the system prompt: an agent's side requests, with prompts of their
own, keep ledgers of their own and do not disturb the conversation's): the
digest of the agent's message (its ``cache_control`` marks left out), the exact JSON the
gateway sent in its place (NULL: left out, folded or compacted away), the tokens of each,
and the seq of the first ctxd message it was recorded as (NULL: nothing to record, such as
a message of only thinking blocks); on the message that called ``compact_context``, the
summary that stands for the messages before it (NULL: none). A message's sent bytes are
decided once and read back on every later request, so the prompt cache's prefix holds;
folds are worked out from the history itself, so a rewind past a fold's end undoes it.
"""

SQL = """
CREATE TABLE gateway_ledger (
    session_id   TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    thread       BLOB NOT NULL,
    position     INTEGER NOT NULL,
    digest       BLOB NOT NULL,
    sent         BLOB,
    agent_tokens INTEGER NOT NULL,
    sent_tokens  INTEGER NOT NULL,
    first_seq    INTEGER,
    compaction   BLOB,
    compaction_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, thread, position)
) STRICT, WITHOUT ROWID;
"""
