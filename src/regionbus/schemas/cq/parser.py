"""Parsing a continuous query, and refusing what Geode's CQs do not support.

The grammar (``oql.lark``, read by lark's LALR(1) parser) covers more of OQL than CQs
allow, so that a query outside the subset is refused with the rule it breaks, in the order
and words of Geode's ``CqQueryImpl.validateCq``, rather than with a syntax error. The
client checks a query at ``new_cq`` and the servers again when it is executed, with this
same code.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any, Final, NamedTuple

import re2
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedInput

from regionbus.schemas.cq.evaluate import (
    MAX_LIKE_PROGRAM_SIZE,
    LikePatterns,
    like_pattern,
    like_program_size,
    selects,
)
from regionbus.schemas.cq.rules import (
    BIND_PARAMETER,
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
    Path,
    canonical_text,
    normalized,
)
from regionbus.schemas.errors import CqInvalidError

MAX_CQ_QUERY_CHARS: Final = 4096
"""Longest query text accepted: it bounds the predicate each change is evaluated against
on the servers' thread (Geode sets no limit)."""

MAX_CQ_NESTING: Final = 100
"""Deepest the parsed query may nest (parentheses, NOT, AND/OR, comparisons each add a level
or two; a plain query of a few predicates nests about 20). Checked here, where the client
and the servers parse, before anything walks the query recursively: past some 980 levels
Python's recursion limit was met, at the client or only at the server."""

_REGION_ATTRIBUTES: Final = ("entries", "entryset", "values", "keys", "keyset")
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


@functools.cache
def _parser() -> Lark:
    grammar = resources.files("regionbus.schemas.cq").joinpath("oql.lark").read_text()
    return Lark(grammar, parser="lalr", maybe_placeholders=False)


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
    if not isinstance(query, str):
        raise CqInvalidError(
            f"a CQ query is a str, got {type(query).__name__}", rule=SYNTAX, query=str(query)
        )
    if len(query) > MAX_CQ_QUERY_CHARS:
        raise CqInvalidError(
            f"the query is {len(query)} characters, more than {MAX_CQ_QUERY_CHARS}",
            rule=SYNTAX,
            query=query[:MAX_CQ_QUERY_CHARS],
        )
    try:
        tree = _parser().parse(query)
    except UnexpectedInput as exc:
        where = f"line {exc.line}, column {exc.column}" if exc.line > 0 else "the end"
        raise CqInvalidError(
            f"syntax error in CQ query at {where}: {_unexpected(exc)}", rule=SYNTAX, query=query
        ) from None
    except RecursionError:
        raise CqInvalidError("the query nests too deeply", rule=SYNTAX, query=query) from None
    depth = _depth(tree)
    if depth > MAX_CQ_NESTING:
        raise CqInvalidError(
            f"the query nests {depth} levels deep, more than {MAX_CQ_NESTING}",
            rule=SYNTAX,
            query=query,
        )
    select = tree.children[-1]
    assert isinstance(select, Tree)
    return _Checker(query).check(select)


def _depth(tree: Tree) -> int:
    """How deep a parse tree nests, walked without recursion."""
    deepest = 0
    stack: list[tuple[Tree, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, Tree))
    return deepest


def _unexpected(exc: UnexpectedInput) -> str:
    token = getattr(exc, "token", None)
    if token is not None:
        return f"unexpected {str(token)!r}" if str(token) else "unexpected end of query"
    char = getattr(exc, "char", None)
    return f"unexpected character {char!r}" if char else "unexpected input"


class _Checker:
    """Walks the parsed SELECT, refusing what CQs do not support, in Geode's order."""

    def __init__(self, query: str) -> None:
        self._query = query
        self._alias: str | None = None
        self._likes: dict[str, tuple[Any, int]] = {}

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
        if any(True for _ in select.find_data("bind_parameter")):
            raise self.refuse(BIND_PARAMETER, "CQ queries do not support bind parameters")
        predicate = None if where is None else normalized(self._expr(where.children[1]))
        likes = LikePatterns(self._likes)
        if likes.program_size > MAX_LIKE_PROGRAM_SIZE:
            raise self.refuse(
                LIKE_PATTERN,
                f"the LIKE patterns compile to {likes.program_size} instructions, more than "
                f"{MAX_LIKE_PROGRAM_SIZE}",
            )
        return ParsedCq(self._query, region, predicate, canonical_text(region, predicate), likes)

    def _like(self, pattern: str) -> None:
        """Compile a LIKE pattern once per query, within RE2's memory budget."""
        if pattern in self._likes:
            return
        try:
            compiled = like_pattern(pattern)
        except re2.error:
            shown = pattern if len(pattern) <= 80 else f"{pattern[:80]}..."
            raise self.refuse(
                LIKE_PATTERN, f"LIKE pattern {shown!r} does not compile within 1 MiB"
            ) from None
        self._likes[pattern] = (compiled, like_program_size(compiled))

    def _iterator(self, iterator: Tree) -> str:
        alias_tree: Tree | None
        if iterator.data == "iterator_in":
            alias_tree, collection = [c for c in iterator.children if isinstance(c, Tree)]
        else:
            collection = iterator.children[0]
            named = [c for c in iterator.children[1:] if isinstance(c, Tree)]
            alias_tree = named[0] if named else None
        if not (isinstance(collection, Tree) and collection.data == "region"):
            raise self.refuse(
                REGION_PATH,
                "CQ queries must have a region path only as the first iterator in the FROM clause",
            )
        path = str(collection.children[0])[1:]
        last = path.rsplit(".", 1)
        if len(last) == 2 and last[1].lower().rstrip("()") in _REGION_ATTRIBUTES:
            raise self.refuse(
                REGION_PATH,
                f"CQ queries must have a region path only as the first iterator in the FROM "
                f"clause, not /{path}",
            )
        if alias_tree is not None:
            assert isinstance(alias_tree, Tree)
            self._alias = _name(alias_tree)
        return path

    def _expr(self, node: Tree | Token) -> Expr:
        if isinstance(node, Token):  # pragma: no cover - every operand is a tree
            raise self.refuse(SYNTAX, f"unexpected {node!s}")
        data = node.data
        children = [c for c in node.children if not _is_keyword(c)]
        if data == "path":
            return self._path(node)
        if data in _LITERALS:
            return Literal(_literal(data, node))
        if data == "comparison":
            left, operator, right = children
            op = "<>" if str(operator) == "!=" else str(operator)
            return Comparison(op, self._expr(left), self._expr(right))
        if data == "or_expr" or data == "and_expr":
            op = "OR" if data == "or_expr" else "AND"
            return Junction(op, tuple(self._expr(c) for c in children))
        if data == "negation":
            return Not(self._expr(children[0]))
        if data in ("is_defined", "is_undefined"):
            return Defined(self._expr(children[0]), data == "is_defined")
        if data == "membership":
            negated = _negated(node)
            element, collection = children
            member = Membership(self._expr(element), self._collection(collection))
            return Not(member) if negated else member
        if data == "like":
            negated = _negated(node)
            operand, pattern = children
            if not (isinstance(pattern, Tree) and pattern.data == "string"):
                raise self.refuse(UNSUPPORTED_EXPRESSION, "LIKE needs a string literal pattern")
            like = Like(self._expr(operand), str(_literal("string", pattern)))
            self._like(like.pattern)
            return Not(like) if negated else like
        if data == "function_call":
            name = _name(node.children[0])
            raise self.refuse(
                UNSUPPORTED_EXPRESSION,
                f"function or method {name}() is not supported in CQ predicates "
                "(IS_DEFINED and IS_UNDEFINED are)",
            )
        raise self.refuse(UNSUPPORTED_EXPRESSION, f"{data} is not supported in CQ predicates")

    def _collection(self, node: Tree | Token) -> tuple[Expr, ...] | Path:
        assert isinstance(node, Tree)
        if node.data == "path_collection":
            path_tree = node.children[0]
            assert isinstance(path_tree, Tree)
            return self._path(path_tree)
        members = tuple(self._expr(c) for c in node.children if isinstance(c, Tree))
        if not all(isinstance(m, Literal) for m in members):
            raise self.refuse(UNSUPPORTED_EXPRESSION, "an IN set holds literals only")
        return members

    def _path(self, node: Tree) -> Path:
        names = [_name(c) for c in node.children if isinstance(c, Tree)]
        if self._alias is not None and names and names[0] == self._alias:
            names = names[1:]
        return Path(tuple(names))


_LITERALS: Final = frozenset({"string", "number", "true", "false", "null", "undefined"})


def _is_keyword(node: Tree | Token) -> bool:
    return isinstance(node, Token) and node.type != "COMPARATOR"


def _negated(node: Tree) -> bool:
    return any(isinstance(c, Token) and c.type == "NOT" for c in node.children)


def _name(node: Tree | Token) -> str:
    token = node.children[0] if isinstance(node, Tree) else node
    text = str(token)
    return text[1:-1] if text.startswith('"') else text


def _literal(data: str, node: Tree) -> Any:
    if data == "null":
        return None
    if data == "undefined":
        return UNDEFINED
    if data in ("true", "false"):
        return data == "true"
    text = str(node.children[0])
    if data == "string":
        return text[1:-1].replace("''", "'")
    if text[-1] in "lL":
        return int(text[:-1])
    if text[-1] in "fFdD":
        return float(text[:-1])
    if any(c in text for c in ".eE"):
        return float(text)
    return int(text)


__all__ = ["MAX_CQ_QUERY_CHARS", "ParsedCq", "parse_cq"]
