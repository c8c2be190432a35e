"""One-shot OQL queries (Geode ``QueryService.newQuery(oql).execute(params)``): the query
language of continuous queries plus projections, ``DISTINCT``, aggregates, ``GROUP BY``,
``ORDER BY``, ``LIMIT`` and bind parameters, parsed and bound (:mod:`.parser`) and
evaluated bucket by bucket, then merged (:mod:`.rows`, :mod:`.aggregates`). Shared by the
client, which checks a query before sending it and merges the answers, and the bucket
primaries, which run it on their entries."""

from regionbus.schemas.query.aggregates import PARTIAL_SERIALIZER, Groups, distinct_rows, frozen
from regionbus.schemas.query.parser import (
    AGGREGATES,
    MAX_BOUND_VALUES,
    MAX_PARAMETER_CHARS,
    Aggregate,
    OrderItem,
    ParsedQuery,
    Projection,
    parse_query,
)
from regionbus.schemas.query.rows import (
    OrderKeys,
    Struct,
    element,
    grouped_results,
    is_selected,
    merged,
    project,
    selected_rows,
)
from regionbus.schemas.query.rules import QUERY_RULES

__all__ = [
    "AGGREGATES",
    "MAX_BOUND_VALUES",
    "MAX_PARAMETER_CHARS",
    "PARTIAL_SERIALIZER",
    "QUERY_RULES",
    "Aggregate",
    "Groups",
    "OrderItem",
    "OrderKeys",
    "ParsedQuery",
    "Projection",
    "Struct",
    "distinct_rows",
    "element",
    "frozen",
    "grouped_results",
    "is_selected",
    "merged",
    "parse_query",
    "project",
    "selected_rows",
]
