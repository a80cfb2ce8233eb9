"""Versioned migrations of the queue's schema, applied at start.

The SQL files of ``asynctier/queue/migrations/`` (``0001_init.sql``, ...) are applied in
order, each recorded in ``asynctier_queue_migrations``, all in one transaction under an
advisory lock: two processes starting at once apply each file once, the second waits and
finds nothing left to do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg

#: The advisory lock key every migrating process takes (any constant; "asyq" in ASCII).
MIGRATION_LOCK_KEY = 0x61737971
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS asynctier_queue_migrations (
    version    integer PRIMARY KEY,
    name       text    NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class Migration:
    """One SQL file: its version (the number in its name), name and text."""

    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """Every migration shipped with the package, in version order."""
    found = []
    for entry in resources.files("asynctier.queue").joinpath("migrations").iterdir():
        match = _FILE_RE.fullmatch(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text()))
    return sorted(found, key=lambda m: m.version)


def migrate(conn: psycopg.Connection[tuple[object, ...]]) -> list[int]:
    """Apply the migrations not applied yet, in one transaction; returns their versions."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute(_CREATE_LEDGER)
        done = {row[0] for row in conn.execute("SELECT version FROM asynctier_queue_migrations")}
        applied = []
        for migration in migrations():
            if migration.version in done:
                continue
            conn.execute(migration.sql.encode())
            conn.execute("INSERT INTO asynctier_queue_migrations (version, name) VALUES (%s, %s)",
                         (migration.version, migration.name))
            applied.append(migration.version)
    return applied
