"""One object per client this server serves (Geode's ``CacheClientProxy``).

A :class:`ClientProxy` holds what this server keeps for one client: where its subscription
queue and replies go (the shared topics of its Kafka principal, its partition, its
address), the events this server queued for it and how many the client has acked (its
queue's depth against ``maximum_message_count``, SPEC §4), and its counters. The
:class:`ClientProxies` of a server create them as clients are first routed to and forget
them in one call, so nothing a client owned on a server outlives it there.

A queue's depth counts the events this server queued for the client, as they are queued
(not as Kafka confirms them), less those the client has acked. The client's ack is its
committed offset on its partition (consumer group ``{ns}.client.<id>``); the delivery
report of each message this server produced for it says at which offset it landed, so the
events below the committed offset are acked. Each server counts the events *it* queued:
with several bucket primaries the capacity applies per server.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from regionbus.schemas.naming import Topics, client_partition

PartitionsOf = Callable[[str], int]
"""Partition count of a topic (0 when it does not exist)."""


class ClientProxy:
    """What this server keeps for one client.

    Attributes:
        client_id: The client (or durable client) id.
        key: The Kafka record key addressing the client in the shared topics (its id,
            UTF-8).
        kafka_principal: The Kafka principal whose shared topics it reads (None: the
            namespace's unscoped ones).
        queue_topic: Its subscription queue's topic.
        queue_partition: Its partition of that topic (-1 while the topic is unknown).
        queued: Events this server queued for it since it first served it.
        acked: Of those, the events below the client's last read ack.
        lost: Of those, the events of messages Kafka did not take.
        events_routed: Events routed to it (the ``events_routed_total`` series).
        refreshed_at: When its ack was last read (monotonic seconds; 0 = never).
        overflowing: Its queue stayed full through one hold and may grow; it is not held
            for again until its depth falls below the capacity.
    """

    __slots__ = (
        "acked",
        "client_id",
        "events_routed",
        "kafka_principal",
        "key",
        "lost",
        "marks",
        "overflowing",
        "queue_partition",
        "queue_topic",
        "queued",
        "refreshed_at",
    )

    def __init__(
        self, client_id: str, kafka_principal: str | None, queue_topic: str, queue_partition: int
    ) -> None:
        self.client_id = client_id
        self.key = client_id.encode()
        self.kafka_principal = kafka_principal
        self.queue_topic = queue_topic
        self.queue_partition = queue_partition
        self.queued = 0
        self.acked = 0
        self.lost = 0
        self.events_routed = 0
        self.refreshed_at = 0.0
        self.overflowing = False
        self.marks: deque[tuple[int, int]] = deque()
        """``(offset, events queued up to and including that message)`` of each message
        Kafka confirmed, oldest first, until the client acks past it."""

    @property
    def depth(self) -> int:
        """Events queued here for the client and not acked (as of the last ack read)."""
        return self.queued - self.acked - self.lost

    def delivered(self, offset: int, queued_through: int) -> None:
        """A message whose events bring :attr:`queued` to ``queued_through`` landed at
        ``offset`` of the client's partition."""
        self.marks.append((offset, queued_through))

    def undelivered(self, events: int) -> None:
        """A message of ``events`` events was not taken by Kafka: they are not queued."""
        self.lost += events

    def acked_below(self, committed: int) -> None:
        """The client committed ``committed``: every message below it is acked."""
        marks = self.marks
        while marks and marks[0][0] < committed:
            _, self.acked = marks.popleft()


class ClientProxies:
    """The client proxies of one server, and the reading of their acks.

    Args:
        admin: Kafka admin client (reads the clients' committed offsets).
        topics: The namespace's topic names.
        partitions_of: Partition count of a shared client topic.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        admin: AdminClient,
        topics: Topics,
        partitions_of: PartitionsOf,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._admin = admin
        self._topics = topics
        self._partitions_of = partitions_of
        self._clock = clock
        self._proxies: dict[str, ClientProxy] = {}

    def get(self, client_id: str, kafka_principal: str | None) -> ClientProxy:
        """The proxy of a client, made on first use (its address from its Kafka
        principal's shared queue topic)."""
        proxy = self._proxies.get(client_id)
        if proxy is None or proxy.queue_partition < 0:
            topic = self._topics.client_queues(kafka_principal)
            count = self._partitions_of(topic)
            partition = client_partition(client_id, count) if count else -1
            proxy = self._proxies[client_id] = ClientProxy(
                client_id, kafka_principal, topic, partition
            )
        return proxy

    def find(self, client_id: str) -> ClientProxy | None:
        """The proxy of a client, or None when this server keeps none."""
        return self._proxies.get(client_id)

    def forget(self, client_id: str) -> None:
        """Forget a client here: its address, queue depth and counters."""
        self._proxies.pop(client_id, None)

    def retain(self, client_ids: set[str]) -> list[str]:
        """Forget every client not in ``client_ids``.

        Returns:
            The client ids forgotten.
        """
        gone = [c for c in self._proxies if c not in client_ids]
        for client_id in gone:
            del self._proxies[client_id]
        return gone

    def __iter__(self) -> Iterator[ClientProxy]:
        return iter(list(self._proxies.values()))

    def __len__(self) -> int:
        return len(self._proxies)

    def ids(self) -> list[str]:
        """The clients served here."""
        return list(self._proxies)

    def refresh(self, proxy: ClientProxy) -> int:
        """Read the client's ack (its committed offset) and return its depth after it.

        An unanswered read leaves the last known depth (never raises).
        """
        proxy.refreshed_at = self._clock()
        if proxy.queue_partition < 0:
            return proxy.depth
        request = ConsumerGroupTopicPartitions(
            self._topics.client_group(proxy.client_id),
            [TopicPartition(proxy.queue_topic, proxy.queue_partition)],
        )
        try:
            result: Any = self._admin.list_consumer_group_offsets([request])
            answer = next(iter(result.values())).result(timeout=5)
            committed = answer.topic_partitions[0].offset
        except (KafkaException, StopIteration, IndexError):
            return proxy.depth
        proxy.acked_below(committed)
        return proxy.depth

    def snapshot(self) -> dict[str, int]:
        """``{client id: depth}``; safe to call from another thread (the metrics
        endpoint's) while the server counts."""
        return {c: p.depth for c, p in list(self._proxies.items())}

    def routed(self) -> dict[str, int]:
        """``{client id: events routed}``; safe to call from another thread."""
        return {c: p.events_routed for c, p in list(self._proxies.items())}


__all__ = ["ClientProxies", "ClientProxy", "PartitionsOf"]
