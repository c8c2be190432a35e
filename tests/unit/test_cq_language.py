"""Geode's CQ subset of OQL: what parses, what is refused with which rule, normalization,
and evaluation with Geode's UNDEFINED rules (``TypeUtils.compare``, ``CompiledJunction``,
``CompiledNegation``, ``CompiledIn``, ``CompiledLike``, ``CompiledUndefined``)."""

from __future__ import annotations

from typing import Any

import pytest

from regionbus.schemas.cq import CQ_RULES, UNDEFINED, parse_cq, query_operation
from regionbus.schemas.cq.evaluate import compare
from regionbus.schemas.errors import CqEvaluationError, CqInvalidError, RegionBusError
from regionbus.schemas.messages import EventKind

REFUSALS = [
    ("SELECT DISTINCT * FROM /r", "distinct"),
    ("SELECT * FROM /r a, /s b WHERE a.id = b.id", "one-region"),
    ("SELECT * FROM /r WHERE x IN (SELECT * FROM /r)", "one-region"),
    ("SELECT * FROM /r WHERE x IN /s", "one-region"),
    ("SELECT * FROM /r p, p.positions q", "one-iterator"),
    ("SELECT * FROM /r.entries e", "region-path"),
    ("SELECT * FROM /r.values", "region-path"),
    ("SELECT * FROM (SELECT * FROM /r) x", "one-region"),
    ("SELECT f.origin FROM /r f", "projection"),
    ("SELECT f.origin, f.dest FROM /r f", "projection"),
    # An aggregate is a projection (Geode CqQueryImpl.validateCq).
    ("SELECT COUNT(*) FROM /r", "projection"),
    ("SELECT * FROM /r f ORDER BY f.dep_delay", "order-by"),
    ("SELECT * FROM /r f GROUP BY f.origin", "group-by"),
    ("SELECT * FROM /r LIMIT 10", "limit"),
    ("SELECT * FROM /r f WHERE f.dep_delay > $1", "bind-parameter"),
    ("SELECT * FROM /r f WHERE lower(f.origin) = 'jfk'", "unsupported-expression"),
    ("SELECT * FROM /r f WHERE f.origin IN SET(f.dest)", "unsupported-expression"),
    ("SELECT * FROM /r f WHERE f.origin LIKE f.dest", "unsupported-expression"),
    ("SELEC * FROM /r", "syntax"),
    ("SELECT * FROM /r WHERE", "syntax"),
    ("SELECT * FROM /r WHERE x = 'open", "syntax"),
    ("SELECT * FROM r", "one-region"),
    ("", "syntax"),
]


@pytest.mark.parametrize(("query", "rule"), REFUSALS)
def test_a_query_outside_the_subset_is_refused_naming_its_rule(query: str, rule: str) -> None:
    with pytest.raises(CqInvalidError) as caught:
        parse_cq(query)
    assert caught.value.rule == rule
    assert caught.value.query == query
    assert isinstance(caught.value, RegionBusError)
    assert rule in CQ_RULES


def test_an_overlong_query_and_a_non_string_are_refused() -> None:
    with pytest.raises(CqInvalidError, match="more than 4096"):
        parse_cq("SELECT * FROM /r WHERE " + " OR ".join(["x = 1"] * 1000))
    with pytest.raises(CqInvalidError, match="is a str"):
        parse_cq(42)


ACCEPTED = [
    ("SELECT * FROM /flights", "flights"),
    ("select all * from /flights f where f.dep_delay > 60 ;", "flights"),
    ("import org.example.Flight; SELECT * FROM /flights AS f WHERE f.origin = 'JFK'", "flights"),
    ("SELECT * FROM /a.b-c_d f WHERE f.x = 1", "a.b-c_d"),
    ("SELECT * FROM /root/child WHERE x = 1", "root/child"),
]


@pytest.mark.parametrize(("query", "region"), ACCEPTED)
def test_queries_of_the_subset_parse_with_their_region(query: str, region: str) -> None:
    assert parse_cq(query).region == region


EQUIVALENT = [
    (
        "SELECT * FROM /flights f WHERE f.dep_delay > 60",
        "select * from /flights where dep_delay>60",
    ),
    ("SELECT * FROM /r x WHERE 60 < x.d", "SELECT * FROM /r WHERE d > 60"),
    (
        "SELECT * FROM /r f WHERE f.a = 1 AND f.b = 2",
        "SELECT * FROM /r g WHERE g.b = 2 and g.a = 1",
    ),
    (
        "SELECT * FROM /r WHERE a = 1 OR (b = 2 OR c = 3)",
        "SELECT * FROM /r WHERE c = 3 OR b = 2 OR a = 1",
    ),
    ("SELECT * FROM /r WHERE a != 1", "SELECT * FROM /r WHERE a <> 1"),
    ("SELECT * FROM /r WHERE a IN SET('x', 'y')", "SELECT * FROM /r WHERE a IN ('y', 'x', 'x')"),
    ("SELECT * FROM /r f WHERE f.a = 1 AND f.a = 1", "SELECT * FROM /r WHERE a = 1"),
]


@pytest.mark.parametrize(("first", "second"), EQUIVALENT)
def test_equivalent_queries_have_one_canonical_text(first: str, second: str) -> None:
    assert parse_cq(first).canonical == parse_cq(second).canonical


def test_different_queries_keep_different_canonical_texts() -> None:
    texts = {
        parse_cq(q).canonical
        for q in (
            "SELECT * FROM /r WHERE a > 1",
            "SELECT * FROM /r WHERE a >= 1",
            "SELECT * FROM /s WHERE a > 1",
            "SELECT * FROM /r WHERE a > 2",
            "SELECT * FROM /r WHERE a > '1'",
            "SELECT * FROM /r",
        )
    }
    assert len(texts) == 6


def test_the_canonical_text_parses_back_to_itself() -> None:
    for query, _ in EQUIVALENT:
        canonical = parse_cq(query).canonical
        assert parse_cq(canonical).canonical == canonical
    tricky = parse_cq("SELECT * FROM /r p WHERE p.\"dep-delay\" > 1 AND p.\"v\" = 'it''s'")
    assert parse_cq(tricky.canonical).canonical == tricky.canonical


FLIGHT = {"origin": "JFK", "dep_delay": 75, "delay": {"minutes": 12}, "tail": None,
          "cancelled": False, "tags": ["red", "eye"], "ratio": 1.5}  # fmt: skip

EVALUATIONS: list[tuple[str, Any, bool]] = [
    # comparisons of numbers and strings
    ("f.dep_delay > 60", FLIGHT, True),
    ("f.dep_delay > 75", FLIGHT, False),
    ("f.dep_delay >= 75", FLIGHT, True),
    ("f.dep_delay = 75.0", FLIGHT, True),
    ("f.ratio < 2", FLIGHT, True),
    ("f.origin = 'JFK'", FLIGHT, True),
    ("f.origin <> 'JFK'", FLIGHT, False),
    ("f.origin < 'LGA'", FLIGHT, True),
    ("f.delay.minutes = 12", FLIGHT, True),
    ("f.cancelled = false", FLIGHT, True),
    ("f.cancelled", FLIGHT, False),
    ("NOT f.cancelled", FLIGHT, True),
    # UNDEFINED: a missing attribute, an attribute of null or of a non-mapping
    ("f.missing > 60", FLIGHT, False),
    ("f.missing < 60", FLIGHT, False),
    ("f.missing = 60", FLIGHT, False),
    ("f.missing <> 60", FLIGHT, True),  # Geode: <> with UNDEFINED is true
    ("f.tail.model = 'A320'", FLIGHT, False),
    ("f.tail.model <> 'A320'", FLIGHT, True),
    ("f.origin.code = 'J'", FLIGHT, False),
    ("NOT (f.missing > 60)", FLIGHT, False),  # NOT UNDEFINED is UNDEFINED
    ("f.missing = UNDEFINED", FLIGHT, True),
    ("IS_UNDEFINED(f.missing)", FLIGHT, True),
    ("IS_DEFINED(f.missing)", FLIGHT, False),
    ("IS_DEFINED(f.tail)", FLIGHT, True),  # null is defined
    ("IS_UNDEFINED(f.tail.model)", FLIGHT, True),
    # null
    ("f.tail = NULL", FLIGHT, True),
    ("f.tail <> NULL", FLIGHT, False),
    ("f.origin = NULL", FLIGHT, False),
    ("f.origin <> NULL", FLIGHT, True),
    ("f.missing = NULL", FLIGHT, False),
    ("f.missing <> NULL", FLIGHT, True),
    ("f.tail > 5", FLIGHT, False),
    # AND / OR with UNDEFINED
    ("f.missing > 1 AND f.dep_delay > 60", FLIGHT, False),
    ("f.missing > 1 OR f.dep_delay > 60", FLIGHT, True),
    ("f.missing > 1 OR f.dep_delay < 60", FLIGHT, False),
    ("NOT (f.missing > 1 OR f.dep_delay < 60)", FLIGHT, False),
    ("NOT (f.missing > 1 AND f.dep_delay < 60)", FLIGHT, True),
    # IN
    ("f.origin IN SET('JFK', 'LGA')", FLIGHT, True),
    ("f.origin IN ('EWR')", FLIGHT, False),
    ("f.dep_delay IN SET(75.0, 1)", FLIGHT, True),
    ("f.missing IN SET('JFK')", FLIGHT, False),
    ("NOT (f.missing IN SET('JFK'))", FLIGHT, True),
    ("f.tail IN SET(NULL)", FLIGHT, True),
    ("'red' IN f.tags", FLIGHT, True),
    ("'blue' IN f.tags", FLIGHT, False),
    ("'red' IN f.missing", FLIGHT, False),
    ("f.origin NOT IN SET('LGA')", FLIGHT, True),
    # LIKE
    ("f.origin LIKE 'J%'", FLIGHT, True),
    ("f.origin LIKE 'J_K'", FLIGHT, True),
    ("f.origin LIKE 'J_'", FLIGHT, False),
    ("f.origin LIKE 'jfk'", FLIGHT, False),
    ("f.origin NOT LIKE 'L%'", FLIGHT, True),
    ("f.dep_delay LIKE '7%'", FLIGHT, False),
    ("f.missing LIKE '%'", FLIGHT, False),
    ("f.missing NOT LIKE 'x'", FLIGHT, False),  # NOT UNDEFINED
    ("f.pct LIKE '100\\%'", {"pct": "100%"}, True),
    ("f.pct LIKE '100\\%'", {"pct": "1000"}, False),
    ("f.pct LIKE 'a.c'", {"pct": "abc"}, False),
    ("f.pct LIKE '%'", {"pct": "multi\nline"}, True),
    # values that are not mappings
    ("f = 'JFK'", "JFK", True),
    ("f > 3", 5, True),
    ("f.origin = 'JFK'", "JFK", False),
    ("f.origin <> 'JFK'", None, True),
    # type mismatch under = and <> is not an error
    ("f.origin = 5", FLIGHT, False),
    ("f.origin <> 5", FLIGHT, True),
    ("f.cancelled = 0", FLIGHT, False),
    ("f.delay = 12", FLIGHT, False),
    ("f.tags = f.tags", FLIGHT, True),
    # a list's size and a string's length, read by their methods as Geode reads them
    ("f.tags.size = 2", FLIGHT, True),
    ("f.tags.size >= 3", FLIGHT, False),
    ("f.tags.isEmpty", FLIGHT, False),
    ("f.origin.length = 3", FLIGHT, True),
    ("f.origin.isEmpty = false", FLIGHT, True),
    ("f.origin.size = 3", FLIGHT, False),  # a String has no size()
    ("f.delay.size = 1", FLIGHT, True),  # a mapping answers as a java.util.Map
    ("12 IN f.delay.values", FLIGHT, True),
    ("'minutes' IN f.delay.keySet", FLIGHT, True),
    ("f.delay.isEmpty", FLIGHT, False),
    ("f.delay.entrySet.size = 1", FLIGHT, True),
    ("f.tags.isEmpty = false AND f.origin.isEmpty = false", FLIGHT, True),
    ("f.box.values = 3", {"box": {"values": 3}}, True),  # a key is read first
    ("f.box.size = 7", {"box": {"size": 7}}, True),  # a key is read first
    ("f.dep_delay.length > 0", FLIGHT, False),
]


@pytest.mark.parametrize(("predicate", "value", "selected"), EVALUATIONS)
def test_a_predicate_selects_by_geodes_rules(predicate: str, value: Any, selected: bool) -> None:
    cq = parse_cq(f"SELECT * FROM /flights f WHERE {predicate}")
    assert cq.selects(value) is selected


def test_a_query_without_where_selects_every_value() -> None:
    assert parse_cq("SELECT * FROM /r").selects({"anything": 1}) is True


MISMATCHES = [
    "f.origin > 5",
    "f.cancelled < true",
    "f.tags > 1",
    "f.origin",
    "NOT f.origin",
    "f.origin AND f.dep_delay > 1",
    "'x' IN f.origin",
]


@pytest.mark.parametrize("predicate", MISMATCHES)
def test_a_relational_comparison_of_different_kinds_is_an_evaluation_error(
    predicate: str,
) -> None:
    cq = parse_cq(f"SELECT * FROM /flights f WHERE {predicate}")
    with pytest.raises(CqEvaluationError):
        cq.selects(FLIGHT)


def test_a_short_circuiting_operand_decides_whatever_fails_beside_it() -> None:
    # normalization may reorder operands: the answer must not depend on the order
    assert (
        parse_cq("SELECT * FROM /r f WHERE f.origin > 5 AND f.dep_delay = 1").selects(FLIGHT)
        is False
    )
    assert parse_cq("SELECT * FROM /r f WHERE f.origin > 5 OR f.dep_delay = 75").selects(FLIGHT)


def test_compare_follows_typeutils() -> None:
    assert compare(None, None, "=") is True
    assert compare(None, 1, "<>") is True
    assert compare(None, 1, "<") is UNDEFINED
    assert compare(UNDEFINED, UNDEFINED, "=") is True
    assert compare(UNDEFINED, UNDEFINED, "<>") is UNDEFINED
    assert compare(UNDEFINED, 1, "<>") is True
    assert compare(UNDEFINED, 1, ">") is UNDEFINED
    assert compare(1, 1.0, "=") is True
    assert compare(True, 1, "=") is False


QUERY_OPERATIONS = [
    (False, True, EventKind.CREATE),
    (True, True, EventKind.UPDATE),
    (True, False, EventKind.DESTROY),
    (False, False, None),
]


@pytest.mark.parametrize(("was_in", "is_in", "operation"), QUERY_OPERATIONS)
def test_the_query_operation_table(was_in: bool, is_in: bool, operation: EventKind | None) -> None:
    assert query_operation(was_in, is_in) is operation
