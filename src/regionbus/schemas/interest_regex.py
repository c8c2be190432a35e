"""Interest regexes: one check, shared by the client and the server, and a linear-time engine.

A regex registration is matched against the key of every change of its region, on the
server's one thread. Python's ``re`` backtracks (``(a+)+$`` on 40 ``a`` stalls for hours)
and compiles nested groups by recursion (500 nested groups raise ``RecursionError``), so a
hostile pattern could stop a server. Patterns are compiled with RE2 instead (``google-re2``),
whose matching time is linear in the key's length and the pattern's compiled size, and both
are bounded: the pattern by :data:`MAX_INTEREST_REGEX_CHARS` and
:data:`MAX_INTEREST_REGEX_PROGRAM_SIZE`, the key by
``regionbus.schemas.entry_checks.MAX_KEY_SIZE_BYTES``.

Syntax (RE2's, https://github.com/google/re2/wiki/Syntax): what Python ``re`` and Java's
``Pattern`` (Geode's ``registerInterestRegex``) share for matching keys: literals, ``.``,
classes (``[A-Z]``, ``\\d``, ``\\w``, ``\\s``, ``[[:alpha:]]``), groups, named groups
``(?P<name>...)``, alternation, ``* + ? {n,m}`` (m at most 1000), lazy quantifiers, anchors
``^ $ \\A \\z \\b``, flags ``(?i) (?s) (?m)``. Not accepted: backreferences (``\\1``,
``(?P=name)``), lookahead and lookbehind (``(?=``, ``(?!``, ``(?<=``, ``(?<!``), possessive
quantifiers and atomic groups. A pattern is matched against the whole key (Java
``Matcher.matches()``, Python ``fullmatch``).
"""

from __future__ import annotations

from typing import Any, Final, Protocol

import re2

from regionbus.schemas.errors import InvalidInterestError

MAX_INTEREST_REGEX_CHARS: Final = 1000
"""Longest accepted pattern, in characters."""

MAX_INTEREST_REGEX_PROGRAM_SIZE: Final = 500
"""Largest accepted compiled pattern, in RE2 program instructions (``UA-.*`` is 15,
``(?i)flight-[0-9]{1,5}-(ua|aa|dl)`` 29). Matching costs about key length x program size:
500 keeps the worst case near 1 ms per event for a key of ``MAX_KEY_SIZE_BYTES``
(measured ``(.*a){45}``, 499 instructions, 1.3 ms), where 11,000 took 230 ms."""

_MAX_MEM_BYTES: Final = 1 << 20
"""RE2's memory budget for one compiled pattern (its default is 8 MiB)."""


class InterestRegex(Protocol):
    """A compiled interest regex (an RE2 pattern)."""

    @property
    def pattern(self) -> str:
        """The pattern's text."""
        ...

    def fullmatch(self, text: str) -> Any:
        """A match object when the whole of ``text`` matches, else None."""
        ...


def _options() -> Any:
    options = re2.Options()
    options.max_mem = _MAX_MEM_BYTES
    # A refused pattern is the caller's error, reported to it; RE2 would also print it.
    options.log_errors = False
    return options


_OPTIONS: Final = _options()


def compile_interest_regex(pattern: object) -> InterestRegex:
    """Check and compile an interest regex, identically at the client and the server.

    Args:
        pattern: The regex (a ``str`` of RE2 syntax, see the module docstring), matched
            against whole keys.

    Returns:
        The compiled pattern; its ``fullmatch(key)`` runs in time linear in ``len(key)``.

    Raises:
        InvalidInterestError: the pattern is missing or not a ``str``, holds a lone
            surrogate, is longer than :data:`MAX_INTEREST_REGEX_CHARS`, does not compile
            under RE2 (e.g. a backreference or lookaround), or compiles larger than
            :data:`MAX_INTEREST_REGEX_PROGRAM_SIZE`. The message says which.
    """
    if pattern is None:
        raise InvalidInterestError("a REGEX registration needs a pattern")
    if not isinstance(pattern, str):
        raise InvalidInterestError(f"an interest regex is a str, got {type(pattern).__name__}")
    shown = pattern if len(pattern) <= 80 else f"{pattern[:80]}..."
    if len(pattern) > MAX_INTEREST_REGEX_CHARS:
        raise InvalidInterestError(
            f"interest regex {shown!r} is {len(pattern)} characters, more than "
            f"{MAX_INTEREST_REGEX_CHARS}"
        )
    try:
        compiled = re2.compile(pattern, _OPTIONS)
    except UnicodeEncodeError as exc:
        raise InvalidInterestError(
            f"interest regex {shown!r} is not valid Unicode: {exc}"
        ) from None
    except re2.error as exc:
        raw = exc.args[0] if exc.args else exc
        reason = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        raise InvalidInterestError(
            f"invalid interest regex {shown!r}: {reason} (RE2 syntax: no backreferences or "
            "lookaround)"
        ) from None
    size = max(compiled.programsize, compiled.reverseprogramsize)
    if size > MAX_INTEREST_REGEX_PROGRAM_SIZE:
        raise InvalidInterestError(
            f"interest regex {shown!r} compiles to {size} instructions, more than "
            f"{MAX_INTEREST_REGEX_PROGRAM_SIZE}"
        )
    result: InterestRegex = compiled
    return result


__all__ = [
    "MAX_INTEREST_REGEX_CHARS",
    "MAX_INTEREST_REGEX_PROGRAM_SIZE",
    "InterestRegex",
    "compile_interest_regex",
]
