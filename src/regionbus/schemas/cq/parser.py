"""Parsing a continuous query, and refusing what Geode's CQs do not support.

The grammar (``oql.lark``, read by lark's LALR(1) parser) covers more of OQL than CQs
allow, so that a query outside the subset is refused with the rule it breaks, in the order
and words of Geode's ``CqQueryImpl.validateCq``, rather than with a syntax error. The
client checks a query at ``new_cq`` and the servers again when it is executed, with this
same code.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from lark import Tree

from regionbus.schemas.cq.evaluate import LikePatterns, selects
from regionbus.schemas.cq.expressions import (
    MAX_CQ_NESTING,
    MAX_CQ_QUERY_CHARS,
    ExpressionReader,
    name_of,
    select_tree,
)
from regionbus.schemas.cq.rules import (
    BIND_PARAMETER,
    DISTINCT,
    GROUP_BY,
    LIMIT,
    ONE_ITERATOR,
    ONE_REGION,
    ORDER_BY,
    PROJECTION,
    REGION_PATH,
    WHERE_REGION,
)
from regionbus.schemas.cq.syntax import Expr, canonical_text, normalized
from regionbus.schemas.errors import CqInvalidError

REGION_ATTRIBUTES: Final = ("entries", "entryset", "values", "keys", "keyset")
"""What follows a region path in ``/r.entries`` and the like: an iterator over something
other than the region's values, which CQs refuse (Geode: "CQ queries must have a region
path only as the first iterator in the FROM clause")."""


class ParsedCq(NamedTuple):
    """A query of Geode's CQ subset, checked and normalized.

    Attributes:
        query: The text as written.
        region: The region it selects from (the path after ``FROM /``).
        predicate: The WHERE clause in normalized form (see
            `regionbus.schemas.cq.syntax.normalized`), None when there is none.
        canonical: The canonical query text: equal for equivalent queries, so the servers
            evaluate them once.
        likes: Its LIKE patterns, compiled (they live as long as the query is held).
    """

    query: str
    region: str
    predicate: Expr | None
    canonical: str
    likes: LikePatterns | None = None

    def selects(self, value: Any) -> bool:
        """Whether ``value`` is in the result set (see
        `regionbus.schemas.cq.evaluate.selects`).

        Raises:
            CqEvaluationError: the predicate cannot be evaluated on this value, or its
                LIKEs would read too much of it.
        """
        return selects(self.predicate, value, self.likes)


def parse_cq(query: object) -> ParsedCq:
    """Parse and check a CQ: ``SELECT * FROM /region [[AS] alias] [WHERE predicate]``.

    Args:
        query: The query text (at most :data:`MAX_CQ_QUERY_CHARS` characters). ``SELECT
            ALL``, a trailing ``;`` and leading ``IMPORT ...;`` clauses are accepted, as in
            Geode.

    Returns:
        The parsed query.

    Raises:
        CqInvalidError: the query does not parse or nests deeper than
            :data:`MAX_CQ_NESTING` (rule ``syntax``), breaks a rule of the CQ subset, or
            its LIKE patterns compile larger than
            `regionbus.schemas.cq.evaluate.MAX_LIKE_PROGRAM_SIZE` together (rule
            ``like-pattern``); ``rule`` names it (see :mod:`regionbus.schemas.cq.rules`).
    """
    checker = _Checker(query[:MAX_CQ_QUERY_CHARS] if isinstance(query, str) else str(query))
    return checker.check(select_tree(query, checker.refuse))


class _Checker:
    """Walks the parsed SELECT, refusing what CQs do not support, in Geode's order."""

    def __init__(self, query: str) -> None:
        self._query = query
        self._reader = ExpressionReader(self.refuse, "CQ predicates")

    def refuse(self, rule: str, message: str) -> CqInvalidError:
        return CqInvalidError(f"{message} (rule {rule})", rule=rule, query=self._query)

    def check(self, select: Tree) -> ParsedCq:
        parts = {c.data: c for c in select.children if isinstance(c, Tree)}
        if "distinct" in parts:
            raise self.refuse(DISTINCT, "select DISTINCT queries not supported in CQ")
        regions = {str(t.children[0]) for t in select.find_data("region")}
        if len(regions) != 1 or any(True for _ in select.find_data("subquery")):
            raise self.refuse(ONE_REGION, "CQ queries must reference one and only one region")
        where = parts.get("where")
        if where is not None and any(True for _ in where.find_data("region")):
            raise self.refuse(
                WHERE_REGION, "The WHERE clause in CQ queries cannot refer to a region"
            )
        iterators = parts["iterators"].children
        if len(iterators) > 1:
            raise self.refuse(
                ONE_ITERATOR, "CQ queries cannot have more than one iterator in the FROM clause"
            )
        region = self._iterator(iterators[0])
        if "projections" in parts:
            raise self.refuse(PROJECTION, "CQ queries do not support projections")
        if "order_by" in parts:
            raise self.refuse(ORDER_BY, "CQ queries do not support ORDER BY")
        if "group_by" in parts:
            raise self.refuse(GROUP_BY, "CQ queries do not support GROUP BY")
        if "limit" in parts:
            raise self.refuse(LIMIT, "CQ queries do not support LIMIT")
        if any(True for _ in select.find_data("bind_parameter")) or any(
            True for _ in select.find_data("parameter_collection")
        ):
            raise self.refuse(BIND_PARAMETER, "CQ queries do not support bind parameters")
        predicate = None if where is None else normalized(self._reader.expr(where.children[1]))
        likes = self._reader.likes()
        return ParsedCq(self._query, region, predicate, canonical_text(region, predicate), likes)

    def _iterator(self, iterator: Tree) -> str:
        path, attribute, alias = region_iterator(iterator)
        if path is None or attribute is not None:
            shown = "" if path is None else f", not /{path}.{attribute}"
            raise self.refuse(
                REGION_PATH,
                "CQ queries must have a region path only as the first iterator in the FROM "
                f"clause{shown}",
            )
        self._reader.alias = alias
        return path


def region_iterator(iterator: Tree) -> tuple[str | None, str | None, str | None]:
    """``(region, attribute, alias)`` of a FROM clause's iterator: ``/r.entries e`` is
    ``("r", "entries", "e")`` (the attribute lowercased, without ``()``), ``/r`` is
    ``("r", None, None)``; region None when the collection is not a region path."""
    alias_tree: Tree | None
    if iterator.data == "iterator_in":
        alias_tree, collection = [c for c in iterator.children if isinstance(c, Tree)]
    else:
        collection = iterator.children[0]
        named = [c for c in iterator.children[1:] if isinstance(c, Tree)]
        alias_tree = named[0] if named else None
    alias = None if alias_tree is None else name_of(alias_tree)
    if not (isinstance(collection, Tree) and collection.data == "region"):
        return None, None, alias
    path = str(collection.children[0])[1:]
    last = path.rsplit(".", 1)
    if len(last) == 2 and last[1].lower().rstrip("()") in REGION_ATTRIBUTES:
        return last[0], last[1].lower().rstrip("()"), alias
    return path, None, alias


__all__ = [
    "MAX_CQ_NESTING",
    "MAX_CQ_QUERY_CHARS",
    "REGION_ATTRIBUTES",
    "ParsedCq",
    "parse_cq",
    "region_iterator",
]
