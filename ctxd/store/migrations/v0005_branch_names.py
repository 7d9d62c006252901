"""Version 5: the columns of ``branches`` take the names a branch has on the wire and in
the code (one shape per entity: docs/architecture.md)."""

SQL = """
ALTER TABLE branches RENAME COLUMN id TO branch_id;
ALTER TABLE branches RENAME COLUMN parent_id TO parent_branch_id;
ALTER TABLE branches RENAME COLUMN tokens_used TO budget_used;
ALTER TABLE branches RENAME COLUMN operations TO operations_count;
ALTER TABLE branches RENAME COLUMN warned TO budget_warned;
ALTER TABLE branches RENAME COLUMN timeout_s TO timeout_seconds;
ALTER TABLE branches RENAME COLUMN deadline_at TO deadline;
"""
