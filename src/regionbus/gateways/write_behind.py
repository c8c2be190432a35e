"""A write-behind ``AsyncEventListener`` keeping a SQL table equal to a region (docs/behaviour.md
§7).

Needs the package's ``sql`` extra (SQLAlchemy): without it, importing this module raises
:class:`regionbus.schemas.errors.ExtraNotInstalledError`, and an async event queue
configured with this listener fails to start with a ``ConfigurationError`` saying so.
Any database SQLAlchemy reaches (SQLite by default, PostgreSQL with ``postgresql://...``).
Table ``<table_name>(region, key, value, serializer)``, primary key ``(region, key)``;
``value`` holds the entry's bytes as the region stores them. Each batch is one
transaction: per key only its last change in the batch counts (the queue keeps order per
key), every touched key is deleted, then the keys whose last change is a put are
inserted. Applying a batch twice therefore leaves the same table: redelivered batches
(``possible_duplicate``) are harmless.
"""

from __future__ import annotations

import os

from regionbus.gateways.async_event_queue import AsyncEvent, AsyncEventListener
from regionbus.schemas.errors import ExtraNotInstalledError
from regionbus.schemas.messages import EventKind

try:
    from sqlalchemy import (
        Column,
        Engine,
        LargeBinary,
        MetaData,
        String,
        Table,
        and_,
        create_engine,
        delete,
        insert,
        select,
    )
except ImportError as missing:
    raise ExtraNotInstalledError("the write-behind listener", "sql", ("sqlalchemy",)) from missing

DEFAULT_URL_ENV = "REGIONBUS_WRITE_BEHIND_URL"
"""Environment variable naming the database when the listener is built with no arguments."""

_DELETE_CHUNK = 500


class SqlWriteBehindListener(AsyncEventListener):
    """Mirrors regions into a SQL table.

    Args:
        url: SQLAlchemy database URL; None reads ``REGIONBUS_WRITE_BEHIND_URL``, else
            ``sqlite:///regionbus-write-behind.db``.
        table_name: The table (created if missing).
        engine: An existing engine (overrides ``url``).
    """

    def __init__(
        self,
        url: str | None = None,
        table_name: str = "region_entries",
        engine: Engine | None = None,
    ) -> None:
        if engine is None:
            url = url or os.environ.get(DEFAULT_URL_ENV, "sqlite:///regionbus-write-behind.db")
            engine = create_engine(url)
        self.engine = engine
        self.table = Table(
            table_name,
            MetaData(),
            Column("region", String(255), primary_key=True),
            Column("key", String(1024), primary_key=True),
            Column("value", LargeBinary, nullable=False),
            Column("serializer", String(64), nullable=True),
        )
        self.table.metadata.create_all(engine)

    def process_events(self, events: list[AsyncEvent]) -> bool:
        """Apply a batch in one transaction. Raises on a database error (redelivered)."""
        last: dict[tuple[str, str], AsyncEvent] = {}
        for event in events:
            last[(event.region, event.key)] = event
        t = self.table
        with self.engine.begin() as conn:
            by_region: dict[str, list[str]] = {}
            for region, key in last:
                by_region.setdefault(region, []).append(key)
            for region, keys in by_region.items():
                for start in range(0, len(keys), _DELETE_CHUNK):
                    chunk = keys[start : start + _DELETE_CHUNK]
                    conn.execute(delete(t).where(and_(t.c.region == region, t.c.key.in_(chunk))))
            rows = [
                {
                    "region": e.region,
                    "key": e.key,
                    "value": e.value_bytes,
                    "serializer": e.serializer,
                }
                for e in last.values()
                if e.kind is not EventKind.DESTROY and e.value_bytes is not None
            ]
            if rows:
                conn.execute(insert(t), rows)
        return True

    def rows(self, region: str) -> dict[str, bytes]:
        """The table's ``{key: value bytes}`` of one region."""
        t = self.table
        with self.engine.connect() as conn:
            result = conn.execute(select(t.c.key, t.c.value).where(t.c.region == region))
            return {key: bytes(value) for key, value in result}

    def close(self) -> None:
        """Release the engine's connections."""
        self.engine.dispose()


__all__ = ["DEFAULT_URL_ENV", "SqlWriteBehindListener"]
