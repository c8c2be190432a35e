"""The servers' CQ table (pure logic): one evaluation per distinct query of a region, the
query operation per holder and bucket, errors, region events, and forgetting holders."""

from __future__ import annotations

import json

from regionbus.broker.cq_registry import CqTable
from regionbus.schemas.cq import parse_cq
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import CqMatch, Event, EventKind

DELAYED = parse_cq("SELECT * FROM /r f WHERE f.delay > 60")
SAME = parse_cq("select * from /r where delay > 60")
OTHER = parse_cq("SELECT * FROM /r WHERE delay < 0")


def _event(kind: EventKind, value: object = None, serializer: str = "json") -> Event:
    data = None if value is None else json.dumps(value).encode()
    return Event(EventID("m", 1, 1, 3), kind, "r", 7, 0, "writer", "k", data, serializer)


def _table() -> CqTable:
    table = CqTable()
    table.add("a", "late", DELAYED, durable=True, running=range(16))
    table.add("b", "mine", SAME, durable=False, running=range(16))
    table.add("b", "neg", OTHER, durable=False, running=range(16))
    return table


def test_equivalent_queries_of_many_holders_are_one_evaluation() -> None:
    table = _table()
    assert table.queries_of("r") == 2
    decoded: list[bytes | None] = []
    original = table.value

    def counting(data: bytes | None, serializer: str | None) -> object:
        decoded.append(data)
        return original(data, serializer)

    table.value = counting  # type: ignore[method-assign]
    old = json.dumps({"delay": 10}).encode()
    matches = table.entry_matches(_event(EventKind.UPDATE, {"delay": 70}), 3, old, "json")
    assert matches == {
        "a": [CqMatch("late", EventKind.CREATE)],
        "b": [CqMatch("mine", EventKind.CREATE)],
    }
    assert len(decoded) == 2  # the new and the old value, once each for every query


def test_the_query_operation_comes_from_the_old_and_new_value() -> None:
    table = _table()
    was_in = json.dumps({"delay": 90}).encode()
    assert table.entry_matches(_event(EventKind.UPDATE, {"delay": 95}), 3, was_in)["a"] == [
        CqMatch("late", EventKind.UPDATE)
    ]
    assert table.entry_matches(_event(EventKind.DESTROY), 3, was_in)["a"] == [
        CqMatch("late", EventKind.DESTROY)
    ]
    assert table.entry_matches(_event(EventKind.INVALIDATE), 3, None) == {}


def test_a_stopped_bucket_delivers_nothing_and_a_bad_value_is_an_error() -> None:
    table = _table()
    table.stop("a", "late", [3])
    matches = table.entry_matches(_event(EventKind.CREATE, {"delay": 70}), 3, None)
    assert "a" not in matches
    assert "a" in table.entry_matches(_event(EventKind.CREATE, {"delay": 70}), 4, None)
    bad = _event(EventKind.CREATE, None)._replace(value=b"{not json", serializer="json")
    errors = table.entry_matches(bad, 4, None)
    assert errors["a"][0].query_operation is None and errors["a"][0].error


def test_region_events_reach_every_running_cq_and_a_region_invalidate_none() -> None:
    table = _table()
    cleared = table.region_matches("r", EventKind.REGION_CLEAR)
    assert sorted(m.name for ms in cleared.values() for m in ms) == ["late", "mine", "neg"]
    assert table.region_matches("r", EventKind.REGION_INVALIDATE) == {}


def test_dropping_a_client_keeps_its_durable_cqs_when_asked() -> None:
    table = _table()
    table.add("a", "brief", OTHER, durable=False, running=range(16))
    assert table.drop_client("a", keep_durable=True) == ["brief"]
    assert table.names("a") == ["late"]
    assert sorted(table.forget_region("r")) == [("a", "late"), ("b", "mine"), ("b", "neg")]
    assert not table.has_queries("r")
