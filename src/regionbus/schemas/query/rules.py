"""The rules of the OQL regionbus runs as one-shot queries, as named in
``QueryInvalidError.rule``.

One-shot queries read the OQL of continuous queries (`regionbus.schemas.cq.rules`) and add
projections, ``DISTINCT``, aggregates (``COUNT``, ``SUM``, ``AVG``, ``MIN``, ``MAX``),
``GROUP BY``, ``ORDER BY``, ``LIMIT`` and bind parameters (Geode ``Query.execute(params)``),
over one region: its values (``FROM /r x``), its entries (``FROM /r.entries e``: ``e.key``,
``e.value``) or its keys (``FROM /r.keys k``). What the servers cannot run bucket by bucket
and merge (joins, subqueries, functions other than the aggregates) is refused with the rule
it breaks; so is a projection beside an aggregate that is not a GROUP BY expression (rule
``group-by``).
"""

from __future__ import annotations

from typing import Final

from regionbus.schemas.cq.rules import (
    BIND_PARAMETER,
    CQ_RULES,
    DISTINCT,
    GROUP_BY,
    LIKE_PATTERN,
    LIMIT,
    ONE_ITERATOR,
    ONE_REGION,
    ORDER_BY,
    PROJECTION,
    REGION_PATH,
    SYNTAX,
    UNSUPPORTED_EXPRESSION,
    WHERE_REGION,
)

PARAMETERS: Final = "parameters"
"""The bind parameters given do not fit the query: another count than the highest ``$n``
it uses (Geode ``QueryParameterCountInvalidException``), a value of a type OQL here has no
literal for, a LIMIT that is not a non-negative integer, more values or longer strings than
`regionbus.schemas.query.parser` allows."""

QUERY_RULES: Final = (
    *(r for r in CQ_RULES if r not in (PROJECTION, ORDER_BY, LIMIT, BIND_PARAMETER)),
    PARAMETERS,
)
"""Every rule, in the order a query is checked (the parameters last, when it is run): the
CQs' rules but those one-shot queries lift."""

__all__ = [
    "DISTINCT",
    "GROUP_BY",
    "LIKE_PATTERN",
    "ONE_ITERATOR",
    "ONE_REGION",
    "PARAMETERS",
    "QUERY_RULES",
    "REGION_PATH",
    "SYNTAX",
    "UNSUPPORTED_EXPRESSION",
    "WHERE_REGION",
]
