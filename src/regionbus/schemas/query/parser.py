"""Parsing a one-shot OQL query (Geode ``QueryService.newQuery``) and binding its
parameters (Geode ``Query.execute(Object[] params)``).

The query is read with the grammar, bounds and expression reader of continuous queries
(`regionbus.schemas.cq.expressions`), so a predicate means the same in both. The client
parses and binds before sending anything; each bucket's primary parses and binds again
the text and parameters it receives, with this same code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final, Literal, NamedTuple, overload

from lark import Token, Tree

from regionbus.schemas.cq.evaluate import LikePatterns
from regionbus.schemas.cq.expressions import (
    MAX_CQ_QUERY_CHARS,
    ExpressionReader,
    name_of,
    select_tree,
)
from regionbus.schemas.cq.parser import region_iterator
from regionbus.schemas.cq.syntax import (
    Comparison,
    Defined,
    Expr,
    Junction,
    Like,
    Membership,
    Not,
    Parameter,
    Path,
)
from regionbus.schemas.cq.syntax import Literal as Constant
from regionbus.schemas.errors import QueryInvalidError
from regionbus.schemas.query.rules import (
    GROUP_BY,
    ONE_ITERATOR,
    ONE_REGION,
    PARAMETERS,
    REGION_PATH,
    SYNTAX,
    UNSUPPORTED_EXPRESSION,
    WHERE_REGION,
)

MAX_BOUND_VALUES: Final = 1_000
"""Most values the parameters of one execution may bind, a collection's members each
counting one: an ``IN $1`` set is compared with every entry a bucket reads (Geode sets no
limit)."""

MAX_PARAMETER_CHARS: Final = 4_096
"""Longest string a parameter may bind: as long as a query's text
(`regionbus.schemas.cq.expressions.MAX_CQ_QUERY_CHARS`)."""

_FUNCTIONS: Final = frozenset({"function_call", "function_star", "function_distinct"})

MAX_ITERATORS: Final = 3
"""Most iterators of a query's FROM clause, the region's and its drill-downs: the rows of
an entry are the product of its collections' sizes (Geode sets no limit)."""

_REGION_SCOPE: Final = "#region"
"""The scope name of a region iterator without an alias (no OQL name can spell it)."""

_LONG_MIN: Final = -(2**63)
_LONG_MAX: Final = 2**63 - 1

Iterates = Literal["values", "entries", "keys"]
"""What the FROM clause's iterator runs over: the region's values (``/r``, ``/r.values``),
its entries (``/r.entries``, ``/r.entrySet``: each a mapping of ``key`` and ``value``) or
its keys (``/r.keys``, ``/r.keySet``)."""

_ITERATES: Final[dict[str | None, Iterates]] = {
    None: "values",
    "values": "values",
    "entries": "entries",
    "entryset": "entries",
    "keys": "keys",
    "keyset": "keys",
}


AGGREGATES: Final = ("count", "sum", "avg", "min", "max")
"""Geode's OQL aggregate functions (``org.apache.geode.cache.query.internal.aggregate``),
by lower-case name: each takes one expression, optionally ``DISTINCT``; ``COUNT`` also
``*``."""


class Aggregate(NamedTuple):
    """An aggregate function of the SELECT list: ``function`` (one of :data:`AGGREGATES`)
    over ``argument`` evaluated on each selected element (None for ``COUNT(*)``), over its
    distinct values when ``distinct``."""

    function: str
    argument: Expr | None
    distinct: bool = False


class Projection(NamedTuple):
    """One item of the SELECT list: its field name (the alias given, else the last
    attribute of its path, else ``field<n>``: Geode names a struct's fields the same way),
    its expression over the iterator's element (or an :class:`Aggregate` over the selected
    elements, or their group), and whether the name was given (``AS``)."""

    name: str
    expr: Expr | Aggregate
    named: bool = False


class OrderItem(NamedTuple):
    """One ``ORDER BY`` item: its expression over the iterator's element (or, for a
    :attr:`ParsedQuery.grouped` query, the projection it names), and ``DESC``."""

    expr: Expr | Aggregate
    descending: bool = False


class Drill(NamedTuple):
    """An iterator after the region's (a drill-down): its name, and the path of the
    collection it runs over, led by the name of the iterator it reads (Geode
    ``CompiledIteratorDef`` over a path of an earlier iterator)."""

    alias: str
    collection: Path


class ParsedQuery(NamedTuple):
    """A one-shot query, checked; its bind parameters still ``$n`` until :meth:`bind`.

    Attributes:
        query: The text as written.
        region: The region it selects from.
        iterates: What the iterator runs over (:data:`Iterates`).
        projections: The SELECT list; empty for ``SELECT *``.
        predicate: The WHERE clause, None when there is none.
        order_by: The ``ORDER BY`` items, in order.
        limit: ``LIMIT n`` (None: no limit; a :class:`Parameter` until bound).
        parameters: The highest ``$n`` the query uses: how many parameters it takes.
        likes: Its LIKE patterns, compiled.
        counting: ``SELECT COUNT(*)``: the one row is how many elements the WHERE clause
            selects (Geode's ``COUNT`` aggregate; each bucket counts its own).
        distinct: ``SELECT DISTINCT``: equal rows are answered once.
        group_by: The ``GROUP BY`` expressions, in order.
        drills: The iterators after the region's; with any, an element is a mapping of
            each iterator's scope name to its element, one per combination
            (`regionbus.schemas.query.rows.selected_rows`), and every path is led by the
            name of the iterator it reads.
        scopes: The iterators' scope names, the region's first (``#region`` when it has
            no alias); empty without drill-downs.
        scope_names: The iterators' names as ``SELECT *`` names a row's fields (the
            region's alias, or the region's name).
    """

    query: str
    region: str
    iterates: Iterates
    projections: tuple[Projection, ...]
    predicate: Expr | None
    order_by: tuple[OrderItem, ...]
    limit: int | Parameter | None
    parameters: int
    likes: LikePatterns
    counting: bool = False
    distinct: bool = False
    group_by: tuple[Expr, ...] = ()
    drills: tuple[Drill, ...] = ()
    scopes: tuple[str, ...] = ()
    scope_names: tuple[str, ...] = ()

    @property
    def grouped(self) -> bool:
        """Rows are groups of elements: a ``GROUP BY``, or aggregates over every element
        selected (one row), other than the ``COUNT(*)`` each bucket counts itself."""
        return bool(self.group_by) or any(isinstance(p.expr, Aggregate) for p in self.projections)

    def bucket_part(self) -> ParsedQuery:
        """What each bucket's primary runs: the query itself, or for a :attr:`grouped` one
        or one with drill-downs its selection alone, every entry it selects, unordered (its
        ORDER BY, DISTINCT and LIMIT apply to groups, or to an entry's several rows, which
        only the merge of every bucket makes)."""
        if self.grouped or self.drills:
            return self._replace(order_by=(), limit=None, distinct=False)
        return self

    def bind(self, values: Sequence[Any]) -> ParsedQuery:
        """The query with each ``$n`` replaced by ``values[n - 1]``.

        Args:
            values: One value per parameter: None, bool, int (64-bit), float, str (at most
                :data:`MAX_PARAMETER_CHARS` characters), or for ``IN $n`` a list, tuple, set
                or frozenset of those; at most :data:`MAX_BOUND_VALUES` values together.

        Raises:
            QueryInvalidError: (rule ``parameters``) another count of values than
                :attr:`parameters`, a value of another type or beyond those bounds, a
                collection bound where a single value is expected or the reverse, a LIMIT
                bound to anything but a non-negative int.
        """
        binder = _Binder(self.query, values)
        if len(values) != self.parameters:
            raise binder.refuse(
                f"the query takes {self.parameters} parameters, {len(values)} were given"
            )
        limit = self.limit
        if isinstance(limit, Parameter):
            bound = values[limit.number - 1]
            if not isinstance(bound, int) or isinstance(bound, bool) or bound < 0:
                raise binder.refuse(
                    f"LIMIT ${limit.number} needs a non-negative int, got {bound!r}"
                )
            limit = bound
        return self._replace(
            projections=tuple(p._replace(expr=binder.bound(p.expr)) for p in self.projections),
            predicate=None if self.predicate is None else binder.bound(self.predicate),
            order_by=tuple(o._replace(expr=binder.bound(o.expr)) for o in self.order_by),
            limit=limit,
            parameters=0,
            group_by=tuple(binder.bound(e) for e in self.group_by),
        )


def parse_query(query: object) -> ParsedQuery:
    """Parse and check a one-shot query: ``SELECT [DISTINCT | ALL] * | COUNT(*) | item [AS
    name], ... FROM /region[.entries | .keys | .values] [[AS] alias] [WHERE predicate]
    [GROUP BY expr, ...] [ORDER BY expr [ASC | DESC], ...] [LIMIT n | $n]``, where an item
    is an expression or an aggregate (``COUNT``, ``SUM``, ``AVG``, ``MIN``, ``MAX`` of
    ``[DISTINCT] expr``, ``COUNT(*)``), with ``$n`` parameters anywhere a literal or an
    ``IN`` collection may stand (``COUNT(*)`` alone takes no ORDER BY or LIMIT). Beside an
    aggregate or a GROUP BY, every other item is a GROUP BY expression, and so is every
    ORDER BY item (or it names an item), as Geode's ``CompiledGroupBySelect`` requires.

    Raises:
        QueryInvalidError: the query does not parse or is too long or deep (rule
            ``syntax``), or breaks a rule of :data:`regionbus.schemas.query.rules.QUERY_RULES`.
    """
    checker = _Checker(query[:MAX_CQ_QUERY_CHARS] if isinstance(query, str) else str(query))
    return checker.check(select_tree(query, checker.refuse))


class _Checker:
    """Walks the parsed SELECT, refusing what one-shot queries do not support."""

    def __init__(self, query: str) -> None:
        self._query = query
        self._reader = ExpressionReader(self.refuse, "queries", parameters=True)

    def refuse(self, rule: str, message: str) -> QueryInvalidError:
        return QueryInvalidError(f"{message} (rule {rule})", rule=rule, query=self._query)

    def check(self, select: Tree) -> ParsedQuery:
        parts = {c.data: c for c in select.children if isinstance(c, Tree)}
        regions = {str(t.children[0]) for t in select.find_data("region")}
        if len(regions) != 1 or any(True for _ in select.find_data("subquery")):
            raise self.refuse(ONE_REGION, "queries must reference one and only one region")
        where = parts.get("where")
        if where is not None and any(True for _ in where.find_data("region")):
            raise self.refuse(WHERE_REGION, "the WHERE clause cannot refer to a region")
        iterators = [c for c in parts["iterators"].children if isinstance(c, Tree)]
        region, attribute, alias = region_iterator(iterators[0])
        if region is None:
            raise self.refuse(REGION_PATH, "the FROM clause must iterate over a region path")
        self._reader.alias = alias
        drills = self._drills(iterators[1:], alias)
        group_by = tuple(self._reader.expr(e) for e in _trees(parts.get("group_by")))
        # With drill-downs a COUNT(*) counts rows, not entries: an aggregate as any other.
        count = not group_by and not drills and _is_count(parts.get("projections"))
        if count and ("order_by" in parts or "limit" in parts):
            raise self.refuse(
                UNSUPPORTED_EXPRESSION, "COUNT(*) takes no ORDER BY or LIMIT here (one row)"
            )
        projections = () if count else self._projections(parts.get("projections"))
        predicate = None if where is None else self._reader.expr(where.children[1])
        named = {p.name: p.expr for p in projections if p.named}
        order_by = tuple(self._order_item(i, named) for i in _trees(parts.get("order_by")))
        self._check_groups(projections, group_by, order_by)
        limit = self._limit(parts.get("limit"))
        likes = self._reader.likes()
        used = [p.number for p in _parameters(projections, predicate, order_by, limit, group_by)]
        return ParsedQuery(
            self._query,
            region,
            _ITERATES[attribute],
            projections,
            predicate,
            order_by,
            limit,
            max(used, default=0),
            likes,
            count,
            "distinct" in parts,
            group_by,
            drills,
            self._reader.scopes,
            (alias or region, *(d.alias for d in drills)) if drills else (),
        )

    def _drills(self, iterators: list[Tree], alias: str | None) -> tuple[Drill, ...]:
        """The iterators after the region's: each over a collection of the elements before
        it (``FROM /r p, p.positions.values pos``, or ``pos IN p.positions.values``), named;
        every path of the query then names its iterator (:attr:`ExpressionReader.scopes`)."""
        if not iterators:
            return ()
        if len(iterators) >= MAX_ITERATORS:
            raise self.refuse(
                ONE_ITERATOR, f"queries have at most {MAX_ITERATORS} iterators in FROM"
            )
        scopes = [alias or _REGION_SCOPE]
        drills = []
        for iterator in iterators:
            name = region_iterator(iterator)[2]
            collection = (
                iterator.children[-1] if iterator.data == "iterator_in" else iterator.children[0]
            )
            if not (isinstance(collection, Tree) and collection.data == "path") or name is None:
                raise self.refuse(
                    ONE_ITERATOR,
                    "an iterator after the region's runs over an attribute of the ones before "
                    "it, and is named: FROM /r p, p.items i",
                )
            if name in scopes:
                raise self.refuse(SYNTAX, f"the FROM clause names {name} twice")
            self._reader.scopes = tuple(scopes)
            drills.append(Drill(name, self._reader.path(collection)))
            scopes.append(name)
        self._reader.scopes = tuple(scopes)
        return tuple(drills)

    def _check_groups(
        self,
        projections: tuple[Projection, ...],
        group_by: tuple[Expr, ...],
        order_by: tuple[OrderItem, ...],
    ) -> None:
        """Beside an aggregate or a GROUP BY, every other projection must be a GROUP BY
        expression and every ORDER BY item a projection: a row is a group, and only what
        is one value per group can be read of it (Geode ``CompiledGroupBySelect``)."""
        if not group_by and not any(isinstance(p.expr, Aggregate) for p in projections):
            if any(isinstance(o.expr, Aggregate) for o in order_by):
                raise self.refuse(GROUP_BY, "ORDER BY an aggregate needs aggregates or GROUP BY")
            return
        if not projections:
            raise self.refuse(GROUP_BY, "GROUP BY needs a projection list, not SELECT *")
        for p in projections:
            if not isinstance(p.expr, Aggregate) and p.expr not in group_by:
                raise self.refuse(
                    GROUP_BY,
                    f"{p.name} is neither an aggregate nor a GROUP BY expression",
                )
        selected = [p.expr for p in projections]
        for item in order_by:
            if item.expr not in selected:
                raise self.refuse(
                    GROUP_BY, "with GROUP BY or aggregates, ORDER BY names a projection"
                )

    def _projections(self, node: Tree | None) -> tuple[Projection, ...]:
        out = []
        for i, item in enumerate(_trees(node), start=1):
            expr = self._aggregate(item.children[0]) or self._reader.expr(item.children[0])
            named = [c for c in item.children[1:] if isinstance(c, Tree)]
            if named:
                name = name_of(named[0])
            elif isinstance(expr, Path) and expr.attributes:
                name = expr.attributes[-1]
            else:
                name = f"field{i}"
            out.append(Projection(name, expr, named=bool(named)))
        names = [p.name for p in out]
        if len(set(names)) != len(names):
            raise self.refuse(SYNTAX, f"the SELECT list names a field twice: {names}")
        return tuple(out)

    def _aggregate(self, node: Tree | Token) -> Aggregate | None:
        """The aggregate a projection item is, or None when it is none (any other function
        is refused where expressions are read)."""
        if not isinstance(node, Tree) or node.data not in _FUNCTIONS:
            return None
        function = name_of(node.children[0]).lower()
        if function not in AGGREGATES:
            return None
        arguments = [c for c in node.children[1:] if isinstance(c, Tree)]
        if node.data == "function_star":
            if function != "count":
                raise self.refuse(UNSUPPORTED_EXPRESSION, f"{function.upper()}(*) is not OQL")
            return Aggregate(function, None)
        if len(arguments) != 1:
            raise self.refuse(UNSUPPORTED_EXPRESSION, f"{function.upper()}() takes one expression")
        argument = self._reader.expr(arguments[0])
        return Aggregate(function, argument, node.data == "function_distinct")

    def _order_item(self, item: Tree, named: dict[str, Expr | Aggregate]) -> OrderItem:
        """An ORDER BY item; a bare name a projection was given with ``AS`` stands for that
        projection's expression (Geode orders by a projection's alias so)."""
        descending = any(str(c).lower() == "desc" for c in item.children if not isinstance(c, Tree))
        node = item.children[0]
        if isinstance(node, Tree) and node.data == "path":
            names = [name_of(c) for c in node.children if isinstance(c, Tree)]
            if len(names) == 1 and names[0] in named and names[0] not in self._reader.scopes:
                return OrderItem(named[names[0]], descending)
        expr = self._aggregate(node) or self._reader.expr(node)
        return OrderItem(expr, descending)

    def _limit(self, node: Tree | None) -> int | Parameter | None:
        if node is None:
            return None
        token = str(node.children[-1])
        if token.startswith("$"):
            return Parameter(int(token[1:]))
        if not token.isdigit():
            raise self.refuse(
                UNSUPPORTED_EXPRESSION, f"LIMIT needs a non-negative integer, not {token}"
            )
        return int(token)


def _is_count(node: Tree | None) -> bool:
    """Whether the SELECT list is ``COUNT(*)`` alone (any other use of a function, COUNT
    among other projections included, is refused where expressions are read)."""
    items = _trees(node)
    if len(items) != 1:
        return False
    function = items[0].children[0]
    return (
        isinstance(function, Tree)
        and function.data == "function_star"
        and name_of(function.children[0]).lower() == "count"
        and len(items[0].children) == 1
    )


def _trees(node: Tree | None) -> list[Tree]:
    if node is None:
        return []
    return [c for c in node.children if isinstance(c, Tree)]


def _parameters(
    projections: tuple[Projection, ...],
    predicate: Expr | None,
    order_by: tuple[OrderItem, ...],
    limit: int | Parameter | None,
    group_by: tuple[Expr, ...],
) -> list[Parameter]:
    """Every ``$n`` of the query, walked without recursion."""
    stack: list[Any] = [p.expr for p in projections] + [o.expr for o in order_by]
    stack += [predicate, limit, *group_by]
    found = []
    while stack:
        node = stack.pop()
        if isinstance(node, Aggregate):
            stack.append(node.argument)
        elif isinstance(node, Parameter):
            found.append(node)
        elif isinstance(node, Comparison):
            stack += [node.left, node.right]
        elif isinstance(node, Junction):
            stack += node.operands
        elif isinstance(node, Not | Defined | Like):
            stack.append(node.operand)
        elif isinstance(node, Membership):
            stack.append(node.element)
            stack += [node.collection] if isinstance(node.collection, Parameter) else []
            stack += node.collection if type(node.collection) is tuple else []
    return found


class _Binder:
    """Replaces the parameters of one query's expressions by the values given."""

    def __init__(self, query: str, values: Sequence[Any]) -> None:
        self._query = query
        self._values = values
        self._count = 0

    def refuse(self, message: str) -> QueryInvalidError:
        return QueryInvalidError(
            f"{message} (rule {PARAMETERS})", rule=PARAMETERS, query=self._query
        )

    @overload
    def bound(self, expr: Expr) -> Expr: ...

    @overload
    def bound(self, expr: Expr | Aggregate) -> Expr | Aggregate: ...

    def bound(self, expr: Expr | Aggregate) -> Expr | Aggregate:
        if isinstance(expr, Aggregate):
            argument = None if expr.argument is None else self.bound(expr.argument)
            return expr._replace(argument=argument)
        if isinstance(expr, Parameter):
            return Constant(self._scalar(self._values[expr.number - 1], expr.number))
        if isinstance(expr, Comparison):
            return Comparison(expr.op, self.bound(expr.left), self.bound(expr.right))
        if isinstance(expr, Junction):
            return Junction(expr.op, tuple(self.bound(o) for o in expr.operands))
        if isinstance(expr, Not):
            return Not(self.bound(expr.operand))
        if isinstance(expr, Defined):
            return Defined(self.bound(expr.operand), expr.defined)
        if isinstance(expr, Like):
            return Like(self.bound(expr.operand), expr.pattern)
        if isinstance(expr, Membership):
            return Membership(self.bound(expr.element), self._collection(expr.collection))
        return expr

    def _collection(
        self, collection: tuple[Expr, ...] | Path | Parameter
    ) -> tuple[Expr, ...] | Path:
        if isinstance(collection, Path):
            return collection
        if isinstance(collection, Parameter):
            value = self._values[collection.number - 1]
            if not isinstance(value, list | tuple | set | frozenset):
                raise self.refuse(
                    f"IN ${collection.number} needs a list, tuple or set, "
                    f"got {type(value).__name__}"
                )
            return tuple(Constant(self._scalar(m, collection.number)) for m in value)
        return tuple(self.bound(m) for m in collection)

    def _scalar(self, value: Any, index: int) -> Any:
        self._count += 1
        if self._count > MAX_BOUND_VALUES:
            raise self.refuse(f"the parameters bind more than {MAX_BOUND_VALUES} values")
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            if not _LONG_MIN <= value <= _LONG_MAX:
                raise self.refuse(f"${index} is an int beyond 64 bits")
            return value
        if isinstance(value, float):
            if math.isnan(value):
                raise self.refuse(f"${index} is NaN, which compares with nothing")
            return value
        if isinstance(value, str):
            if len(value) > MAX_PARAMETER_CHARS:
                raise self.refuse(f"${index} is a str longer than {MAX_PARAMETER_CHARS} characters")
            return value
        raise self.refuse(
            f"${index} is a {type(value).__name__}; a parameter is None, bool, int, float or "
            "str (a list, tuple or set of them for IN)"
        )


__all__ = [
    "AGGREGATES",
    "MAX_BOUND_VALUES",
    "MAX_ITERATORS",
    "MAX_PARAMETER_CHARS",
    "Aggregate",
    "Drill",
    "Iterates",
    "OrderItem",
    "ParsedQuery",
    "Projection",
    "parse_query",
]
