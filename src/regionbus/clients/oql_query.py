"""``Query``: a one-shot OQL query of a client (Geode ``Query``, made by
``QueryService.newQuery``).

``execute(*params)`` binds the parameters (refusing those that do not fit before anything
is sent), sends the query to every bucket's primary, each of which answers the entries of
its bucket the query selects, ordered and limited; the client decodes them, merges the
buckets' answers in ``ORDER BY`` order, keeps the first ``LIMIT`` and projects each row
(`regionbus.schemas.query.rows`). Geode's client sends the query to one server, which runs
it over the buckets (``PartitionedRegionQueryEvaluator``); here the buckets answer the
client directly, as every other read of the whole region does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

from regionbus.clients.cq_query import CqRegionLookup, decode_region_value
from regionbus.clients.server_proxy import CacheConnection, ServerRegionProxy
from regionbus.schemas.errors import (
    QueryInvalidError,
    QueryInvocationTargetError,
    SerializationError,
)
from regionbus.schemas.messages import OperationKind, QuerySpec, Reply
from regionbus.schemas.query import (
    ParsedQuery,
    element,
    grouped_results,
    merged,
    parse_query,
)
from regionbus.schemas.serializers import Serializer

_WHOLE_QUERY: Final = re.compile(r"\s*(select|import)\b", re.IGNORECASE)
"""A region query's predicate that is a whole query (Geode ``DefaultQueryService``'s
``QUERY_HEADER``, by which ``LocalRegion.query`` sends such a text as it is)."""


class Query:
    """A one-shot OQL query (Geode ``Query``). Make it with
    ``cache.query_service().new_query(oql)``; run it with :meth:`execute`, as often as
    wanted.

    Args:
        cache: The client cache (its pool).
        regions: Gives the serializer of a region of the cache (values are decoded with
            it; an Avro region's schema goes with the query, so the servers read its
            values' attributes).
        parsed: The query, parsed and checked.
    """

    def __init__(self, cache: CacheConnection, regions: CqRegionLookup, parsed: ParsedQuery):
        self._cache = cache
        self._regions = regions
        self._parsed = parsed

    @property
    def query_string(self) -> str:
        """The query's text (Geode ``Query.getQueryString``)."""
        return self._parsed.query

    @property
    def region_name(self) -> str:
        """The region it selects from."""
        return self._parsed.region

    def execute(self, *params: Any) -> list[Any]:
        """Run the query over the region's entries on the servers (Geode
        ``Query.execute(Object... params)``; its results are Geode's ``SelectResults``).

        Args:
            params: The values of ``$1``, ``$2``, ...: None, bool, int, float, str, or a
                list, tuple or set of those for ``IN $n``
                (`regionbus.schemas.query.ParsedQuery.bind`).

        Returns:
            The rows, in ``ORDER BY`` order (entries that tie in key order) when there is
            one: for ``SELECT *`` the values (over ``/r.entries``, a ``Struct`` of ``key``
            and ``value`` each; over ``/r.keys``, the keys), for one projection its values,
            for several a ``Struct`` each (`regionbus.schemas.query.Struct`); for
            ``COUNT(*)`` one int, how many entries the WHERE clause selects; with
            ``DISTINCT`` each equal row once; with aggregates or ``GROUP BY`` a row per
            group (one without GROUP BY), its projections' values
            (`regionbus.schemas.query.aggregates`). Invalid entries are in no result. An
            attribute a value lacks is ``UNDEFINED``.

        Raises:
            QueryInvalidError: the parameters do not fit the query (nothing was sent), or
                a server refused the query.
            QueryExecutionTimeoutError: a bucket's part took longer than the servers'
                ``query_max_execution_time_ms``.
            QueryRowLimitError: a bucket would answer more than the servers'
                ``query_max_rows_per_bucket`` rows.
            QueryTypeMismatchError: the WHERE clause, an ORDER BY item, a projection, a
                GROUP BY expression or an aggregate cannot be evaluated on some entry
                (values of different types compared, a SUM of a string).
            QueryInvocationTargetError: a value does not decode (on a server or here).
            RegionNotFoundError: the region is not defined on the servers.
            ServerTimeoutError: not every bucket answered within ``read_timeout_ms``.
        """
        bound = self._parsed.bind(params)
        serializer = self._regions.region_serializer(self.region_name)
        spec = QuerySpec(self.query_string, params, getattr(serializer, "schema_json", None))
        proxy = ServerRegionProxy(self._cache, self.region_name, "")
        replies = proxy.every_bucket(OperationKind.QUERY, query=spec)
        if bound.counting:
            return [sum(r.entry_count for r in replies)]
        if bound.grouped:  # each bucket answers a partial row per group
            return grouped_results(
                bound, [e.value for r in replies for e in r.entries if e.value is not None]
            )
        return merged(bound, self._answers(bound, replies))

    def _answers(self, bound: ParsedQuery, replies: Iterable[Reply]) -> list[list[Any]]:
        """Each bucket's answer, ``[(key, element), ...]`` in the order it was sent (a
        bucket's reply chunks arrive in order)."""
        by_bucket: dict[int, list[tuple[str, Any]]] = {}
        for reply in replies:
            rows = by_bucket.setdefault(reply.bucket, [])
            for entry in reply.entries:
                try:
                    value = decode_region_value(
                        self._regions, self.region_name, entry.value, entry.serializer
                    )
                except SerializationError as exc:
                    raise QueryInvocationTargetError(
                        f"the value of {entry.key!r} does not decode here: {exc}"
                    ) from None
                rows.append((entry.key, element(bound, entry.key, value)))
        return list(by_bucket.values())

    def __repr__(self) -> str:
        return f"Query({self.query_string!r})"


class _OneRegion:
    """The serializer of the one region a region's own query reads."""

    def __init__(self, name: str, serializer: Serializer) -> None:
        self._name = name
        self._serializer = serializer

    def region_serializer(self, name: str) -> Serializer | None:
        return self._serializer if name == self._name else None


def region_query(
    cache: CacheConnection, region: str, serializer: Serializer, predicate: object
) -> Query:
    """The query a region runs for ``Region.query(predicate)``: ``SELECT * FROM /region
    this WHERE predicate``, or the predicate itself when it is a whole query (Geode
    ``LocalRegion.query``).

    Raises:
        QueryInvalidError: the predicate is not a string, or the query does not parse or is
            outside what runs.
    """
    if not isinstance(predicate, str):
        raise QueryInvalidError(
            f"a query predicate is a str, not {type(predicate).__name__}", rule="syntax"
        )
    text = (
        predicate
        if _WHOLE_QUERY.match(predicate)
        else (f"SELECT * FROM /{region} this WHERE {predicate}")
    )
    return Query(cache, _OneRegion(region, serializer), parse_query(text))


__all__ = ["Query", "region_query"]
