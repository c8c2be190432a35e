"""The rules of Geode's CQ subset of OQL, as named in ``CqInvalidError.rule``.

Geode's ``CqQueryImpl.validateCq`` refuses, in this order: a DISTINCT select, a query over
more (or fewer) than one region, a WHERE clause that refers to a region, more than one
iterator in the FROM clause, a first iterator that is not a plain region path, projections
and ORDER BY. regionbus adds what docs/behaviour.md §9 also refuses (GROUP BY, LIMIT), bind
parameters (Geode runs CQs without parameters), and any expression beyond the predicates CQs
support.
"""

from __future__ import annotations

from typing import Final

SYNTAX: Final = "syntax"
"""The text is not OQL (or is longer than the limit)."""
DISTINCT: Final = "distinct"
"""``SELECT DISTINCT``: "select DISTINCT queries not supported in CQ"."""
ONE_REGION: Final = "one-region"
"""Joins, subqueries: "CQ queries must reference one and only one region"."""
WHERE_REGION: Final = "where-region"
""""The WHERE clause in CQ queries cannot refer to a region"."""
ONE_ITERATOR: Final = "one-iterator"
"""``FROM /r a, a.items b``: "CQ queries cannot have more than one iterator in the FROM
clause"."""
REGION_PATH: Final = "region-path"
"""``FROM /r.entries``: "CQ queries must have a region path only as the first iterator in
the FROM clause"."""
PROJECTION: Final = "projection"
"""``SELECT f.origin``: "CQ queries do not support projections"."""
ORDER_BY: Final = "order-by"
""""CQ queries do not support ORDER BY"."""
GROUP_BY: Final = "group-by"
"""GROUP BY (an aggregate is a projection)."""
LIMIT: Final = "limit"
"""LIMIT (docs/behaviour.md §9)."""
BIND_PARAMETER: Final = "bind-parameter"
"""``$1``: CQs run without parameters."""
UNSUPPORTED_EXPRESSION: Final = "unsupported-expression"
"""A function or method call other than ``IS_DEFINED`` / ``IS_UNDEFINED``, an ``IN`` set
of non-literals, a LIKE pattern that is not a string literal."""

LIKE_PATTERN: Final = "like-pattern"
"""LIKE patterns that compile larger than RE2 may run on every change within bounds
(`regionbus.schemas.cq.evaluate.MAX_LIKE_PROGRAM_SIZE`; Geode sets none)."""

CQ_RULES: Final = (
    SYNTAX,
    DISTINCT,
    ONE_REGION,
    WHERE_REGION,
    ONE_ITERATOR,
    REGION_PATH,
    PROJECTION,
    ORDER_BY,
    GROUP_BY,
    LIMIT,
    BIND_PARAMETER,
    UNSUPPORTED_EXPRESSION,
    LIKE_PATTERN,
)
"""Every rule, in the order a query is checked."""

__all__ = [
    "BIND_PARAMETER",
    "CQ_RULES",
    "DISTINCT",
    "GROUP_BY",
    "LIKE_PATTERN",
    "LIMIT",
    "ONE_ITERATOR",
    "ONE_REGION",
    "ORDER_BY",
    "PROJECTION",
    "REGION_PATH",
    "SYNTAX",
    "UNSUPPORTED_EXPRESSION",
    "WHERE_REGION",
]
