"""Shard addresses as people and logs may see them: without the password."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from asynctier.platform.errors import ConfigError


def redact_dsn(dsn: str) -> str:
    """``postgresql://user@host:port/dbname`` of ``dsn`` (URL or key=value), password
    left out; raises ConfigError when ``dsn`` is not a connection string."""
    try:
        parts = conninfo_to_dict(dsn)
    except Exception as exc:  # psycopg.ProgrammingError; never echo the DSN itself
        raise ConfigError("a queue shard's address is not a PostgreSQL connection string: "
                          "write postgresql://user@host:port/dbname") from exc
    user = f"{parts['user']}@" if parts.get("user") else ""
    host = str(parts.get("host") or "localhost")
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{host}{port}/{parts.get('dbname') or ''}"
