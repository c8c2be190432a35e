"""What one continuous query, or one client's queries, may cost a server per change (pure
logic): LIKE patterns bounded in size at parse, what a LIKE reads bounded per evaluation,
nesting bounded where client and server parse alike, and a client's queries given a time
budget per change that other clients' queries do not share."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from regionbus.broker.cq_registry import CqTable
from regionbus.schemas.cq import parse_cq
from regionbus.schemas.cq.evaluate import MAX_LIKE_PROGRAM_SIZE, MAX_LIKE_WORK
from regionbus.schemas.cq.parser import MAX_CQ_NESTING, MAX_CQ_QUERY_CHARS
from regionbus.schemas.errors import CqEvaluationError, CqInvalidError
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import CqMatch, Event, EventKind


def test_a_like_pattern_larger_than_the_bound_is_refused_with_its_rule() -> None:
    # The attack: within the query's length limit, a pattern of about 20,000 instructions.
    pattern = ("%a_" * MAX_CQ_QUERY_CHARS)[: MAX_CQ_QUERY_CHARS - 40]
    with pytest.raises(CqInvalidError) as refused:
        parse_cq(f"SELECT * FROM /r x WHERE x.s LIKE '{pattern}'")
    assert refused.value.rule == "like-pattern"
    assert str(MAX_LIKE_PROGRAM_SIZE) in str(refused.value)


def test_the_like_patterns_of_one_query_count_together() -> None:
    patterns = [f"%{i}" + "a_%" * 10 for i in range(4)]
    for pattern in patterns:
        parse_cq(f"SELECT * FROM /r x WHERE x.s LIKE '{pattern}'")
    many = " OR ".join(f"x.s LIKE '{pattern}'" for pattern in patterns)
    with pytest.raises(CqInvalidError, match="like-pattern"):
        parse_cq(f"SELECT * FROM /r x WHERE {many}")


def test_the_same_pattern_twice_is_compiled_and_counted_once() -> None:
    parsed = parse_cq("SELECT * FROM /r x WHERE x.a LIKE 'UA-%' OR x.b LIKE 'UA-%'")
    assert parsed.likes is not None
    single = parse_cq("SELECT * FROM /r x WHERE x.a LIKE 'UA-%'").likes
    assert single is not None and parsed.likes.program_size == single.program_size


def test_a_like_reads_at_most_its_work_bound_of_a_value() -> None:
    parsed = parse_cq("SELECT * FROM /r x WHERE x.s LIKE '%" + "a_%" * 30 + "'")
    assert parsed.likes is not None
    size = parsed.likes.program_size
    fits = MAX_LIKE_WORK // size
    assert parsed.selects({"s": "a" * fits}) in (True, False)
    with pytest.raises(CqEvaluationError, match="characters x instructions"):
        parsed.selects({"s": "a" * (fits + 1)})


def test_each_evaluation_starts_its_reading_afresh() -> None:
    parsed = parse_cq("SELECT * FROM /r x WHERE x.s LIKE '%b%'")
    assert parsed.likes is not None
    half = "a" * (MAX_LIKE_WORK // parsed.likes.program_size // 2)
    for _ in range(5):
        assert parsed.selects({"s": half}) is False


@pytest.mark.parametrize("nots", [MAX_CQ_NESTING, 980, 991, 5000])
def test_deep_nesting_is_refused_as_syntax_never_a_bare_recursion_error(nots: int) -> None:
    query = "SELECT * FROM /r x WHERE " + "NOT " * nots + "x.a = 1"
    with pytest.raises(CqInvalidError) as refused:
        parse_cq(query[:MAX_CQ_QUERY_CHARS])
    assert refused.value.rule == "syntax"


def test_a_plain_query_nests_well_within_the_bound() -> None:
    parse_cq(
        "SELECT * FROM /r f WHERE f.delay > 60 AND (f.origin = 'EWR' OR f.dest IN "
        "('ORD', 'LAX')) AND NOT (f.carrier LIKE 'U%') AND " + "NOT " * 40 + "f.x <> 3"
    )


class _Clock:
    """Each reading is ``step_s`` later than the one before."""

    def __init__(self, step_s: float) -> None:
        self.now = 0.0
        self.step_s = step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def _event(value: object) -> Event:
    data = json.dumps(value).encode()
    return Event(EventID("m", 1, 1, 3), EventKind.CREATE, "r", 7, 0, "w", "k", data, "json")


@pytest.fixture
def table() -> Iterator[CqTable]:
    # Every evaluation takes 12.5 ms by this clock; a client may spend 20 ms per change.
    table = CqTable(budget_s=0.02, clock=_Clock(0.0125))
    for i in range(10):
        table.add(
            "greedy",
            f"q{i}",
            parse_cq(f"SELECT * FROM /r x WHERE x.n > {i}"),
            durable=False,
            running=range(16),
        )
    table.add(
        "victim",
        "mine",
        parse_cq("SELECT * FROM /r x WHERE x.n >= 0"),
        durable=False,
        running=range(16),
    )
    yield table


def test_a_clients_queries_past_its_budget_get_errors_and_another_clients_are_evaluated(
    table: CqTable,
) -> None:
    matches = table.entry_matches(_event({"n": 100}), 3, None)
    greedy = matches["greedy"]
    evaluated = [m for m in greedy if m.error is None]
    refused = [m for m in greedy if m.error is not None]
    assert len(evaluated) == 2 and len(refused) == 8
    assert all("MAX_CQ_EVALUATION_S_PER_CLIENT" in (m.error or "") for m in refused)
    assert matches["victim"] == [CqMatch("mine", EventKind.CREATE)]


def test_the_budget_is_per_change(table: CqTable) -> None:
    for _ in range(3):
        greedy = table.entry_matches(_event({"n": 100}), 3, None)["greedy"]
        assert sum(m.error is None for m in greedy) == 2


def test_a_query_shared_with_a_client_within_its_budget_is_evaluated(table: CqTable) -> None:
    table.add(
        "victim",
        "shared",
        parse_cq("SELECT * FROM /r x WHERE x.n > 9"),
        durable=False,
        running=range(16),
    )
    matches = table.entry_matches(_event({"n": 100}), 3, None)
    assert CqMatch("shared", EventKind.CREATE) in matches["victim"]
    assert CqMatch("q9", EventKind.CREATE) in matches["greedy"]
