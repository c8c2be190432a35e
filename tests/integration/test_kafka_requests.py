"""What a put costs Kafka in requests, counted by librdkafka itself: every Kafka client of
this process reports its statistics (``statistics.interval.ms``), whose per-broker ``req``
counters say how many requests of each kind it sent.

librdkafka sends one ProduceRequest per topic partition, never several partitions in one
(librdkafka issue #1700, still open in 2.16), so a server turn costs a ProduceRequest for
each partition it produces to: each bucket's partition of ``{ns}.events``, each queue
partition, each reply partition. ``{ns}.events`` has a producer of its own, so the queue
and reply records of a turn go in a request of their own each, however many buckets the
turn touched, and never wait behind an event's request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from support import Recorder, wait_until

from bench.kafka_requests import RequestCounts
from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS
from regionbus.schemas.naming import bucket_of

ATTEMPTS = 3
"""Each figure is the least of this many tries: a client's ping, answered by the server
in between, costs a ProduceRequest that belongs to no put."""


@pytest.fixture
def counts() -> Iterator[RequestCounts]:
    """Statistics of every Kafka client made from now on in this process."""
    recorded = RequestCounts()
    undo = recorded.install()
    try:
        yield recorded
    finally:
        undo()


@pytest.fixture
def server_settings(counts: RequestCounts, server_settings: ServerSettings) -> ServerSettings:
    """The conftest's settings, asked for once the statistics are recorded (so the
    server's clients, made after, report them)."""
    return server_settings


def _turns(server: CacheServer) -> Callable[[], int]:
    """How many times the server has sent what a turn gathered (from now)."""
    parts = server._parts
    assert parts is not None
    outbox = parts.outbox
    send = outbox.send
    sent = [0]

    def counted() -> None:
        sent[0] += bool(outbox.gathered)
        send()

    outbox.send = counted  # type: ignore[method-assign]
    return lambda: sent[0]


def _distinct_buckets(count: int, total_buckets: int, prefix: str) -> list[str]:
    keys: dict[int, str] = {}
    index = 0
    while len(keys) < count:
        key = f"{prefix}{index}"
        keys.setdefault(bucket_of("r", key, total_buckets), key)
        index += 1
    return list(keys.values())


def _least_per_producer(
    counts: RequestCounts,
    server: CacheServer,
    turn: Callable[[int], Mapping[str, Any]],
) -> tuple[dict[str, int], int]:
    """The server's ProduceRequests per producer over one turn, the least of
    :data:`ATTEMPTS` tries (and the turns the least try took)."""
    member = server.settings.member_id
    ids = {member, f"{member}.events"}
    turns = _turns(server)
    parts = server._parts
    assert parts is not None
    outbox = parts.outbox
    best: tuple[dict[str, int], int] | None = None
    for attempt in range(ATTEMPTS):
        before, turns_before = counts.snapshot(ids, "Produce"), turns()
        turn(attempt)
        # Past the events producer's linger, and every delivery reported.
        mark = outbox.mark()
        wait_until(lambda mark=mark: outbox.settled(mark), 30, "every delivery")
        after = counts.snapshot(ids, "Produce")
        spent = {i: after.get(i, 0) - before.get(i, 0) for i in ids}
        took = turns() - turns_before
        if best is None or sum(spent.values()) < sum(best[0].values()):
            best = (spent, took)
    assert best is not None
    return best


def test_a_lone_put_costs_the_server_a_request_for_its_event_its_queue_record_and_its_reply(
    counts: RequestCounts, cache_server: CacheServer, client_factory: Any
) -> None:
    writer = client_factory().create_region("r")
    recorder = Recorder()
    reader = client_factory().create_region("r", listeners=[recorder])
    reader.register_interest(ALL_KEYS)
    writer.put("warm", 0)  # producer ids, metadata and connections, before counting
    wait_until(lambda: len(recorder.calls) == 1, 30, "the warm-up event")

    def lone_put(attempt: int) -> dict[str, Any]:
        seen = len(recorder.calls)
        writer.put(f"lone{attempt}", attempt)
        wait_until(lambda: len(recorder.calls) > seen, 30, "the subscriber's event")
        return {}

    spent, turns = _least_per_producer(counts, cache_server, lone_put)
    member = cache_server.settings.member_id
    assert turns >= 1
    # The queue record and the reply: one request each (two partitions), no event among them.
    assert spent[member] == 2, spent
    assert spent[f"{member}.events"] == 1, spent


@pytest.mark.parametrize("buckets", [8])
def test_a_turn_over_k_buckets_sends_its_queue_and_reply_records_in_two_requests(
    counts: RequestCounts, cache_server: CacheServer, client_factory: Any, buckets: int
) -> None:
    writer = client_factory().create_region("r")
    recorder = Recorder()
    reader = client_factory().create_region("r", listeners=[recorder])
    reader.register_interest(ALL_KEYS)
    writer.put("warm", 0)
    wait_until(lambda: len(recorder.calls) == 1, 30, "the warm-up event")
    total = cache_server.settings.total_buckets

    def spread_put_all(attempt: int) -> dict[str, Any]:
        seen = len(recorder.calls)
        keys = _distinct_buckets(buckets, total, f"a{attempt}-")
        writer.put_all({key: attempt for key in keys})
        wait_until(lambda: len(recorder.calls) == seen + buckets, 30, "every event")
        return {}

    spent, turns = _least_per_producer(counts, cache_server, spread_put_all)
    member = cache_server.settings.member_id
    # Per turn: one request for the subscriber's queue partition and one for the writer's
    # reply partition, whatever the number of buckets the turn touched.
    assert spent[member] <= 2 * turns, (spent, turns)
    # librdkafka: one ProduceRequest per partition of {ns}.events (one per bucket), at most.
    assert spent[f"{member}.events"] <= buckets, spent
