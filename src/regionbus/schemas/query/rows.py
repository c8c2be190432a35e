"""Evaluating a bound one-shot query on a region's entries: which are selected, their
``ORDER BY`` keys, their projections, and the merge of the buckets' answers.

Each bucket's primary selects its entries and orders them (ties broken by key, so the
order is total and the same everywhere), keeping the first ``LIMIT``; the client merges the
buckets' ordered answers, keeps the first ``LIMIT`` again and projects each row (Geode's
``PartitionedRegionQueryEvaluator`` runs the query on each bucket's node and the
coordinator sorts and limits again the same way). With ``DISTINCT`` each bucket answers
its first ``LIMIT`` distinct rows and the merge keeps each row once; a grouped query
(aggregates, ``GROUP BY``) has every bucket answer every element it selects, and the merge
groups, orders and limits them (`regionbus.schemas.query.aggregates`). The WHERE clause
follows the rules of continuous queries (`regionbus.schemas.cq.evaluate`); ``ORDER BY``
follows Geode's ``OrderByComparator``: null first, then UNDEFINED, then the values,
numbers compared as numbers; ``DESC`` reverses all of it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Final

from regionbus.schemas.cq.evaluate import evaluate, read_path, selects
from regionbus.schemas.cq.syntax import UNDEFINED
from regionbus.schemas.errors import CqEvaluationError, QueryRowLimitError, QueryTypeMismatchError
from regionbus.schemas.query.aggregates import Groups, distinct_rows
from regionbus.schemas.query.parser import Aggregate, ParsedQuery


@dataclass(frozen=True, slots=True)
class Struct:
    """One row of a query with several projections (Geode ``Struct``): its values in the
    order of the SELECT list, each under its field name.

    Attributes:
        field_names: The names (Geode ``StructType.getFieldNames``).
        field_values: The values (Geode ``Struct.getFieldValues``).
    """

    field_names: tuple[str, ...]
    field_values: tuple[Any, ...]

    def get(self, name: str) -> Any:
        """The value of a field (Geode ``Struct.get(fieldName)``).

        Raises:
            KeyError: the row has no field of that name.
        """
        try:
            return self.field_values[self.field_names.index(name)]
        except ValueError:
            raise KeyError(name) from None

    def as_dict(self) -> dict[str, Any]:
        """``{field name: value}``."""
        return dict(zip(self.field_names, self.field_values, strict=True))


def element(query: ParsedQuery, key: str, value: Any) -> Any:
    """What the query's iterator gives for one valid entry: the value, ``{"key": key,
    "value": value}`` (``/r.entries``) or the key (``/r.keys``)."""
    if query.iterates == "values":
        return value
    if query.iterates == "entries":
        return {"key": key, "value": value}
    return key


MAX_ROWS_PER_ENTRY: Final = 10_000
"""Most rows one entry gives a query with drill-downs (the product of the sizes of the
collections it iterates): past it the query fails with ``QueryRowLimitError``."""


def selected_rows(query: ParsedQuery, item: Any) -> list[Any]:
    """The rows of one element the WHERE clause selects: the element itself, or with
    drill-downs (:attr:`ParsedQuery.drills`) each combination of the element with the
    members of the collections its iterators run over, as a mapping of each iterator's
    scope name to its element. A collection that is null or UNDEFINED gives no row; a
    mapping's members are its entries (``key``, ``value``), as Geode iterates a ``Map``.

    Raises:
        QueryTypeMismatchError: the WHERE clause cannot be evaluated on a row, or an
            iterator runs over something that is not a collection (Geode: "An iterator
            definition must be a collection type").
        QueryRowLimitError: the element gives more than :data:`MAX_ROWS_PER_ENTRY` rows.
    """
    if not query.drills:
        return [item] if is_selected(query, item) else []
    rows: list[dict[str, Any]] = [{query.scopes[0]: item}]
    for drill in query.drills:
        grown: list[dict[str, Any]] = []
        for row in rows:
            for member in _members(read_path(row, drill.collection.attributes), drill.alias):
                grown.append({**row, drill.alias: member})
            if len(grown) > MAX_ROWS_PER_ENTRY:
                raise QueryRowLimitError(
                    f"an entry gives more than {MAX_ROWS_PER_ENTRY} rows over the query's "
                    "iterators; narrow the collections it iterates"
                )
        rows = grown
    return [row for row in rows if is_selected(query, row)]


def _members(collection: Any, alias: str) -> Iterable[Any]:
    if collection is None or collection is UNDEFINED:
        return ()
    if isinstance(collection, Mapping):
        return [{"key": k, "value": v} for k, v in collection.items()]
    if isinstance(collection, list | tuple):
        return collection
    raise QueryTypeMismatchError(
        f"iterator {alias} runs over a {type(collection).__name__}; an iterator definition "
        "must be a collection type (a list or a mapping)"
    )


def is_selected(query: ParsedQuery, item: Any) -> bool:
    """Whether the WHERE clause is True for an element (see
    `regionbus.schemas.cq.evaluate.selects`).

    Raises:
        QueryTypeMismatchError: the clause cannot be evaluated on it (a relational
            comparison of different types, a non-boolean operand, LIKEs that would read too
            much).
    """
    try:
        return selects(query.predicate, item, query.likes)
    except CqEvaluationError as exc:
        raise QueryTypeMismatchError(str(exc)) from None


def project(query: ParsedQuery, item: Any) -> Any:
    """One row of the results: the element itself for ``SELECT *`` (a :class:`Struct` of
    ``key`` and ``value`` over ``/r.entries``), the one projection's value, or a
    :class:`Struct` of several.

    Raises:
        QueryTypeMismatchError: a projection cannot be evaluated on the element.
    """
    assert not query.grouped  # a group's row is made by grouped_rows
    if not query.projections and query.drills:
        return Struct(query.scope_names, tuple(item[s] for s in query.scopes))
    if not query.projections:
        if query.iterates == "entries":
            return Struct(("key", "value"), (item["key"], item["value"]))
        return item
    query.likes.begin()  # each row's LIKEs have the budget of one evaluation
    try:
        values = tuple(
            evaluate(p.expr, item, query.likes)
            for p in query.projections
            if not isinstance(p.expr, Aggregate)
        )
    except CqEvaluationError as exc:
        raise QueryTypeMismatchError(str(exc)) from None
    if len(values) == 1:
        return values[0]
    return Struct(tuple(p.name for p in query.projections), values)


class _Descending:
    """A sort key compared the other way round (``DESC``)."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key

    def __lt__(self, other: _Descending) -> bool:
        return other.key < self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


_NULL_RANK: Final = (0,)
_UNDEFINED_RANK: Final = (1,)


class OrderKeys:
    """The ``ORDER BY`` keys of elements, checked to be comparable with each other: every
    value of one item (null and UNDEFINED aside) is a number, or every one a string, or
    every one a boolean (Geode's ``OrderByComparator`` fails on others with a
    ``ClassCastException``). One instance sees every row that is ordered together, so the
    check holds across buckets when the client merges.

    Args:
        query: The bound query.
    """

    def __init__(self, query: ParsedQuery) -> None:
        self._query = query
        self._kinds: list[str | None] = [None] * len(query.order_by)

    def key(self, entry_key: Any, item: Any) -> tuple[Any, ...]:
        """The sort key of an element: its ORDER BY values, then its entry's key (or, for
        a row of a query with drill-downs, the entry's key and the row's place in it).

        Raises:
            QueryTypeMismatchError: an ORDER BY value cannot be evaluated, has no order (a
                mapping, a list), or is of another kind than the item's other values.
        """
        values = []
        self._query.likes.begin()  # each row's LIKEs have the budget of one evaluation
        for item_spec in self._query.order_by:
            assert not isinstance(item_spec.expr, Aggregate)  # grouped rows: of_values
            try:
                values.append(evaluate(item_spec.expr, item, self._query.likes))
            except CqEvaluationError as exc:
                raise QueryTypeMismatchError(str(exc)) from None
        return self.of_values(values, entry_key)

    def of_values(self, values: Sequence[Any], tie: Any) -> tuple[Any, ...]:
        """The sort key of a row whose ORDER BY values were evaluated already (a group's
        projections), ``tie`` last.

        Raises:
            QueryTypeMismatchError: as :meth:`key`.
        """
        parts: list[Any] = []
        for i, (item_spec, value) in enumerate(zip(self._query.order_by, values, strict=True)):
            part = self._ranked(i, value)
            parts.append(_Descending(part) if item_spec.descending else part)
        parts.append(tie)
        return tuple(parts)

    def _ranked(self, index: int, value: Any) -> tuple[Any, ...]:
        if value is None:
            return _NULL_RANK
        if value is UNDEFINED:
            return _UNDEFINED_RANK
        if isinstance(value, bool):
            kind = "boolean"
        elif isinstance(value, int | float):
            kind = "number"
        elif isinstance(value, str):
            kind = "string"
        else:
            raise QueryTypeMismatchError(
                f"ORDER BY item {index + 1} is a {type(value).__name__}, which has no order"
            )
        seen = self._kinds[index]
        if seen is None:
            self._kinds[index] = kind
        elif seen != kind:
            raise QueryTypeMismatchError(
                f"ORDER BY item {index + 1} compares a {seen} with a {kind} "
                "(Geode OrderByComparator: ClassCastException)"
            )
        return (2, value)


def merged(query: ParsedQuery, answers: Iterable[list[tuple[str, Any]]]) -> list[Any]:
    """The results of a query from the buckets' answers: merged in ``ORDER BY`` order
    (each answer is in that order), projected, each distinct row once for ``DISTINCT``,
    the first ``LIMIT`` kept; for a :attr:`ParsedQuery.grouped` query, the groups of every
    answer's elements (`regionbus.schemas.query.aggregates`), ordered and limited.

    Args:
        query: The bound query.
        answers: Each bucket's ``[(entry key, element), ...]``, as its primary ordered and
            limited them.

    Raises:
        QueryTypeMismatchError: ORDER BY values of different buckets do not compare, or a
            projection, a GROUP BY expression or an aggregate cannot be evaluated.
    """
    if query.grouped:
        partials = []
        for answer in answers:
            bucket = Groups(query)
            for _, item in answer:
                for row in selected_rows(query, item) if query.drills else [item]:
                    bucket.add(row)
            partials += bucket.partials()
        return grouped_results(query, partials)
    rows: Iterable[tuple[Any, Any]]
    if query.drills:
        # Each bucket answered its entries with a selected row, unordered: their rows are
        # ordered, made distinct and limited here (ties by entry key, then row).
        rows = [
            ((key, n), row)
            for answer in answers
            for key, item in answer
            for n, row in enumerate(selected_rows(query, item))
        ]
        if query.order_by:
            keys = OrderKeys(query)
            rows = sorted(rows, key=lambda r: keys.key(r[0], r[1]))
    elif query.order_by:
        keys = OrderKeys(query)
        keyed = [[(keys.key(k, item), item) for k, item in answer] for answer in answers]
        rows = ((key[-1], item) for key, item in heapq.merge(*keyed, key=itemgetter(0)))
    else:
        rows = itertools.chain.from_iterable(answers)
    projected: Iterable[Any] = (project(query, item) for _, item in rows)
    if query.distinct:
        projected = distinct_rows(projected)
    if isinstance(query.limit, int):
        projected = itertools.islice(projected, query.limit)
    return list(projected)


def grouped_results(query: ParsedQuery, partials: Iterable[bytes]) -> list[Any]:
    """The results of a :attr:`ParsedQuery.grouped` query from the buckets' partial rows
    (`regionbus.schemas.query.aggregates.Groups.partials`): merged by group, ordered by
    the projections its ORDER BY names (groups that tie in the order they were first met),
    distinct, limited, each a value or a :class:`Struct`.

    Raises:
        QueryTypeMismatchError: an aggregate cannot merge what two buckets found (MIN of a
            string in one and of a number in another).
        QueryInvocationTargetError: a partial row does not read.
    """
    groups = Groups(query)
    for partial in partials:
        groups.merge(partial)
    rows = groups.rows()
    if query.order_by:
        exprs = [p.expr for p in query.projections]
        picks = [exprs.index(o.expr) for o in query.order_by]
        keys = OrderKeys(query)
        ranked = [(keys.of_values([row[i] for i in picks], n), row) for n, row in enumerate(rows)]
        rows = [row for _, row in sorted(ranked, key=itemgetter(0))]
    shaped: Iterable[Any] = (
        row[0] if len(row) == 1 else Struct(tuple(p.name for p in query.projections), row)
        for row in rows
    )
    if query.distinct:
        shaped = distinct_rows(shaped)
    if isinstance(query.limit, int):
        shaped = itertools.islice(shaped, query.limit)
    return list(shaped)


__all__ = [
    "MAX_ROWS_PER_ENTRY",
    "OrderKeys",
    "Struct",
    "element",
    "grouped_results",
    "is_selected",
    "merged",
    "project",
    "selected_rows",
]
