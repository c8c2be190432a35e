"""A ``CacheLoader`` that reads a key's value from a SQL table, through SQLAlchemy.

Read-through over a database, as Geode's JDBC connector loader does (``JdbcLoader``): a
get that misses in the region reads one row, ``SELECT value_column FROM table WHERE
key_column = :key``, and the value is created in the region. Give it to a server in code::

    CacheServer(settings, loaders={"prices": SqlLoader("sqlite:///prices.db", "prices")})

or name a subclass that knows its database in the ``plugins`` setting::

    class PricesLoader(SqlLoader):
        def __init__(self) -> None:
            super().__init__(os.environ["PRICES_DB_URL"], "prices")

    # REGIONBUS_PLUGINS='{"prices": ["myapp.loaders:PricesLoader"]}'

A text or number column's value is stored as JSON, a binary column's as bytes
(`regionbus.broker.loading.loaded_bytes`); no row means no value (the get answers None and
nothing is created).

Needs the package's ``sql`` extra (SQLAlchemy): without it, importing this module raises
:class:`regionbus.schemas.errors.ExtraNotInstalledError`, and a server whose ``plugins``
name a subclass fails to start with a ``ConfigurationError`` saying so.
"""

from __future__ import annotations

from typing import Any

from regionbus.schemas.callbacks import CacheLoader, LoaderHelper
from regionbus.schemas.errors import ExtraNotInstalledError

try:
    import sqlalchemy as sa
except ImportError as missing:
    raise ExtraNotInstalledError("the SQL cache loader", "sql", ("sqlalchemy",)) from missing


class SqlLoader(CacheLoader):
    """Loads a missed key's value from one column of a table.

    Args:
        url: The SQLAlchemy database URL (``postgresql+psycopg://...``, ``sqlite:///f.db``).
        table: The table's name.
        key_column: The column holding the region's keys (text).
        value_column: The column holding the values.
        engine_options: More ``sqlalchemy.create_engine`` options (pool size, ...).

    Raises:
        sqlalchemy.exc.ArgumentError: the URL is not one SQLAlchemy reads.
    """

    def __init__(
        self,
        url: str,
        table: str,
        key_column: str = "key",
        value_column: str = "value",
        **engine_options: Any,
    ) -> None:
        self._engine = sa.create_engine(url, **engine_options)
        columns = sa.table(table, sa.column(key_column), sa.column(value_column))
        self._select = sa.select(columns.c[value_column]).where(
            columns.c[key_column] == sa.bindparam("key")
        )

    def load(self, helper: LoaderHelper) -> Any:
        """The value column of the row whose key column is ``helper.key``; None when there
        is no such row.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (the get hears
                ``CacheLoaderError``).
        """
        with self._engine.connect() as connection:
            return connection.execute(self._select, {"key": helper.key}).scalar_one_or_none()

    def close(self) -> None:
        """Close the engine's connections."""
        self._engine.dispose()


__all__ = ["SqlLoader"]
