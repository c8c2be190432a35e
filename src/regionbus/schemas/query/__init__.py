"""One-shot OQL queries (Geode ``QueryService.newQuery(oql).execute(params)``): the query
language of continuous queries plus projections, ``ORDER BY``, ``LIMIT`` and bind
parameters, parsed and bound (:mod:`.parser`) and evaluated bucket by bucket, then merged
(:mod:`.rows`). Shared by the client, which checks a query before sending it and merges
the answers, and the bucket primaries, which run it on their entries."""

from regionbus.schemas.query.parser import (
    MAX_BOUND_VALUES,
    MAX_PARAMETER_CHARS,
    OrderItem,
    ParsedQuery,
    Projection,
    parse_query,
)
from regionbus.schemas.query.rows import OrderKeys, Struct, element, is_selected, merged, project
from regionbus.schemas.query.rules import QUERY_RULES

__all__ = [
    "MAX_BOUND_VALUES",
    "MAX_PARAMETER_CHARS",
    "QUERY_RULES",
    "OrderItem",
    "OrderKeys",
    "ParsedQuery",
    "Projection",
    "Struct",
    "element",
    "is_selected",
    "merged",
    "parse_query",
    "project",
]
