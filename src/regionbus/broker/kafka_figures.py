"""Kafka's figures for ``regionbus status``, asked all at once and waited for once.

A backlog is a topic's high watermarks after a consumer group's committed offsets. Asked
one by one, each with a consumer of its own and a 5 s timeout, a namespace with a few
dozen queues took 10 s to answer, and minutes when Kafka was away. Here one admin client
sends every committed-offset request (one per group: Kafka's OffsetFetch takes one group a
request in librdkafka's admin API) and one ListOffsets request for every partition, all
before waiting; then one deadline bounds the wait for all of them. A figure not answered
by the deadline stays unknown (None) and is named in :attr:`KafkaFigures.unreadable`.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Hashable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from regionbus.schemas.errors import RegionBusError
from regionbus.schemas.kafka_clients import kafka_admin
from regionbus.schemas.kafka_outage import quiet_config


class KafkaFigures:
    """Topic partitions and backlogs of one namespace, read under one deadline.

    Args:
        namespace: The site namespace (its topics are those named ``<namespace>.*``).
        kafka_config: librdkafka settings (connection and security).
        timeout_s: Longest time, from construction, to wait for every figure, seconds.
    """

    def __init__(self, namespace: str, kafka_config: dict[str, Any], timeout_s: float) -> None:
        self.namespace = namespace
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.unreadable: list[str] = []
        """What could not be read in time, one line each."""
        self._admin: AdminClient | None = None
        self._reachable = True
        self._asked: dict[Hashable, tuple[str, str, list[TopicPartition]]] = {}
        self._committed: dict[str, Future[Any]] = {}
        self._latest: dict[TopicPartition, Future[Any]] = {}
        try:
            # librdkafka logs every failed connection attempt; status reports them once.
            self._admin = kafka_admin({**kafka_config, **quiet_config()})
        except (KafkaException, RegionBusError) as exc:
            self._unreachable(f"Kafka client: {exc}")

    def _remaining_s(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def _unreachable(self, why: str) -> None:
        if self._reachable:
            self._reachable = False
            self.unreadable.append(f"kafka: {why}; queue depths and gateway backlogs not read")

    def topic_partitions(self) -> dict[str, int]:
        """``{topic: partitions}`` of the namespace's topics; empty when Kafka does not
        answer within the deadline (noted in :attr:`unreadable`)."""
        if self._admin is None:
            return {}
        try:
            metadata = self._admin.list_topics(timeout=max(self._remaining_s(), 0.05))
        except KafkaException as exc:
            self._unreachable(f"no topic metadata within {self.timeout_s:g} s ({exc.args[0]})")
            return {}
        return {
            name: len(meta.partitions)
            for name, meta in metadata.topics.items()
            if name.startswith(f"{self.namespace}.") and meta.error is None
        }

    def ask_backlog(
        self, what: Hashable, topic: str, partitions: int | tuple[int, ...], group: str
    ) -> None:
        """Send the requests for one backlog (answered by :meth:`backlog` after :meth:`wait`).

        Args:
            what: The caller's key of this figure.
            topic: The topic.
            partitions: Its partition count (all of them count), or the partitions that do.
            group: The consumer group whose committed offsets count as read.
        """
        if self._admin is None or not self._reachable:
            return
        numbers = range(partitions) if isinstance(partitions, int) else partitions
        wanted = [TopicPartition(topic, p) for p in numbers]
        self._asked[what] = (topic, group, wanted)
        timeout_s = max(self._remaining_s(), 0.05)
        if group not in self._committed:
            request = ConsumerGroupTopicPartitions(group, wanted)
            self._committed.update(
                self._admin.list_consumer_group_offsets([request], request_timeout=timeout_s)
            )
        latest = {tp: OffsetSpec.latest() for tp in wanted if tp not in self._latest}
        if latest:
            self._latest.update(self._admin.list_offsets(latest, request_timeout=timeout_s))

    def wait(self) -> None:
        """Wait, until the deadline at most, for every figure asked."""
        pending = [*self._committed.values(), *self._latest.values()]
        if pending:
            concurrent.futures.wait(pending, timeout=self._remaining_s())

    def backlog(self, what: Hashable) -> int | None:
        """Messages after the group's committed offsets, summed over the partitions; None
        when a needed answer did not come in time (then noted in :attr:`unreadable`)."""
        positions = self.positions(what)
        if positions is None:
            return None
        return sum(max(0, high - max(committed, 0)) for _, committed, high in positions)

    def positions(self, what: Hashable) -> list[tuple[TopicPartition, int, int]] | None:
        """``(partition, committed offset, high watermark)`` of each partition of a figure
        asked with :meth:`ask_backlog` (committed -1: the group never committed there);
        None when a needed answer did not come in time (then noted in :attr:`unreadable`)."""
        asked = self._asked.get(what)
        if asked is None:
            return None
        topic, group, wanted = asked
        try:
            committed = _result(self._committed[group])
            offsets = {(tp.topic, tp.partition): tp.offset for tp in committed.topic_partitions}
            return [
                (tp, offsets.get((tp.topic, tp.partition), -1), _result(self._latest[tp]).offset)
                for tp in wanted
            ]
        except (KafkaException, concurrent.futures.TimeoutError, KeyError) as exc:
            reason = "no answer in time" if _is_timeout(exc) else str(exc)
            self.unreadable.append(f"backlog of {topic} (group {group}): {reason}")
            return None


def _result(future: Future[Any]) -> Any:
    if not future.done():
        raise concurrent.futures.TimeoutError
    return future.result()


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, concurrent.futures.TimeoutError)


__all__ = ["KafkaFigures"]
