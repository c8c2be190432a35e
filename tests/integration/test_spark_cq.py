"""A continuous query over history in Spark (docs/behaviour.md §9, §8): the query compiled to a
Spark SQL expression agrees with the servers' evaluator value by value, and :func:`cq_history` over
``{ns}.events`` equals what the live CQ delivered for the same operations."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from support import entry_operation, send_raw_operation, wait_until

from regionbus import CqAttributes, CqEvent, CqListener, RegionShortcut
from regionbus.broker.server import CacheServer
from regionbus.schemas.cq import parse_cq
from regionbus.schemas.errors import CqEvaluationError
from regionbus.schemas.messages import OperationKind
from regionbus.schemas.naming import Topics
from regionbus.spark.cq import cq_condition, cq_history
from regionbus.spark.decode import read_messages
from tests.unit.test_cq_language import EVALUATIONS, MISMATCHES


def _python_code(predicate: str, value: Any) -> str:
    try:
        return "T" if parse_cq(f"SELECT * FROM /r f WHERE {predicate}").selects(value) else "N"
    except CqEvaluationError:
        return "E"


def test_the_compiled_condition_agrees_with_the_servers_evaluator(spark_session: Any) -> None:
    cases = [(p, v) for p, v, _ in EVALUATIONS] + [
        (p, {"origin": "JFK", "cancelled": False, "tags": ["a"], "dep_delay": 5})
        for p in MISMATCHES
    ]
    rows = [(i, json.dumps(value)) for i, (_, value) in enumerate(cases)]
    frame = spark_session.createDataFrame(rows, "i int, value string")
    columns = [
        cq_condition(f"SELECT * FROM /r f WHERE {predicate}", frame["value"]).alias(f"c{i}")
        for i, (predicate, _) in enumerate(cases)
    ]
    # One row per case, each case's own column: evaluated in one job.
    results = {row["i"]: row for row in frame.select("i", *columns).collect()}
    for i, (predicate, value) in enumerate(cases):
        spark_code = results[i][f"c{i}"]
        expected = _python_code(predicate, value)
        assert ("N" if spark_code in ("F", "U") else spark_code) == expected, (predicate, value)


class _Live(CqListener):
    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()

    def _add(self, event: CqEvent, operation: str) -> None:
        eid = event.event_id
        with self._lock:
            self.rows.append(
                (event.key, event.base_operation.name, operation, eid.member, eid.sequence)
            )

    def on_event(self, event: CqEvent) -> None:
        assert event.query_operation is not None
        self._add(event, event.query_operation.name)

    def on_error(self, event: CqEvent) -> None:
        self._add(event, "ERROR")


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM /r f WHERE f.delay > 60",
        "SELECT * FROM /r f WHERE f.gate.name <> 'A1' AND NOT (f.origin LIKE 'J%')",
    ],
)
def test_a_cq_over_history_equals_what_the_live_cq_delivered(
    query: str,
    spark_session: Any,
    cache_server: CacheServer,
    client_factory: Any,
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    live = _Live()
    holder = client_factory()
    holder.create_region("r", RegionShortcut.PROXY)
    cq = holder.query_service().new_cq("live", query, CqAttributes([live]))
    cq.execute()
    writer = client_factory().create_region("r", RegionShortcut.PROXY)
    steps: list[tuple[str, Any]] = [
        ("a", {"delay": 10, "origin": "EWR"}),
        ("a", {"delay": 70, "origin": "EWR", "gate": {"name": "B2"}}),
        ("a", {"delay": 80, "origin": "JFK"}),
        ("b", {"delay": 90, "origin": "LGA", "gate": {"name": "A1"}}),
        ("a", {"delay": 5, "origin": "LGA"}),
        ("c", {"delay": "late", "origin": 7}),
        ("b", None),
        ("d", {"delay": 61}),
    ]
    for key, value in steps:
        if value is None:
            writer.destroy(key)
        else:
            writer.put(key, value)
    op, bucket = entry_operation("server-app", OperationKind.INVALIDATE, "d", 1)
    send_raw_operation(kafka_bootstrap_servers, namespace, op, bucket)
    writer.clear()
    writer.put("e", {"delay": 99, "origin": "SFO"})
    wait_until(lambda: any(r[0] == "e" for r in live.rows), what="the last live event")

    messages = read_messages(
        spark_session,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        subscribe=Topics(namespace).events,
    )
    history = cq_history(messages, query).collect()
    replayed = [
        (r["key"], r["base_operation"], r["query_operation"], r["member"], r["sequence"])
        for r in history
    ]
    assert sorted(replayed, key=_text) == sorted(live.rows, key=_text)
    assert any(r[2] == "REGION_CLEAR" for r in replayed)


def _text(row: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(str(x) for x in row)


def test_decode_messages_reads_a_cq_event_as_its_change(spark_session: Any) -> None:
    from regionbus.schemas.codec import encode, encode_batches
    from regionbus.schemas.eventid import EventID
    from regionbus.schemas.messages import CqEvent as WireCqEvent
    from regionbus.schemas.messages import CqMatch, Event, EventKind
    from regionbus.spark.decode import decode_messages, decode_record_values

    change = Event(EventID("m", 1, 5, 3), EventKind.UPDATE, "r", 9, 1, "w", "k", b'{"a":1}', "json")
    framed = [encode(WireCqEvent(change, (CqMatch("late", EventKind.CREATE),))), encode(change)]
    (batch,) = encode_batches(framed)
    frame = spark_session.createDataFrame([(bytearray(batch),)], "value binary")
    rows = decode_messages(frame).orderBy("index").collect()
    assert [r["message_type"] for r in rows] == ["CqEvent", "Event"]
    for row in rows:
        assert row["decode_error"] is None
        assert (row["region"], row["key"], row["operation"], row["sequence"]) == (
            "r", "k", "UPDATE", 5
        )  # fmt: skip
    _, python_columns = decode_record_values([batch])
    assert python_columns[1].to_pylist() == ["CqEvent", "Event"]
