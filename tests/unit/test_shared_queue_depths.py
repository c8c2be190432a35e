"""Depths of a queue several clients share: the capacity counts its slowest member, each
member's gauge counts what it has not acked itself (in memory: the committed offsets come
from a stand-in for the admin client)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka import TopicPartition

from regionbus.broker.client_proxy import ClientProxies, SharedQueue
from regionbus.broker.queue_acks import QueueAcks
from regionbus.schemas.naming import Topics

_TOPICS = Topics("unit")


class _Offsets:
    """Answers ``list_consumer_group_offsets`` from ``{client id: committed offset}`` and
    counts the requests."""

    def __init__(self, committed: dict[str, int]) -> None:
        self.committed = committed
        self.requests = 0

    def list_consumer_group_offsets(self, asked: list[Any]) -> dict[str, Future[Any]]:
        self.requests += 1
        (request,) = asked
        client_id = request.group_id.removeprefix(f"{_TOPICS.namespace}.client.")
        (partition,) = request.topic_partitions
        future: Future[Any] = Future()
        future.set_result(
            SimpleNamespace(
                topic_partitions=[
                    TopicPartition(partition.topic, partition.partition, self.committed[client_id])
                ]
            )
        )
        return {request.group_id: future}


def _queue_of(proxies: ClientProxies, members: set[str], records: int) -> SharedQueue:
    """A shared queue into which ``records`` records of one event each landed at offsets
    0, 1, ..."""
    queue = proxies.shared(("unit.queues", 3, "all", "r"), frozenset(members))
    for offset in range(records):
        queue.queued += 1
        queue.events += 1
        queue.delivered(offset, queue.queued)
    return queue


def test_a_live_member_of_a_queue_an_away_member_never_acks_shows_its_own_depth() -> None:
    admin = _Offsets({"live": 10, "away": -1001})
    proxies = ClientProxies(_TOPICS, lambda _topic: 16)
    acks = QueueAcks(admin, _TOPICS)  # type: ignore[arg-type]
    queue = _queue_of(proxies, {"live", "away"}, 10)

    assert acks.refresh(queue) == 10  # the capacity holds for the slowest member
    assert proxies.snapshot() == {"live": 0, "away": 10}

    admin.committed["away"] = 4
    acks.refresh(queue)
    assert queue.depth == 6 and len(queue.marks) == 6  # acked below the slowest member
    assert proxies.snapshot() == {"live": 0, "away": 6}


def test_the_gauges_read_one_member_at_a_time_and_ack_only_once_all_are_known() -> None:
    admin = _Offsets({"a": 7, "b": 3, "c": 9})
    proxies = ClientProxies(_TOPICS, lambda _topic: 16)
    acks = QueueAcks(admin, _TOPICS)  # type: ignore[arg-type]
    queue = _queue_of(proxies, {"a", "b", "c"}, 10)

    acks.refresh_member(queue, "a")
    assert admin.requests == 1
    # Only a's ack is known: the others count as not having acked anything yet.
    assert proxies.snapshot() == {"a": 3, "b": 10, "c": 10}
    assert queue.depth == 10 and len(queue.marks) == 10

    acks.refresh_member(queue, "b")
    acks.refresh_member(queue, "c")
    assert admin.requests == 3
    assert proxies.snapshot() == {"a": 3, "b": 7, "c": 1}
    assert queue.depth == 7 and len(queue.marks) == 7


def test_a_member_that_leaves_takes_its_ack_with_it() -> None:
    admin = _Offsets({"a": 2, "b": 8})
    proxies = ClientProxies(_TOPICS, lambda _topic: 16)
    acks = QueueAcks(admin, _TOPICS)  # type: ignore[arg-type]
    queue = _queue_of(proxies, {"a", "b"}, 10)
    acks.refresh(queue)

    proxies.forget("a")
    assert queue.members == {"b"}
    assert set(queue.member_acked) == set(queue.member_committed) == {"b"}
    acks.refresh(queue)
    assert queue.depth == 2 and proxies.snapshot() == {"b": 2}
