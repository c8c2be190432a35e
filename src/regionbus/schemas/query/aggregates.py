"""``SELECT DISTINCT``, aggregates and ``GROUP BY`` of one-shot queries: equal rows told
apart from different ones, and the groups of the selected elements with their aggregates.

The aggregates are Geode's (``org.apache.geode.cache.query.internal.aggregate``): null and
UNDEFINED values are skipped by all but ``COUNT(*)``; ``COUNT`` counts; ``SUM`` and
``AVG`` add numbers (0 and NaN over nothing, as Geode's double arithmetic gives) and
answer an int when the result is whole (Geode's ``AbstractAggregator.downCast``); ``MIN``
and ``MAX`` compare values of one kind (numbers, strings or booleans; None over nothing).
``DISTINCT`` inside an aggregate runs it over distinct values. Equality is Geode's
``equals``: ``1``, ``1.0`` and ``true`` are three values; mappings and lists are equal
when their members are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from regionbus.schemas.cq.evaluate import evaluate
from regionbus.schemas.cq.syntax import UNDEFINED
from regionbus.schemas.errors import CqEvaluationError, QueryTypeMismatchError
from regionbus.schemas.query.parser import Aggregate, ParsedQuery

_NUMBER: Final = "number"


def frozen(value: Any) -> Any:
    """A hashable stand-in for a row or a value, equal for values Geode's ``equals`` finds
    equal and different for the others (an int, a float and a bool never equal).

    Raises:
        QueryTypeMismatchError: the value is nested too deeply to compare.
    """
    try:
        return _frozen(value)
    except RecursionError:
        raise QueryTypeMismatchError("a value is nested too deeply to compare") from None


def _frozen(value: Any) -> Any:
    if value is None or value is UNDEFINED or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", value)
    if isinstance(value, Mapping):
        return ("map", tuple(sorted((str(k), _frozen(v)) for k, v in value.items())))
    if isinstance(value, list | tuple):
        return ("list", tuple(_frozen(v) for v in value))
    names = getattr(value, "field_names", None)
    if names is not None:  # a Struct (a row of several projections)
        return ("struct", names, tuple(_frozen(v) for v in value.field_values))
    if isinstance(value, bytes | bytearray):
        return ("bytes", bytes(value))
    return ("other", type(value).__name__, repr(value))


def distinct_rows(rows: Iterable[Any]) -> Iterable[Any]:
    """The rows, each equal one once (the first), in their order."""
    seen: set[Any] = set()
    for row in rows:
        key = frozen(row)
        if key not in seen:
            seen.add(key)
            yield row


class Accumulator:
    """One aggregate of one group, fed the value of its argument for each element."""

    def __init__(self, aggregate: Aggregate) -> None:
        self._function = aggregate.function
        self._star = aggregate.argument is None
        self._seen: set[Any] | None = set() if aggregate.distinct else None
        self._count = 0
        self._total: int | float = 0
        self._best: Any = None
        self._kind: str | None = None

    def add(self, value: Any) -> None:
        """Take one element's value (anything for ``COUNT(*)``).

        Raises:
            QueryTypeMismatchError: ``SUM`` or ``AVG`` of a value that is not a number,
                ``MIN`` or ``MAX`` of a value with no order or of another kind than the
                others (Geode: ``ClassCastException``).
        """
        if self._star:
            self._count += 1
            return
        if value is None or value is UNDEFINED:
            return
        if self._seen is not None:
            key = frozen(value)
            if key in self._seen:
                return
            self._seen.add(key)
        function = self._function
        if function in ("sum", "avg"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise QueryTypeMismatchError(
                    f"{function.upper()} of a {type(value).__name__}, which is not a number "
                    "(Geode: ClassCastException)"
                )
            self._total += value
        elif function in ("min", "max"):
            self._compare(value)
        self._count += 1

    def _compare(self, value: Any) -> None:
        kind = (
            "boolean"
            if isinstance(value, bool)
            else _NUMBER
            if isinstance(value, int | float)
            else "string"
            if isinstance(value, str)
            else None
        )
        if kind is None:
            raise QueryTypeMismatchError(
                f"{self._function.upper()} of a {type(value).__name__}, which has no order"
            )
        if self._kind is None:
            self._kind, self._best = kind, value
            return
        if kind != self._kind:
            raise QueryTypeMismatchError(
                f"{self._function.upper()} compares a {self._kind} with a {kind} "
                "(Geode: ClassCastException)"
            )
        if (value > self._best) if self._function == "max" else (value < self._best):
            self._best = value

    def result(self) -> Any:
        """The aggregate's value over what it was fed."""
        function = self._function
        if function == "count":
            return self._count
        if function == "sum":
            return _whole(self._total)
        if function == "avg":
            return _whole(self._total / self._count) if self._count else float("nan")
        return self._best


def _whole(value: int | float) -> int | float:
    """An int when the number is whole (Geode ``AbstractAggregator.downCast``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def grouped_rows(query: ParsedQuery, items: Iterable[Any]) -> list[tuple[Any, ...]]:
    """The rows of a :attr:`ParsedQuery.grouped` query: one per distinct value of its GROUP
    BY expressions (one in all without GROUP BY, over no element too), each the values of
    its projections, in the order the groups were first met.

    Args:
        query: The bound query.
        items: Every element the query selected, from every bucket.

    Raises:
        QueryTypeMismatchError: a GROUP BY expression or an aggregate's argument cannot be
            evaluated on an element, or an aggregate cannot take its value.
    """
    aggregates = [
        (i, p.expr) for i, p in enumerate(query.projections) if isinstance(p.expr, Aggregate)
    ]
    groups: dict[Any, tuple[tuple[Any, ...], list[Accumulator]]] = {}
    likes = query.likes
    for item in items:
        likes.begin()  # each element's expressions have the budget of one evaluation
        try:
            values = tuple(evaluate(e, item, likes) for e in query.group_by)
            arguments = [
                None if a.argument is None else evaluate(a.argument, item, likes)
                for _, a in aggregates
            ]
        except CqEvaluationError as exc:
            raise QueryTypeMismatchError(str(exc)) from None
        key = frozen(values)
        group = groups.get(key)
        if group is None:
            group = groups[key] = (values, [Accumulator(a) for _, a in aggregates])
        for accumulator, argument in zip(group[1], arguments, strict=True):
            accumulator.add(argument)
    if not groups and not query.group_by:
        groups[()] = ((), [Accumulator(a) for _, a in aggregates])
    rows = []
    for values, accumulators in groups.values():
        row: list[Any] = [None] * len(query.projections)
        for (index, _), accumulator in zip(aggregates, accumulators, strict=True):
            row[index] = accumulator.result()
        for index, projection in enumerate(query.projections):
            if not isinstance(projection.expr, Aggregate):
                row[index] = values[query.group_by.index(projection.expr)]
        rows.append(tuple(row))
    return rows


__all__ = ["Accumulator", "distinct_rows", "frozen", "grouped_rows"]
