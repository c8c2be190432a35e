"""One-shot OQL queries' language: parsing (projections, ORDER BY, LIMIT, ``$n``), binding
parameters, the ORDER BY order of Geode's ``OrderByComparator``, and the merge of the
buckets' answers equal to evaluating the whole region at once."""

from __future__ import annotations

import json
import math
import pathlib
import random
from typing import Any

import pytest

from regionbus.broker.config import ServerSettings
from regionbus.broker.queries import _Grouped, _Kept
from regionbus.broker.validation import validate
from regionbus.schemas.cq import UNDEFINED, parse_cq
from regionbus.schemas.cq.syntax import Literal, Parameter, Path
from regionbus.schemas.errors import (
    CqInvalidError,
    InvalidOperationError,
    QueryInvalidError,
    QueryInvocationTargetError,
    QueryRowLimitError,
    QueryTypeMismatchError,
)
from regionbus.schemas.messages import Entry, Operation, OperationKind, QuerySpec
from regionbus.schemas.query import (
    MAX_BOUND_VALUES,
    PARTIAL_SERIALIZER,
    ParsedQuery,
    Struct,
    element,
    grouped_results,
    merged,
    parse_query,
    selected_rows,
)


def _bucket_answer(query: ParsedQuery, entries: dict[str, Any]) -> list[tuple[str, Any]]:
    """What a bucket's primary answers (`regionbus.broker.queries`, its own row keeper): its
    selected elements, ordered, distinct, limited; every one for a grouped query."""
    query = query.bucket_part()
    kept = _Kept(query, query.limit if isinstance(query.limit, int) else 10**9)
    items = {}
    for k, v in entries.items():
        item = element(query, k, v)
        rows = selected_rows(query, item)
        if rows:
            items[k] = item
            kept.add(Entry(k, 0), rows[0])
    return [(e.key, items[e.key]) for e in kept.answer()]


def _run(oql: str, entries: dict[str, Any], *params: Any, buckets: int = 4) -> list[Any]:
    query = parse_query(oql).bind(params)
    parts: list[dict[str, Any]] = [{} for _ in range(buckets)]
    for i, (k, v) in enumerate(entries.items()):
        parts[i % buckets][k] = v
    return merged(query, [_bucket_answer(query, p) for p in parts])


_FLIGHTS: dict[str, Any] = json.loads(
    (pathlib.Path(__file__).parents[1] / "data" / "oql_flights.json").read_text()
)


def test_a_projection_of_one_path_gives_its_values_and_of_several_gives_structs() -> None:
    origins = _run("SELECT f.origin FROM /r f WHERE f.carrier = 'AA' ORDER BY f.origin", _FLIGHTS)
    assert origins == ["JFK", "SFO"]
    rows = _run("SELECT e.key, e.value.delay AS d FROM /r.entries e ORDER BY e.key", _FLIGHTS)
    assert rows[0] == Struct(("key", "d"), ("f1", 10))
    assert rows[4].get("d") is UNDEFINED  # Geode keeps UNDEFINED in a projection
    assert rows[1].as_dict() == {"key": "f2", "d": 45}
    with pytest.raises(KeyError):
        rows[0].get("origin")


def test_select_star_gives_values_entries_or_keys_as_the_iterator_runs() -> None:
    assert _run("SELECT * FROM /r WHERE delay = 45", _FLIGHTS) == [_FLIGHTS["f2"]]
    assert _run("SELECT * FROM /r.entrySet e WHERE e.value.delay = 45", _FLIGHTS) == [
        Struct(("key", "value"), ("f2", _FLIGHTS["f2"]))
    ]
    assert sorted(_run("SELECT k FROM /r.keys k WHERE k LIKE 'f_' ", _FLIGHTS)) == sorted(_FLIGHTS)


def test_order_by_puts_null_then_undefined_first_and_desc_reverses_all() -> None:
    ascending = _run("SELECT e.key FROM /r.entries e ORDER BY e.value.delay", _FLIGHTS)
    assert ascending == ["f4", "f5", "f3", "f6", "f1", "f2"]
    descending = _run("SELECT e.key FROM /r.entries e ORDER BY e.value.delay DESC", _FLIGHTS)
    assert descending == ["f2", "f1", "f6", "f3", "f5", "f4"]


def test_order_by_several_items_and_ties_broken_by_key() -> None:
    rows = _run(
        "SELECT e.key FROM /r.entries e ORDER BY e.value.origin DESC, e.value.carrier ASC",
        _FLIGHTS,
    )
    assert rows == ["f3", "f5", "f1", "f4", "f2", "f6"]
    assert _run("SELECT e.key FROM /r.entries e ORDER BY e.value.carrier", _FLIGHTS) == [
        "f2", "f3", "f6", "f5", "f1", "f4"
    ]  # fmt: skip


def test_limit_applies_after_the_merge() -> None:
    assert _run("SELECT f.delay FROM /r f WHERE f.delay >= 0 ORDER BY f.delay DESC LIMIT 2",
                _FLIGHTS) == [45, 10]  # fmt: skip
    assert len(_run("SELECT * FROM /r LIMIT 3", _FLIGHTS)) == 3
    assert _run("SELECT * FROM /r LIMIT 0", _FLIGHTS) == []


def test_bind_parameters_stand_for_literals_sets_and_the_limit() -> None:
    rows = _run(
        "SELECT e.key FROM /r.entries e WHERE e.value.origin IN $1 AND e.value.delay > $2 "
        "ORDER BY e.key LIMIT $3",
        _FLIGHTS,
        {"SFO", "JFK"},
        5,
        10,
    )
    assert rows == ["f1", "f2"]
    query = parse_query("SELECT * FROM /r x WHERE x.a = $2 OR x.b IN SET($1, 'z')")
    assert query.parameters == 2
    bound = query.bind(["y", 3])
    assert Literal(3) in bound.predicate.operands[0]  # type: ignore[union-attr]
    assert Parameter(2) in query.predicate.operands[0]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ((), "takes 1 parameters, 0 were given"),
        ((1, 2), "takes 1 parameters, 2 were given"),
        (({"a": 1},), "is a dict"),
        ((2**63,), "beyond 64 bits"),
        ((float("nan"),), "NaN"),
        (("x" * 5000,), "longer than"),
        ((list(range(MAX_BOUND_VALUES + 1)),), "more than"),
    ],
)
def test_parameters_that_do_not_fit_are_refused(params: tuple[Any, ...], match: str) -> None:
    query = parse_query("SELECT * FROM /r x WHERE x.a IN $1")
    if params and not isinstance(params[0], list):
        query = parse_query("SELECT * FROM /r x WHERE x.a = $1")
    with pytest.raises(QueryInvalidError, match=match) as caught:
        query.bind(params)
    assert caught.value.rule == "parameters"


def test_a_limit_parameter_must_be_a_non_negative_int() -> None:
    query = parse_query("SELECT * FROM /r LIMIT $1")
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(QueryInvalidError, match="LIMIT"):
            query.bind([bad])
    assert query.bind([4]).limit == 4


def test_in_a_parameter_needs_a_collection() -> None:
    with pytest.raises(QueryInvalidError, match="needs a list"):
        parse_query("SELECT * FROM /r x WHERE x.a IN $1").bind(["abc"])


@pytest.mark.parametrize(
    ("oql", "rule"),
    [
        ("SELEC * FROM /r", "syntax"),
        ("SELECT * FROM /r a, /s b", "one-region"),
        ("SELECT * FROM /r x WHERE x.a IN (SELECT * FROM /r)", "one-region"),
        ("SELECT * FROM /r x, x.a i, i.b j, j.c k", "one-iterator"),
        ("SELECT * FROM /r x, x.items", "one-iterator"),
        ("SELECT * FROM /r x, x.items x", "syntax"),
        ("SELECT * FROM /r x GROUP BY x.a", "group-by"),
        ("SELECT x.a, COUNT(*) FROM /r x", "group-by"),
        ("SELECT x.b, COUNT(*) FROM /r x GROUP BY x.a", "group-by"),
        ("SELECT x.a FROM /r x GROUP BY x.a ORDER BY x.b", "group-by"),
        ("SELECT * FROM /r x ORDER BY COUNT(*)", "group-by"),
        ("SELECT upper(x.a) FROM /r x", "unsupported-expression"),
        ("SELECT SUM(x.a, x.b) FROM /r x", "unsupported-expression"),
        ("SELECT SUM(COUNT(x.a)) FROM /r x", "unsupported-expression"),
        ("SELECT x.a FROM /r x WHERE COUNT(DISTINCT x.a) > 1", "unsupported-expression"),
        ("SELECT * FROM /r x WHERE count(*) > 1", "unsupported-expression"),
        ("SELECT x.a, x.a FROM /r x", "syntax"),
        ("SELECT * FROM /r x WHERE x.a = $0", "syntax"),
        ("SELECT * FROM /r x WHERE x.s LIKE '" + "%a_" * 200 + "'", "like-pattern"),
        ("SELECT * FROM /r x WHERE " + "NOT " * 120 + "x.a = 1", "syntax"),
        ("SELECT * FROM /r x WHERE x.a = '" + "a" * 5000 + "'", "syntax"),
    ],
)
def test_queries_outside_what_runs_are_refused_with_their_rule(oql: str, rule: str) -> None:
    with pytest.raises(QueryInvalidError) as caught:
        parse_query(oql)
    assert caught.value.rule == rule
    assert caught.value.query == oql[:4096]


def test_cqs_still_refuse_what_one_shot_queries_allow() -> None:
    for oql, rule in [
        ("SELECT x.a FROM /r x", "projection"),
        ("SELECT * FROM /r x ORDER BY x.a", "order-by"),
        ("SELECT * FROM /r x LIMIT 3", "limit"),
        ("SELECT * FROM /r x WHERE x.a = $1", "bind-parameter"),
        ("SELECT * FROM /r x WHERE x.a IN $1", "bind-parameter"),
        ("SELECT * FROM /r.entries e", "region-path"),
    ]:
        with pytest.raises(CqInvalidError) as caught:
            parse_cq(oql)
        assert caught.value.rule == rule, oql


def test_order_by_values_of_different_kinds_fail_even_across_buckets() -> None:
    entries = {"a": {"n": 1}, "b": {"n": "one"}}
    with pytest.raises(QueryTypeMismatchError, match="compares a number with a string"):
        _run("SELECT * FROM /r x ORDER BY x.n", entries, buckets=2)
    with pytest.raises(QueryTypeMismatchError, match="no order"):
        _run("SELECT * FROM /r x ORDER BY x.n", {"a": {"n": [1]}}, buckets=1)


def test_a_where_clause_that_cannot_be_evaluated_fails_the_query() -> None:
    with pytest.raises(QueryTypeMismatchError, match="TypeMismatch"):
        _run("SELECT * FROM /r x WHERE x.n > 1", {"a": {"n": "one"}})


def test_the_merge_of_buckets_equals_the_whole_region_evaluated_at_once() -> None:
    rng = random.Random(7)
    entries: dict[str, Any] = {}
    for i in range(2_000):
        value: dict[str, Any] = {"n": rng.randint(0, 50), "s": rng.choice("abcde")}
        if rng.random() < 0.1:
            del value["n"]
        if rng.random() < 0.1:
            value["n"] = None
        entries[f"k{i:05d}"] = value
    oql = (
        "SELECT e.key, e.value.n FROM /r.entries e WHERE e.value.s <> $1 "
        "ORDER BY e.value.n DESC, e.value.s LIMIT $2"
    )
    expected = sorted(
        ((k, v) for k, v in entries.items() if v["s"] != "c"),
        key=lambda kv: (
            # DESC: numbers high first, then UNDEFINED, then null (Geode's order reversed)
            -(kv[1]["n"] if isinstance(kv[1].get("n"), int) else -1 if "n" not in kv[1] else -2),
            kv[1]["s"],
            kv[0],
        ),
    )[:300]
    rows = _run(oql, entries, "c", 300, buckets=7)
    assert [r.field_values[0] for r in rows] == [k for k, _ in expected]
    assert [r.get("n") for r in rows] == [v.get("n", UNDEFINED) for _, v in expected]


def test_paths_read_relative_to_the_alias_or_bare() -> None:
    query = parse_query("SELECT x.a.b, c FROM /r x")
    assert [p.expr for p in query.projections] == [Path(("a", "b")), Path(("c",))]
    assert [p.name for p in query.projections] == ["b", "c"]


def test_the_servers_refuse_a_query_operation_without_a_query_or_of_another_region() -> None:
    settings = ServerSettings(namespace="unit", total_buckets=4)

    def query_op(spec: QuerySpec | None) -> Operation:
        return Operation(1, "c", OperationKind.QUERY, "r", 0, query=spec)

    validate(query_op(QuerySpec("SELECT * FROM /r x WHERE x.a = $1", (1,))), 2, settings)
    with pytest.raises(InvalidOperationError, match="needs a query"):
        validate(query_op(None), 2, settings)
    with pytest.raises(QueryInvalidError, match="selects from /s"):
        validate(query_op(QuerySpec("SELECT * FROM /s")), 2, settings)
    with pytest.raises(QueryInvalidError, match="takes 1 parameters"):
        validate(query_op(QuerySpec("SELECT * FROM /r x WHERE x.a = $1")), 2, settings)


def test_order_by_a_projections_alias_orders_by_its_expression() -> None:
    rows = _run(
        "SELECT e.key AS k, e.value.delay AS late FROM /r.entries e "
        "WHERE e.value.delay > 0 ORDER BY late DESC",
        _FLIGHTS,
    )
    assert [r.get("k") for r in rows] == ["f2", "f1", "f6"]
    # Without AS the name is no alias: it reads the value's attribute, as any path does.
    query = parse_query("SELECT x.delay FROM /r x ORDER BY delay")
    assert query.order_by[0].expr == Path(("delay",))


def test_likes_in_projections_and_order_by_have_a_budget_per_row_not_per_query() -> None:
    # 2,000 rows of 10,000 characters read by a pattern of a few instructions: far past
    # MAX_LIKE_WORK in all, well within it per row.
    entries = {f"k{i}": {"s": "a" * 10_000} for i in range(2_000)}
    rows = _run("SELECT x.s LIKE '%b' FROM /r x ORDER BY x.s LIKE '%a'", entries, buckets=1)
    assert rows == [False] * 2_000


def test_count_star_alone_is_a_count_and_refused_with_order_by_limit_or_beside_others() -> None:
    query = parse_query("SELECT count(*) FROM /r x WHERE x.a > $1")
    assert query.counting and query.projections == () and query.parameters == 1
    assert not parse_query("SELECT * FROM /r").counting
    for oql in (
        "SELECT COUNT(*) FROM /r x ORDER BY x.a",
        "SELECT COUNT(*) FROM /r LIMIT 1",
        "SELECT MAX(*) FROM /r x",
    ):
        with pytest.raises(QueryInvalidError) as caught:
            parse_query(oql)
        assert caught.value.rule == "unsupported-expression", oql


def test_select_distinct_answers_each_equal_row_once_even_when_buckets_hold_copies() -> None:
    # Every bucket's first rows in ORDER BY order are copies of one row: a bucket that
    # answered its first LIMIT rows without telling copies apart would answer "A" alone.
    entries = {f"k{i:03d}": {"o": "A" if i < 40 else f"B{i}", "n": i % 3} for i in range(60)}
    ordered = "SELECT DISTINCT x.o FROM /r x ORDER BY x.o LIMIT 3"
    assert _run(ordered, entries, buckets=4) == ["A", "B40", "B41"]
    assert sorted(_run("SELECT DISTINCT x.n FROM /r x", entries)) == [0, 1, 2]
    assert len(_run("SELECT DISTINCT x.n FROM /r x LIMIT 2", entries, buckets=3)) == 2
    rows = _run("SELECT DISTINCT x.n AS n, x.n > 0 AS some FROM /r x ORDER BY n", entries)
    assert rows == [Struct(("n", "some"), (n, n > 0)) for n in (0, 1, 2)]
    # Geode's equals: 1, 1.0 and true are three values; equal mappings are one.
    odd = {"a": {"v": 1}, "b": {"v": 1.0}, "c": {"v": True}, "d": {"v": 1}, "e": {"v": None}}
    assert len(_run("SELECT DISTINCT x.v FROM /r x", odd, buckets=2)) == 4
    same = {"a": {"p": {"x": 1, "y": [1, 2]}}, "b": {"p": {"y": [1, 2], "x": 1}}}
    assert _run("SELECT DISTINCT * FROM /r", same, buckets=2) == [same["a"]]


def test_aggregates_skip_null_and_undefined_and_give_geode_s_numbers() -> None:
    rows = _run(
        "SELECT COUNT(*) AS n, COUNT(x.delay) AS c, SUM(x.delay) AS s, AVG(x.delay) AS a, "
        "MIN(x.delay) AS lo, MAX(x.origin) AS hi FROM /r x",
        _FLIGHTS,
    )
    # f4's null and f5's missing delay are skipped: 10 + 45 + 0 + 7 over 4.
    assert rows == [Struct(("n", "c", "s", "a", "lo", "hi"), (6, 4, 62, 15.5, 0, "SFO"))]
    (alone,) = _run("SELECT AVG(x.n) FROM /r x", {"a": {"n": 2}, "b": {"n": 4}})
    assert alone == 3 and isinstance(alone, int)  # a whole result is an int (downCast)
    assert _run("SELECT SUM(x.n) FROM /r x", {"a": {"n": 1.5}, "b": {"n": 2.5}}) == [4]
    none = _run(
        "SELECT COUNT(*) AS n, SUM(x.d) AS s, AVG(x.d) AS a, MAX(x.d) AS m FROM /r x "
        "WHERE x.d > 1000",
        _FLIGHTS,
    )
    assert none[0].field_values[:2] == (0, 0) and none[0].get("m") is None
    assert math.isnan(none[0].get("a"))  # Geode: 0.0 / 0
    repeated = {f"k{i}": {"n": i % 4} for i in range(20)}
    counted = _run(
        "SELECT COUNT(DISTINCT x.n) AS c, SUM(DISTINCT x.n) AS s, AVG(DISTINCT x.n) AS a FROM /r x",
        repeated,
    )
    assert counted == [Struct(("c", "s", "a"), (4, 6, 1.5))]


def test_aggregates_of_values_they_cannot_take_fail_with_a_type_mismatch() -> None:
    with pytest.raises(QueryTypeMismatchError, match="not a number"):
        _run("SELECT SUM(x.origin) FROM /r x", _FLIGHTS)
    with pytest.raises(QueryTypeMismatchError, match="compares a string with a number"):
        _run("SELECT MAX(x.v) FROM /r x", {"a": {"v": "x"}, "b": {"v": 2}}, buckets=1)
    with pytest.raises(QueryTypeMismatchError, match="no order"):
        _run("SELECT MIN(x.v) FROM /r x", {"a": {"v": {"k": 1}}})


def test_group_by_gives_a_row_per_group_ordered_by_its_projections_and_limited() -> None:
    rows = _run(
        "SELECT x.origin, COUNT(*) AS n, MAX(x.delay) AS worst FROM /r x "
        "GROUP BY x.origin ORDER BY n DESC, x.origin",
        _FLIGHTS,
    )
    names = ("origin", "n", "worst")
    assert rows == [
        Struct(names, ("SFO", 3, 10)),
        Struct(names, ("BOS", 1, 7)),
        Struct(names, ("JFK", 1, 45)),
        Struct(names, ("LAX", 1, None)),
    ]
    carriers = (
        "SELECT x.carrier FROM /r x WHERE x.origin <> $1 GROUP BY x.carrier ORDER BY x.carrier"
    )
    assert _run(carriers, _FLIGHTS, "BOS") == ["AA", "DL", "UA"]
    top = _run(
        "SELECT x.carrier AS c, SUM(x.delay) AS total FROM /r x GROUP BY x.carrier "
        "ORDER BY total DESC LIMIT 2",
        _FLIGHTS,
    )
    assert top == [Struct(("c", "total"), ("AA", 45)), Struct(("c", "total"), ("UA", 10))]
    # A value without the attribute is a group of its own (UNDEFINED), as null is.
    groups = _run("SELECT x.delay, COUNT(*) FROM /r x GROUP BY x.delay", _FLIGHTS)
    assert {r.field_values[0] for r in groups} >= {None, UNDEFINED}
    assert _run("SELECT x.a FROM /r x GROUP BY x.a", {}) == []


def test_grouped_and_distinct_merges_equal_the_whole_region_evaluated_at_once() -> None:
    rng = random.Random(11)
    entries: dict[str, Any] = {}
    for i in range(3_000):
        value: dict[str, Any] = {"n": rng.randint(0, 40), "s": rng.choice("abcdef")}
        if rng.random() < 0.1:
            value["n"] = None
        entries[f"k{i:05d}"] = value
    for oql in (
        "SELECT x.s, COUNT(*) AS c, SUM(x.n) AS t, AVG(x.n) AS a, MIN(x.n) AS lo, "
        "MAX(x.n) AS hi, COUNT(DISTINCT x.n) AS d FROM /r x WHERE x.n <> 3 "
        "GROUP BY x.s ORDER BY t DESC LIMIT 4",
        "SELECT DISTINCT x.s, x.n FROM /r x WHERE x.n > 30 ORDER BY x.n DESC, x.s LIMIT 25",
        "SELECT DISTINCT x.n FROM /r x ORDER BY x.n",
    ):
        assert _run(oql, entries, buckets=7) == _run(oql, entries, buckets=1), oql


def test_buckets_answer_one_partial_row_per_group_that_keeps_every_type() -> None:
    query = parse_query(
        "SELECT x.g AS g, COUNT(*) AS n, MIN(x.v) AS lo, COUNT(DISTINCT x.v) AS d FROM /r x "
        "GROUP BY x.g"
    ).bind(())
    grouped = _Grouped(query, bucket=3, max_rows=10, max_bytes=100_000)
    groups = [1, 1.0, True, None, "1", {"k": [1, b"\x00"]}, [1, 2]]
    for i in range(70):
        item = {"g": groups[i % len(groups)], "v": i} if i % 10 else {"v": i}  # some lack g
        grouped.add(Entry(f"k{i}", 0), item)
    answer = grouped.answer()
    assert len(answer) == len(groups) + 1  # UNDEFINED is a group of its own
    assert {e.serializer for e in answer} == {PARTIAL_SERIALIZER}
    rows = grouped_results(query, [e.value for e in answer if e.value is not None])
    by_group = {repr(r.get("g")): r for r in rows}
    assert set(by_group) == {repr(g) for g in groups} | {"UNDEFINED"}
    assert by_group["1"].get("n") == 9 and by_group["True"].get("n") == 9
    assert by_group["UNDEFINED"].as_dict() == {"g": UNDEFINED, "n": 7, "lo": 0, "d": 7}
    with pytest.raises(QueryRowLimitError, match="groups"):
        for i in range(20):
            grouped.add(Entry(f"x{i}", 0), {"g": f"new{i}", "v": 1})
    wide = _Grouped(query, bucket=3, max_rows=10, max_bytes=1_000)
    for i in range(100):
        wide.add(Entry(f"w{i}", 0), {"g": 1, "v": i})  # 100 distinct values in one partial
    with pytest.raises(QueryRowLimitError, match="max_value_size_bytes"):
        wide.answer()


def test_partial_rows_merge_across_buckets_with_the_checks_of_one() -> None:
    with pytest.raises(QueryTypeMismatchError, match="compares a string with a number"):
        _run("SELECT MAX(x.v) FROM /r x", {"a": {"v": "x"}, "b": {"v": 2}}, buckets=2)
    with pytest.raises(QueryTypeMismatchError, match="not a number"):
        _run("SELECT SUM(DISTINCT x.v) FROM /r x", {"a": {"v": 1}, "b": {"v": "2"}}, buckets=2)
    query = parse_query("SELECT COUNT(*) FROM /r x GROUP BY x.a").bind(())
    for garbage in (b"not json", b"[[1], []]", b'[[["nope", 1]], [[1, 0, null]]]'):
        with pytest.raises(QueryInvocationTargetError):
            grouped_results(query, [garbage])


_PORTFOLIOS: dict[str, Any] = {
    "p1": {"id": 1, "status": "active", "positions": {"IBM": {"qty": 10, "mktValue": 30.5},
                                                       "SUN": {"qty": 5, "mktValue": 12.0}}},
    "p2": {"id": 2, "status": "inactive", "positions": {"IBM": {"qty": 1, "mktValue": 31.0}}},
    "p3": {"id": 3, "status": "active", "positions": {}, "tags": ["a", "b", "a"]},
    "p4": {"id": 4, "status": "active", "tags": ["c"]},
}  # fmt: skip


def test_drill_downs_iterate_a_value_s_collections_as_geode_s_docs_query_portfolios() -> None:
    # Geode's documentation: SELECT DISTINCT posnVal FROM /exampleRegion,
    # positions.values posnVal WHERE posnVal.mktValue >= 25.00
    values = _run(
        "SELECT DISTINCT posnVal FROM /r, positions.values posnVal WHERE posnVal.mktValue >= 25",
        _PORTFOLIOS,
    )
    assert sorted(v["qty"] for v in values) == [1, 10]
    rows = _run(
        "SELECT p.id, e.key AS sym, e.value.qty AS qty FROM /r p, p.positions e "
        "WHERE p.status = 'active' ORDER BY qty DESC",
        _PORTFOLIOS,
    )
    assert [r.as_dict() for r in rows] == [
        {"id": 1, "sym": "IBM", "qty": 10},
        {"id": 1, "sym": "SUN", "qty": 5},
    ]
    tags = _run("SELECT t FROM /r p, t IN p.tags ORDER BY t LIMIT 3", _PORTFOLIOS, buckets=3)
    assert tags == ["a", "a", "b"]
    assert _run("SELECT DISTINCT t FROM /r p, t IN p.tags ORDER BY t", _PORTFOLIOS) == [
        "a",
        "b",
        "c",
    ]
    star = _run("SELECT * FROM /r p, t IN p.tags WHERE t = 'c'", _PORTFOLIOS)
    assert star == [Struct(("p", "t"), (_PORTFOLIOS["p4"], "c"))]
    counted = _run(
        "SELECT p.status, COUNT(*) AS n, SUM(pos.qty) AS qty FROM /r p, p.positions.values pos "
        "GROUP BY p.status ORDER BY p.status",
        _PORTFOLIOS,
    )
    assert counted == [
        Struct(("status", "n", "qty"), ("active", 2, 15)),
        Struct(("status", "n", "qty"), ("inactive", 1, 1)),
    ]
    assert _run("SELECT COUNT(*) FROM /r p, t IN p.tags", _PORTFOLIOS) == [4]


def test_a_drill_down_over_what_is_no_collection_or_too_many_rows_fails_typed() -> None:
    with pytest.raises(QueryTypeMismatchError, match="collection type"):
        _run("SELECT i FROM /r p, i IN p.id", _PORTFOLIOS)
    many = {"k": {"a": list(range(200)), "b": list(range(200))}}
    with pytest.raises(QueryRowLimitError, match="rows"):
        _run("SELECT x FROM /r p, x IN p.a, y IN p.b", many, buckets=1)
    # null and UNDEFINED collections give no row (p4 has no positions).
    assert _run("SELECT p.id FROM /r p, p.positions.values v WHERE p.id = 4", _PORTFOLIOS) == []


def test_drill_down_merges_equal_the_whole_region_evaluated_at_once() -> None:
    rng = random.Random(5)
    entries = {
        f"k{i:04d}": {"g": rng.choice("xyz"), "items": [rng.randint(0, 9) for _ in range(i % 4)]}
        for i in range(600)
    }
    for oql in (
        "SELECT v.g, n FROM /r v, n IN v.items WHERE n > 2 ORDER BY n DESC, v.g LIMIT 40",
        "SELECT DISTINCT v.g, n FROM /r v, n IN v.items ORDER BY n, v.g",
        "SELECT v.g, COUNT(*) AS c, AVG(n) AS a FROM /r v, n IN v.items GROUP BY v.g ORDER BY v.g",
    ):
        assert _run(oql, entries, buckets=5) == _run(oql, entries, buckets=1), oql
