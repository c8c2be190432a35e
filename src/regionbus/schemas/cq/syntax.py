"""The predicate of a continuous query as a tree, and its canonical text.

A CQ is ``SELECT * FROM /region [alias] [WHERE predicate]``; only the predicate varies, so
the tree is the predicate's. Attribute paths are kept relative to the region's value (the
alias is dropped: ``f.dep_delay`` and ``dep_delay`` are the same path, as Geode resolves a
bare name against the iterator). The canonical text (:func:`canonical_text`) is the same
for queries that differ only in alias, keyword case, spacing, ``!=`` for ``<>``, the order
of ``AND`` / ``OR`` operands and of ``IN`` set members, or a literal written on the left
of a comparison: the servers evaluate each distinct canonical query of a region once per
change, whatever number of clients hold it.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple


class Undefined:
    """Geode's ``QueryService.UNDEFINED``: the value of an attribute a value does not have
    (or of any attribute of null). One instance, :data:`UNDEFINED`."""

    _instance: Undefined | None = None

    def __new__(cls) -> Undefined:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNDEFINED"

    def __reduce__(self) -> str:
        return "UNDEFINED"


UNDEFINED: Final = Undefined()
"""The one UNDEFINED value."""


class Path(NamedTuple):
    """An attribute path from the region's value: ``("delay", "minutes")`` for
    ``f.delay.minutes``; ``()`` is the value itself."""

    attributes: tuple[str, ...]


class Literal(NamedTuple):
    """A constant: ``str``, ``int``, ``float``, ``bool``, None (``NULL``) or
    :data:`UNDEFINED`."""

    value: Any


class Parameter(NamedTuple):
    """A bind parameter ``$n`` of a one-shot query (``number`` n, from 1), replaced by the
    value it is bound to before the query is evaluated (`ParsedQuery.bind` of
    `regionbus.schemas.query.parser`)."""

    number: int


class Comparison(NamedTuple):
    """``left op right`` with ``op`` one of ``= <> < <= > >=``."""

    op: str
    left: Expr
    right: Expr


class Membership(NamedTuple):
    """``element IN collection``: a set of literals, or a path to a list."""

    element: Expr
    collection: tuple[Expr, ...] | Path | Parameter


class Like(NamedTuple):
    """``operand LIKE 'pattern'`` (``%`` any run of characters, ``_`` one, ``\\`` escapes)."""

    operand: Expr
    pattern: str


class Defined(NamedTuple):
    """``IS_DEFINED(operand)`` (``defined`` True) or ``IS_UNDEFINED(operand)``."""

    operand: Expr
    defined: bool


class Not(NamedTuple):
    """``NOT operand``."""

    operand: Expr


class Junction(NamedTuple):
    """``AND`` or ``OR`` of two or more operands."""

    op: str
    operands: tuple[Expr, ...]


Expr = Path | Literal | Parameter | Comparison | Membership | Like | Defined | Not | Junction
"""Any node of a predicate."""

_FLIPPED: Final = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_KEYWORDS: Final = frozenset(
    {
        "all", "and", "as", "asc", "by", "desc", "distinct", "false", "from", "group",
        "import", "in", "is_defined", "is_undefined", "like", "limit", "not", "null", "or",
        "order", "select", "set", "true", "undefined", "where", "v",
    }
)  # fmt: skip


def normalized(expr: Expr) -> Expr:
    """The canonical form of a predicate: nested junctions flattened, their operands and
    ``IN`` set members sorted and deduplicated, a literal on the left of a comparison
    moved right (its operator flipped).

    The evaluation of a junction does not depend on the order of its operands
    (`regionbus.schemas.cq.evaluate`), so the canonical form answers as the original.
    """
    if isinstance(expr, Junction):
        operands: dict[str, Expr] = {}
        for operand in expr.operands:
            canonical = normalized(operand)
            inner = (
                canonical.operands
                if isinstance(canonical, Junction) and canonical.op == expr.op
                else (canonical,)
            )
            for item in inner:
                operands.setdefault(text_of(item), item)
        ordered = tuple(operands[k] for k in sorted(operands))
        return ordered[0] if len(ordered) == 1 else Junction(expr.op, ordered)
    if isinstance(expr, Comparison):
        left, right = normalized(expr.left), normalized(expr.right)
        if isinstance(left, Literal) and not isinstance(right, Literal):
            return Comparison(_FLIPPED[expr.op], right, left)
        return Comparison(expr.op, left, right)
    if isinstance(expr, Membership):
        element = normalized(expr.element)
        if isinstance(expr.collection, Path | Parameter):
            return Membership(element, expr.collection)
        members = {text_of(m): m for m in (normalized(m) for m in expr.collection)}
        return Membership(element, tuple(members[k] for k in sorted(members)))
    if isinstance(expr, Like):
        return Like(normalized(expr.operand), expr.pattern)
    if isinstance(expr, Defined):
        return Defined(normalized(expr.operand), expr.defined)
    if isinstance(expr, Not):
        return Not(normalized(expr.operand))
    return expr


def text_of(expr: Expr) -> str:
    """The OQL text of a predicate, with the value's alias written ``v`` and every attribute
    name quoted when it is not a plain identifier (so the text parses back to ``expr``)."""
    if isinstance(expr, Path):
        return ".".join(("v", *(_name(a) for a in expr.attributes)))
    if isinstance(expr, Literal):
        return _literal(expr.value)
    if isinstance(expr, Parameter):
        return f"${expr.number}"
    if isinstance(expr, Comparison):
        return f"{text_of(expr.left)} {expr.op} {text_of(expr.right)}"
    if isinstance(expr, Membership):
        if isinstance(expr.collection, Path | Parameter):
            return f"{text_of(expr.element)} IN {text_of(expr.collection)}"
        members = ", ".join(text_of(m) for m in expr.collection)
        return f"{text_of(expr.element)} IN SET({members})"
    if isinstance(expr, Like):
        return f"{text_of(expr.operand)} LIKE {_literal(expr.pattern)}"
    if isinstance(expr, Defined):
        function = "IS_DEFINED" if expr.defined else "IS_UNDEFINED"
        return f"{function}({text_of(expr.operand)})"
    if isinstance(expr, Not):
        return f"NOT ({text_of(expr.operand)})"
    return f" {expr.op} ".join(f"({text_of(o)})" for o in expr.operands)


def canonical_text(region: str, predicate: Expr | None) -> str:
    """The canonical query text: ``SELECT * FROM /region v [WHERE predicate]``, with
    ``predicate`` in :func:`normalized` form."""
    head = f"SELECT * FROM /{region} v"
    if predicate is None:
        return head
    return f"{head} WHERE {text_of(normalized(predicate))}"


def _name(attribute: str) -> str:
    if attribute.isidentifier() and attribute.isascii() and attribute.lower() not in _KEYWORDS:
        return attribute
    return f'"{attribute}"'


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if value is UNDEFINED:
        return "UNDEFINED"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


__all__ = [
    "UNDEFINED",
    "Comparison",
    "Defined",
    "Expr",
    "Junction",
    "Like",
    "Literal",
    "Membership",
    "Not",
    "Parameter",
    "Path",
    "Undefined",
    "canonical_text",
    "normalized",
    "text_of",
]
