"""``SELECT DISTINCT``, aggregates and ``GROUP BY`` of one-shot queries: equal rows told
apart from different ones, and the groups of the selected elements with their aggregates.

Each bucket's primary groups its own selected entries and answers one partial row per
group: the group's values and each aggregate's partial state (a count, a total, the best
value so far, or for ``DISTINCT`` the distinct values), as JSON with every value tagged by
its type (:func:`partial_json`); the client merges the partial rows of every bucket by
group and computes the aggregates (Geode's ``PRQueryNode`` aggregators merge the buckets'
results the same way, ``CountPRQueryNode``, ``AvgPRQueryNode``, ...).

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

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from regionbus.schemas.cq.evaluate import evaluate
from regionbus.schemas.cq.syntax import UNDEFINED, Path
from regionbus.schemas.errors import (
    CqEvaluationError,
    QueryInvocationTargetError,
    QueryTypeMismatchError,
)
from regionbus.schemas.query.parser import Aggregate, ParsedQuery

_NUMBER: Final = "number"

PARTIAL_SERIALIZER: Final = "regionbus.partial-group"
"""The ``serializer`` of the entries a bucket answers for a grouped query: each value is
one group's partial row (:meth:`Groups.partials`), not a value of the region."""


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
    """The rows, each equal one once (the first), in their order (equality as
    :func:`frozen` tells it).

    Raises:
        QueryTypeMismatchError: a row is nested too deeply to compare.
    """
    seen: set[Any] = set()
    for row in rows:
        key = frozen(row)
        if key not in seen:
            seen.add(key)
            yield row


class Accumulator:
    """One aggregate of one group, fed the value of its argument for each element, or the
    partial state of another bucket's (:meth:`state`, :meth:`merge`)."""

    def __init__(self, aggregate: Aggregate) -> None:
        self._function = aggregate.function
        self._star = aggregate.argument is None
        self._distinct: dict[Any, Any] | None = {} if aggregate.distinct else None
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
        if self._distinct is not None:
            key = frozen(value)
            if key not in self._distinct:
                self._check(value)
                self._distinct[key] = value
            return
        self._take(value)

    def _check(self, value: Any) -> None:
        """Refuse now a distinct value the aggregate could not take."""
        probe = Accumulator(Aggregate(self._function, None if self._star else _ANY))
        probe._kind = self._kind
        probe._take(value)
        self._kind = probe._kind

    def _take(self, value: Any) -> None:
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
        if self._kind is not None and kind != self._kind:
            raise QueryTypeMismatchError(
                f"{self._function.upper()} compares a {self._kind} with a {kind} "
                "(Geode: ClassCastException)"
            )
        self._kind = kind
        best = self._best
        if best is None or ((value > best) if self._function == "max" else (value < best)):
            self._best = value

    def state(self) -> list[Any]:
        """What this accumulator holds, JSON-able: ``[count, total, best]``, or for
        ``DISTINCT`` the distinct values (each tagged, :func:`partial_json`)."""
        if self._distinct is not None:
            return [partial_json(v) for v in self._distinct]
        return [
            self._count,
            self._total,
            None if self._best is None else partial_json(frozen(self._best)),
        ]

    def merge(self, state: Sequence[Any]) -> None:
        """Take another accumulator's :meth:`state` (a bucket's partial).

        Raises:
            QueryTypeMismatchError: as :meth:`add` (MIN of a string in one bucket and of a
                number in another).
        """
        if self._distinct is not None:
            for value in state:
                self.add(thawed(value))
            return
        count, total, best = state
        self._count += count
        self._total += total
        if best is not None:
            self._compare(thawed(best))

    def result(self) -> Any:
        """The aggregate's value over what it was fed."""
        if self._distinct is not None:
            plain = Accumulator(Aggregate(self._function, _ANY))
            for value in self._distinct.values():
                plain._take(value)
            return plain.result()
        function = self._function
        if function == "count":
            return self._count
        if function == "sum":
            return _whole(self._total)
        if function == "avg":
            return _whole(self._total / self._count) if self._count else float("nan")
        return self._best


_ANY: Final = Path(())
"""An argument for an accumulator fed values directly (any non-None argument will do)."""


def _whole(value: int | float) -> int | float:
    """An int when the number is whole (Geode ``AbstractAggregator.downCast``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def partial_json(value: Any) -> Any:
    """A :func:`frozen` value as JSON: strings and null as themselves, anything else a list
    led by its type (``["int", 3]``, ``["map", [[key, value], ...]]``, ``["undefined"]``),
    so that :func:`thawed` gives back the value, type included."""
    if value is None or isinstance(value, str):
        return value
    if value is UNDEFINED:
        return ["undefined"]
    tag = value[0]
    if tag in ("bool", "int", "float"):
        return [tag, value[1]]
    if tag == "map":
        return [tag, [[k, partial_json(v)] for k, v in value[1]]]
    if tag == "list":
        return [tag, [partial_json(v) for v in value[1]]]
    if tag == "bytes":
        return [tag, base64.b64encode(value[1]).decode()]
    return ["str", f"{value[1]}: {value[-1]}"]  # a struct or another type: shown


def thawed(value: Any) -> Any:
    """The value a :func:`partial_json` form stands for.

    Raises:
        QueryInvocationTargetError: the form is not one :func:`partial_json` makes.
    """
    if value is None or isinstance(value, str):
        return value
    try:
        tag = value[0]
        if tag == "undefined":
            return UNDEFINED
        if tag in ("bool", "int", "float", "str"):
            return value[1]
        if tag == "map":
            return {k: thawed(v) for k, v in value[1]}
        if tag == "list":
            return [thawed(v) for v in value[1]]
        if tag == "bytes":
            return base64.b64decode(value[1])
    except (TypeError, IndexError, ValueError) as exc:
        raise QueryInvocationTargetError(f"a partial result does not read: {exc}") from None
    raise QueryInvocationTargetError(f"a partial result of unknown type {tag!r}")


class Groups:
    """The groups of a :attr:`ParsedQuery.grouped` query: one per distinct value of its
    GROUP BY expressions (one in all without GROUP BY), each with an accumulator per
    aggregate of the SELECT list, in the order the groups were first met. A bucket's
    primary feeds it the elements it selects (:meth:`add`) and answers :meth:`partials`;
    the client feeds it every bucket's partials (:meth:`merge`) and reads :meth:`rows`.

    Args:
        query: The bound query.
    """

    def __init__(self, query: ParsedQuery) -> None:
        self._query = query
        self._aggregates = [
            (i, p.expr) for i, p in enumerate(query.projections) if isinstance(p.expr, Aggregate)
        ]
        self._groups: dict[Any, tuple[tuple[Any, ...], list[Accumulator]]] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def _group(self, values: tuple[Any, ...]) -> list[Accumulator]:
        key = frozen(values)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = (values, [Accumulator(a) for _, a in self._aggregates])
        return group[1]

    def add(self, item: Any) -> None:
        """Take one selected element.

        Raises:
            QueryTypeMismatchError: a GROUP BY expression or an aggregate's argument cannot
                be evaluated on it, or an aggregate cannot take its value.
        """
        query = self._query
        likes = query.likes
        likes.begin()  # each element's expressions have the budget of one evaluation
        try:
            values = tuple(evaluate(e, item, likes) for e in query.group_by)
            arguments = [
                None if a.argument is None else evaluate(a.argument, item, likes)
                for _, a in self._aggregates
            ]
        except CqEvaluationError as exc:
            raise QueryTypeMismatchError(str(exc)) from None
        for accumulator, argument in zip(self._group(values), arguments, strict=True):
            accumulator.add(argument)

    def partials(self) -> list[bytes]:
        """One partial row per group: ``[group values, aggregate states]`` as JSON."""
        return [
            json.dumps(
                [[partial_json(frozen(v)) for v in values], [a.state() for a in accumulators]]
            ).encode()
            for values, accumulators in self._groups.values()
        ]

    def merge(self, partial: bytes) -> None:
        """Take one partial row of another bucket (:meth:`partials`).

        Raises:
            QueryInvocationTargetError: it does not read as a partial row of this query.
            QueryTypeMismatchError: as :meth:`Accumulator.merge`.
        """
        try:
            values, states = json.loads(partial)
            if len(values) != len(self._query.group_by) or len(states) != len(self._aggregates):
                raise ValueError("another query's shape")
        except (ValueError, TypeError) as exc:
            raise QueryInvocationTargetError(f"a partial result does not read: {exc}") from None
        group = self._group(tuple(thawed(v) for v in values))
        for accumulator, state in zip(group, states, strict=True):
            accumulator.merge(state)

    def rows(self) -> list[tuple[Any, ...]]:
        """Each group's projections' values, in the order of the SELECT list; without GROUP
        BY one row even over no element (``COUNT`` 0, ``SUM`` 0, the others None or NaN)."""
        query = self._query
        if not self._groups and not query.group_by:
            self._group(())
        rows = []
        for values, accumulators in self._groups.values():
            row: list[Any] = [None] * len(query.projections)
            for (index, _), accumulator in zip(self._aggregates, accumulators, strict=True):
                row[index] = accumulator.result()
            for index, projection in enumerate(query.projections):
                if not isinstance(projection.expr, Aggregate):
                    row[index] = values[query.group_by.index(projection.expr)]
            rows.append(tuple(row))
        return rows


__all__ = [
    "PARTIAL_SERIALIZER",
    "Accumulator",
    "Groups",
    "distinct_rows",
    "frozen",
    "partial_json",
    "thawed",
]
