"""Evaluating a CQ predicate on one value, with Apache Geode's UNDEFINED rules.

Values are what a region's serializer decodes: JSON-like values (dicts, lists, strings,
numbers, booleans, None) or Avro records (fastavro decodes them to dicts). An attribute is
read by key from a mapping; a mapping's ``size``, ``isEmpty``, ``values``, ``keySet`` and
``entrySet`` (when it has no such key), a list's ``size`` and a string's ``length`` (and
``isEmpty`` of either) are read as Geode reads them, through the ``java.util.Map``,
``List`` and ``String`` methods; any other attribute of anything else (a string, a number,
None, UNDEFINED) or one a mapping does not have is :data:`UNDEFINED` (Geode
``AttributeDescriptor.read``, with heterogeneous objects allowed as in Geode's default).

Comparisons follow Geode's ``TypeUtils.compare``:

============================== ======================================================
operands                        result
============================== ======================================================
either is null                  ``=``: both null; ``<>``: not both null; else UNDEFINED
either is UNDEFINED             ``<>``: True unless both are; ``=``: True when both are;
                                else UNDEFINED
two numbers                     numeric comparison (``int`` and ``float`` mix)
two strings                     lexicographic
a boolean and a boolean         ``=`` and ``<>`` only
different kinds, or collections ``=``: equal values; ``<>``: not equal; ``< <= > >=``:
                                :class:`CqEvaluationError` (Geode ``TypeMismatchException``)
============================== ======================================================

``AND`` / ``OR`` (Geode ``CompiledJunction``): a short-circuiting operand (False for AND,
True for OR) decides; else UNDEFINED (or null) in any operand makes the junction
UNDEFINED; else the booleans combine. Unlike Geode, which stops at the first operand that
fails, an operand that cannot be evaluated does not hide a short-circuiting operand after
it, so the answer does not depend on the operands' order (which normalization sorts).
``NOT`` of UNDEFINED or null is UNDEFINED. ``IN``: True when an element compares ``=``
True, UNDEFINED when the collection is null or UNDEFINED, else False. ``LIKE`` on null or
UNDEFINED is UNDEFINED, on a non-string False. The WHERE clause selects a value only when
the predicate is True: UNDEFINED and null count as False. So ``f.missing > 5`` is false,
and ``f.missing <> 5`` is true (Geode's ``testCQEventsWithNotEqualsUndefined``).

A LIKE runs on RE2, whose cost is at most about the text's length times the compiled
pattern's size (its NFA; most patterns run on its DFA, in time linear in the text). Geode
bounds neither, and one query of a hostile client could hold a server for seconds per
change. So a query's LIKE patterns compile to at most :data:`MAX_LIKE_PROGRAM_SIZE`
instructions together (the parser refuses more), and one evaluation of a query reads at
most :data:`MAX_LIKE_WORK` characters times instructions (:class:`LikePatterns`; past it
the evaluation fails with :class:`CqEvaluationError`, which the CQ's listener gets as an
error event).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import re2

from regionbus.schemas.cq.syntax import (
    UNDEFINED,
    Comparison,
    Defined,
    Expr,
    Junction,
    Like,
    Literal,
    Membership,
    Not,
    Parameter,
    Path,
    text_of,
)
from regionbus.schemas.errors import CqEvaluationError

_RELATIONAL: Final = frozenset({"<", "<=", ">", ">="})

MAX_LIKE_PROGRAM_SIZE: Final = 500
"""Most RE2 instructions the LIKE patterns of one query compile to, together: as an interest
regex (`regionbus.schemas.interest_regex.MAX_INTEREST_REGEX_PROGRAM_SIZE`). ``'%UA-%'`` is
about 15; ``'%a_'`` repeated 160 times is 2,404."""

MAX_LIKE_WORK: Final = 10_000_000
"""Most characters times instructions one evaluation of a query's LIKEs may read: about
12 ms of a server's time at RE2's worst (measured 1.2 ns each, a 20,434-instruction
pattern on 30,000 characters). A 500-instruction pattern reads 20,000 characters of a
value, a 20-instruction one 500,000."""

_LIKE_MAX_MEM_BYTES: Final = 1 << 20
"""RE2's memory budget for one compiled LIKE pattern (its default is 8 MiB)."""


class LikePatterns:
    """The compiled LIKE patterns of one query, and what the evaluation under way has read.

    Compiled once, when the query is parsed, and kept with it, so a pattern lives as long
    as a CQ holds its query.

    Args:
        compiled: ``{pattern: (compiled pattern, RE2 program size)}`` (`like_pattern`,
            `like_program_size`); an evaluation that meets another pattern compiles it.

    Attributes:
        work: Characters times instructions read since the last :meth:`begin`.
    """

    __slots__ = ("_compiled", "work")

    def __init__(self, compiled: Mapping[str, tuple[Any, int]] | None = None) -> None:
        self._compiled = dict(compiled or {})
        self.work = 0

    @property
    def program_size(self) -> int:
        """The instructions of every pattern together."""
        return sum(size for _, size in self._compiled.values())

    def begin(self) -> None:
        """A new evaluation: nothing read yet."""
        self.work = 0

    def fullmatch(self, pattern: str, text: str) -> bool:
        """Whether ``text`` matches ``pattern`` whole.

        Raises:
            CqEvaluationError: reading ``text`` would take this evaluation past
                :data:`MAX_LIKE_WORK`.
        """
        found = self._compiled.get(pattern)
        if found is None:
            compiled = like_pattern(pattern)
            found = (compiled, like_program_size(compiled))
        compiled, size = found
        units = len(text) * size
        if self.work + units > MAX_LIKE_WORK:
            raise CqEvaluationError(
                f"LIKE would read {len(text):,} characters with a {size}-instruction pattern, "
                f"past the {MAX_LIKE_WORK:,} characters x instructions one evaluation may read"
            )
        self.work += units
        return compiled.fullmatch(text) is not None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LikePatterns) and self._compiled.keys() == other._compiled.keys()

    def __hash__(self) -> int:
        return hash(frozenset(self._compiled))

    def __repr__(self) -> str:
        return f"LikePatterns({sorted(self._compiled)!r})"


def selects(predicate: Expr | None, value: Any, likes: LikePatterns | None = None) -> bool:
    """Whether a value is in the CQ's result set: the WHERE clause is True for it.

    Args:
        predicate: The predicate (None: no WHERE clause, every value is selected).
        value: The decoded value of an entry.
        likes: The query's compiled LIKE patterns (None: compiled as met).

    Returns:
        True only when the predicate evaluates to True (UNDEFINED and null are False).

    Raises:
        CqEvaluationError: a relational comparison of values of different kinds, an
            operand of AND/OR/NOT or the WHERE clause that is not a boolean, an ``IN`` over
            something that is not a collection, LIKEs that would read more than
            :data:`MAX_LIKE_WORK`.
    """
    if predicate is None:
        return True
    if likes is None:
        likes = LikePatterns()
    likes.begin()
    result = evaluate(predicate, value, likes)
    if result is True:
        return True
    if result is False or result is None or result is UNDEFINED:
        return False
    raise CqEvaluationError(
        f"the WHERE clause was of type {type(result).__name__} instead of boolean"
    )


def evaluate(expr: Expr, value: Any, likes: LikePatterns | None = None) -> Any:
    """The value of an expression for one region value: a boolean, None, UNDEFINED, or
    what a path or literal holds.

    Args:
        expr: The expression.
        value: The decoded value of an entry.
        likes: The query's compiled LIKE patterns, metering what they read (None: a fresh
            meter, patterns compiled as met).

    Raises:
        CqEvaluationError: as :func:`selects`.
    """
    if likes is None:
        likes = LikePatterns()
    kind = type(expr)
    if kind is Path:
        return read_path(value, expr.attributes)  # type: ignore[union-attr]
    if kind is Literal:
        return expr.value  # type: ignore[union-attr]
    if kind is Comparison:
        return compare(
            evaluate(expr.left, value, likes),  # type: ignore[union-attr]
            evaluate(expr.right, value, likes),  # type: ignore[union-attr]
            expr.op,  # type: ignore[union-attr]
        )
    if kind is Junction:
        return _junction(expr, value, likes)  # type: ignore[arg-type]
    if kind is Not:
        return _negate(evaluate(expr.operand, value, likes))  # type: ignore[union-attr]
    if kind is Defined:
        is_undefined = evaluate(expr.operand, value, likes) is UNDEFINED  # type: ignore[union-attr]
        return is_undefined is not expr.defined  # type: ignore[union-attr]
    if kind is Membership:
        return _membership(expr, value, likes)  # type: ignore[arg-type]
    if kind is Parameter:
        raise CqEvaluationError(f"bind parameter {text_of(expr)} was not bound")
    return _like(expr, value, likes)  # type: ignore[arg-type]


_SIZES: Final = {"size": (list, tuple), "length": (str,)}
"""The attributes Geode's ``AttributeDescriptor`` reads of a JSON array (a
``java.util.List``: ``size()``, ``isEmpty()``) and of a string (``length()``,
``isEmpty()``), by their method: ``f.legs.size >= 2``, ``f.code.length = 3``."""

_MAP_VIEWS: Final = frozenset(
    {"size", "isEmpty", "values", "keySet", "keys", "entrySet", "entries"}
)
"""What a mapping without such a key answers as a ``java.util.Map`` does: ``size()``,
``isEmpty()``, ``values()``, ``keySet()``, ``entrySet()`` (each entry a mapping of ``key``
and ``value``, as ``/r.entries`` gives)."""


def _map_view(mapping: Mapping[str, Any], attribute: str) -> Any:
    if attribute == "size":
        return len(mapping)
    if attribute == "isEmpty":
        return not mapping
    if attribute == "values":
        return list(mapping.values())
    if attribute in ("keySet", "keys"):
        return list(mapping)
    return [{"key": k, "value": v} for k, v in mapping.items()]


def read_path(value: Any, attributes: tuple[str, ...]) -> Any:
    """The value at an attribute path: a mapping's key at each step (or, for a key it lacks,
    what a ``java.util.Map`` answers: ``size``, ``isEmpty``, ``values``, ``keySet``,
    ``entrySet``), or a list's ``size`` or a string's ``length`` (and ``isEmpty`` of
    either), as Geode reads them through their methods; UNDEFINED as soon as a step has no
    such key or attribute (null included)."""
    current = value
    for attribute in attributes:
        if isinstance(current, Mapping):
            found = current.get(attribute, UNDEFINED)
            if found is UNDEFINED and attribute in _MAP_VIEWS:
                found = _map_view(current, attribute)
            current = found
        elif isinstance(current, list | tuple | str):
            if attribute == "isEmpty":
                current = not current
            elif isinstance(current, _SIZES.get(attribute, ())):
                current = len(current)
            else:
                return UNDEFINED
        else:
            return UNDEFINED
    return current


def compare(left: Any, right: Any, op: str) -> Any:
    """Geode's ``TypeUtils.compare`` (see the module docstring): True, False or UNDEFINED.

    Raises:
        CqEvaluationError: a relational operator between values of different kinds, or
            between values with no order (booleans, collections).
    """
    if left is None or right is None:
        if op == "=":
            return left is None and right is None
        if op == "<>":
            return not (left is None and right is None)
        return UNDEFINED
    if left is UNDEFINED or right is UNDEFINED:
        both = left is UNDEFINED and right is UNDEFINED
        if op == "<>" and not both:
            return True
        if op == "=" and both:
            return True
        return UNDEFINED
    left_kind, right_kind = _kind(left), _kind(right)
    if left_kind == right_kind and left_kind in ("number", "string"):
        if op == "=":
            return bool(left == right)
        if op == "<>":
            return bool(left != right)
        if op == "<":
            return bool(left < right)
        if op == "<=":
            return bool(left <= right)
        if op == ">":
            return bool(left > right)
        return bool(left >= right)
    if op == "=":
        return left_kind == right_kind and bool(left == right)
    if op == "<>":
        return not (left_kind == right_kind and bool(left == right))
    raise CqEvaluationError(
        f"cannot compare {left_kind} {_shown(left)} with {right_kind} {_shown(right)} "
        f"using {op} (Geode TypeMismatchException)"
    )


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}..."


def _junction(expr: Junction, value: Any, likes: LikePatterns) -> Any:
    deciding = expr.op == "OR"  # the operand value that decides the junction at once
    undefined = False
    failure: CqEvaluationError | None = None
    for operand in expr.operands:
        try:
            result = evaluate(operand, value, likes)
        except CqEvaluationError as exc:
            failure = failure or exc
            continue
        if result is deciding:
            return deciding
        if result is None or result is UNDEFINED:
            undefined = True
        elif not isinstance(result, bool):
            failure = failure or CqEvaluationError(
                f"{expr.op} operands must be boolean, not {type(result).__name__}"
            )
    if failure is not None:
        raise failure
    return UNDEFINED if undefined else not deciding


def _negate(result: Any) -> Any:
    if isinstance(result, bool):
        return not result
    if result is None or result is UNDEFINED:
        return UNDEFINED
    raise CqEvaluationError(f"{type(result).__name__} cannot be negated")


def _membership(expr: Membership, value: Any, likes: LikePatterns) -> Any:
    element = evaluate(expr.element, value, likes)
    if isinstance(expr.collection, Path):
        collection = read_path(value, expr.collection.attributes)
        if collection is None or collection is UNDEFINED:
            return UNDEFINED
        if isinstance(collection, Mapping) or not isinstance(collection, list | tuple):
            raise CqEvaluationError(f"IN needs a collection, got {type(collection).__name__}")
        members: Any = collection
    elif isinstance(expr.collection, Parameter):
        raise CqEvaluationError(f"bind parameter ${expr.collection.number} was not bound")
    else:
        members = (evaluate(m, value, likes) for m in expr.collection)
    # "=" never raises: values of different kinds are just not equal.
    return any(compare(element, member, "=") is True for member in members)


def like_pattern(pattern: str) -> Any:
    """Compile a LIKE pattern (Geode ``CompiledLike.getRegexPattern``): ``%`` matches any
    run of characters, ``_`` any one, a backslash makes the next character literal.

    Raises:
        re2.error: the pattern does not compile within RE2's memory budget of 1 MiB.
    """
    parts: list[str] = []
    escaped = False
    for char in pattern:
        if escaped:
            parts.append(re2.escape(char))
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "%":
            parts.append(".*")
        elif char == "_":
            parts.append(".")
        else:
            parts.append(re2.escape(char))
    if escaped:
        parts.append(re2.escape("\\"))
    options = re2.Options()
    options.dot_nl = True
    options.max_mem = _LIKE_MAX_MEM_BYTES
    options.log_errors = False
    return re2.compile("".join(parts), options)


def like_program_size(compiled: Any) -> int:
    """The RE2 instructions of a compiled LIKE pattern (forward or reverse, the larger)."""
    return int(max(compiled.programsize, compiled.reverseprogramsize))


def _like(expr: Like, value: Any, likes: LikePatterns) -> Any:
    operand = evaluate(expr.operand, value, likes)
    if operand is None or operand is UNDEFINED:
        return UNDEFINED
    if not isinstance(operand, str):
        return False
    return likes.fullmatch(expr.pattern, operand)


__all__ = [
    "MAX_LIKE_PROGRAM_SIZE",
    "MAX_LIKE_WORK",
    "LikePatterns",
    "compare",
    "evaluate",
    "like_pattern",
    "like_program_size",
    "read_path",
    "selects",
]
