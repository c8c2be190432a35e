"""OQL text to a checked expression tree: parsing with the one grammar (``oql.lark``), the
limits on a query's size and nesting, and the reading of expressions (paths, literals,
predicates, LIKE patterns compiled within RE2's budget).

Shared by continuous queries (`regionbus.schemas.cq.parser`) and one-shot queries
(`regionbus.schemas.query`), so both read the same OQL the same way, within the same
bounds; each refuses what it does not support with its own error class.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from importlib import resources
from typing import Any, Final

import re2
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedInput

from regionbus.schemas.cq.evaluate import (
    MAX_LIKE_PROGRAM_SIZE,
    LikePatterns,
    like_pattern,
    like_program_size,
)
from regionbus.schemas.cq.rules import BIND_PARAMETER, LIKE_PATTERN, SYNTAX, UNSUPPORTED_EXPRESSION
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
)

MAX_CQ_QUERY_CHARS: Final = 4096
"""Longest query text accepted: it bounds the predicate each change is evaluated against
on the servers' thread (Geode sets no limit). One-shot queries have the same bound."""

MAX_CQ_NESTING: Final = 100
"""Deepest the parsed query may nest (parentheses, NOT, AND/OR, comparisons each add a level
or two; a plain query of a few predicates nests about 20). Checked here, where the client
and the servers parse, before anything walks the query recursively: past some 980 levels
Python's recursion limit was met, at the client or only at the server."""

Refuse = Callable[[str, str], Exception]
"""``refuse(rule, message)``: the exception to raise for a query that breaks ``rule``."""


@functools.cache
def _parser() -> Lark:
    grammar = resources.files("regionbus.schemas.cq").joinpath("oql.lark").read_text()
    return Lark(grammar, parser="lalr", maybe_placeholders=False)


def select_tree(query: object, refuse: Refuse) -> Tree:
    """Parse OQL text to its SELECT statement's tree, within the size bounds.

    Args:
        query: The query text.
        refuse: Makes the exception for a refused query.

    Raises:
        Exception: what ``refuse`` makes, with rule ``syntax``: the query is not a str, or
            is longer than :data:`MAX_CQ_QUERY_CHARS`, does not parse, or nests deeper than
            :data:`MAX_CQ_NESTING`.
    """
    if not isinstance(query, str):
        raise refuse(SYNTAX, f"a query is a str, got {type(query).__name__}")
    if len(query) > MAX_CQ_QUERY_CHARS:
        raise refuse(
            SYNTAX, f"the query is {len(query)} characters, more than {MAX_CQ_QUERY_CHARS}"
        )
    try:
        tree = _parser().parse(query)
    except UnexpectedInput as exc:
        where = f"line {exc.line}, column {exc.column}" if exc.line > 0 else "the end"
        raise refuse(SYNTAX, f"syntax error in query at {where}: {_unexpected(exc)}") from None
    except RecursionError:
        raise refuse(SYNTAX, "the query nests too deeply") from None
    depth = _depth(tree)
    if depth > MAX_CQ_NESTING:
        raise refuse(SYNTAX, f"the query nests {depth} levels deep, more than {MAX_CQ_NESTING}")
    select = tree.children[-1]
    assert isinstance(select, Tree)
    return select


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


class ExpressionReader:
    """Reads the expressions of one query: attribute paths relative to the iterator (its
    alias dropped), literals, predicates, and its LIKE patterns, compiled once.

    Args:
        refuse: Makes the exception for an expression the query may not hold.
        what: How the refusals name the query's kind (``"CQ predicates"``).
        parameters: Bind parameters (``$1``) are allowed (one-shot queries); else refused
            with rule ``bind-parameter``.
    """

    def __init__(self, refuse: Refuse, what: str, *, parameters: bool = False) -> None:
        self.refuse = refuse
        self.alias: str | None = None
        self.scopes: tuple[str, ...] = ()
        """With several iterators (a one-shot query's drill-downs), their names, the
        region's first: a path keeps the name it begins with, and a path beginning with
        none of them is read from the region's element (the first)."""
        self._what = what
        self._parameters = parameters
        self._likes: dict[str, tuple[Any, int]] = {}

    def likes(self) -> LikePatterns:
        """The query's LIKE patterns, compiled.

        Raises:
            Exception: (rule ``like-pattern``) they compile larger than
                `regionbus.schemas.cq.evaluate.MAX_LIKE_PROGRAM_SIZE` together.
        """
        likes = LikePatterns(self._likes)
        if likes.program_size > MAX_LIKE_PROGRAM_SIZE:
            raise self.refuse(
                LIKE_PATTERN,
                f"the LIKE patterns compile to {likes.program_size} instructions, more than "
                f"{MAX_LIKE_PROGRAM_SIZE}",
            )
        return likes

    def expr(self, node: Tree | Token) -> Expr:
        """The expression a parse tree node is.

        Raises:
            Exception: what ``refuse`` makes, for a function call, a subquery, a region
                path, a LIKE whose pattern is not a string literal, an IN set of
                non-literals, or a bind parameter where none is allowed.
        """
        if isinstance(node, Token):  # pragma: no cover - every operand is a tree
            raise self.refuse(SYNTAX, f"unexpected {node!s}")
        data = node.data
        children = [c for c in node.children if not _is_keyword(c)]
        if data == "path":
            return self.path(node)
        if data in _LITERALS:
            return Literal(_literal(data, node))
        if data == "bind_parameter":
            return self._parameter(node.children[0])
        if data == "comparison":
            left, operator, right = children
            op = "<>" if str(operator) == "!=" else str(operator)
            return Comparison(op, self.expr(left), self.expr(right))
        if data == "or_expr" or data == "and_expr":
            op = "OR" if data == "or_expr" else "AND"
            return Junction(op, tuple(self.expr(c) for c in children))
        if data == "negation":
            return Not(self.expr(children[0]))
        if data in ("is_defined", "is_undefined"):
            return Defined(self.expr(children[0]), data == "is_defined")
        if data == "membership":
            negated = _negated(node)
            element, collection = children
            member = Membership(self.expr(element), self._collection(collection))
            return Not(member) if negated else member
        if data == "like":
            negated = _negated(node)
            operand, pattern = children
            if not (isinstance(pattern, Tree) and pattern.data == "string"):
                raise self.refuse(UNSUPPORTED_EXPRESSION, "LIKE needs a string literal pattern")
            like = Like(self.expr(operand), str(_literal("string", pattern)))
            self._like(like.pattern)
            return Not(like) if negated else like
        if data in ("function_call", "function_star", "function_distinct"):
            name = name_of(node.children[0])
            raise self.refuse(
                UNSUPPORTED_EXPRESSION,
                f"function or method {name}() is not supported in {self._what} "
                "(IS_DEFINED and IS_UNDEFINED are)",
            )
        raise self.refuse(UNSUPPORTED_EXPRESSION, f"{data} is not supported in {self._what}")

    def path(self, node: Tree) -> Path:
        """An attribute path, relative to the iterator (a leading alias dropped), or with
        several iterators led by the name of the one it reads (:attr:`scopes`)."""
        names = [name_of(c) for c in node.children if isinstance(c, Tree)]
        if self.scopes:
            if names and names[0] in self.scopes:
                return Path(tuple(names))
            return Path((self.scopes[0], *names))
        if self.alias is not None and names and names[0] == self.alias:
            names = names[1:]
        return Path(tuple(names))

    def _parameter(self, token: Tree | Token) -> Parameter:
        if not self._parameters:
            raise self.refuse(BIND_PARAMETER, f"{self._what} do not support bind parameters")
        index = int(str(token)[1:])
        if index < 1:
            raise self.refuse(SYNTAX, "bind parameters are numbered from $1")
        return Parameter(index)

    def _collection(self, node: Tree | Token) -> tuple[Expr, ...] | Path | Parameter:
        assert isinstance(node, Tree)
        if node.data == "path_collection":
            path_tree = node.children[0]
            assert isinstance(path_tree, Tree)
            return self.path(path_tree)
        if node.data == "parameter_collection":
            return self._parameter(node.children[0])
        members = tuple(self.expr(c) for c in node.children if isinstance(c, Tree))
        if not all(isinstance(m, Literal | Parameter) for m in members):
            raise self.refuse(UNSUPPORTED_EXPRESSION, "an IN set holds literals only")
        return members

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


_LITERALS: Final = frozenset({"string", "number", "true", "false", "null", "undefined"})


def _is_keyword(node: Tree | Token) -> bool:
    return isinstance(node, Token) and node.type != "COMPARATOR"


def _negated(node: Tree) -> bool:
    return any(isinstance(c, Token) and c.type == "NOT" for c in node.children)


def name_of(node: Tree | Token) -> str:
    """The identifier a ``name`` node holds (a quoted name without its quotes)."""
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


__all__ = [
    "MAX_CQ_NESTING",
    "MAX_CQ_QUERY_CHARS",
    "ExpressionReader",
    "Refuse",
    "name_of",
    "select_tree",
]
