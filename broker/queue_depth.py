"""How many events a server has queued for each client that the client has not acked yet.

A subscription queue's capacity is ``maximum_message_count`` events (SPEC §4, Geode
default 230,000). The server counts the events it produced into each queue and, from the
delivery reports, the queue offset at which each of its messages landed; a client's ack is
its committed offset on the queue, so the events of this server's messages below that
offset are acked. Each server counts the events *it* queued: with several bucket
primaries the capacity applies per server.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from regionbus.schemas.naming import Topics


@dataclass
class _Queue:
    delivered: int = 0
    acked: int = 0
    marks: deque[tuple[int, int]] = field(default_factory=deque)


class QueueDepths:
    """Per-client queue depth, in events, of what this server queued.

    Args:
        admin: Kafka admin client (reads the clients' committed offsets).
        namespace: Site namespace.
    """

    def __init__(self, admin: AdminClient, namespace: str) -> None:
        self._admin = admin
        self._topics = Topics(namespace)
        self._queues: dict[str, _Queue] = {}

    def delivered(self, client_id: str, offset: int, events: int) -> None:
        """Record that a message of ``events`` events landed at ``offset`` of the queue."""
        queue = self._queues.setdefault(client_id, _Queue())
        queue.delivered += events
        queue.marks.append((offset, queue.delivered))

    def depth(self, client_id: str) -> int:
        """Events delivered into the client's queue by this server and not acked (as of
        the last :meth:`refresh`)."""
        queue = self._queues.get(client_id)
        return 0 if queue is None else queue.delivered - queue.acked

    def refresh(self, client_id: str) -> int:
        """Read the client's committed offset and return the depth after it.

        Raises:
            nothing: an unanswered read leaves the last known depth.
        """
        queue = self._queues.get(client_id)
        if queue is None:
            return 0
        request = ConsumerGroupTopicPartitions(
            self._topics.client_group(client_id),
            [TopicPartition(self._topics.queue(client_id), 0)],
        )
        try:
            result: Any = self._admin.list_consumer_group_offsets([request])
            answer = next(iter(result.values())).result(timeout=5)
            committed = answer.topic_partitions[0].offset
        except (KafkaException, StopIteration, IndexError):
            return self.depth(client_id)
        while queue.marks and queue.marks[0][0] < committed:
            _, queue.acked = queue.marks.popleft()
        return self.depth(client_id)

    def snapshot(self) -> dict[str, int]:
        """``{client id: depth}`` as of each client's last :meth:`refresh`; safe to call
        from another thread (the metrics endpoint's) while the server counts."""
        return {c: q.delivered - q.acked for c, q in list(self._queues.items())}

    def clients(self) -> list[str]:
        """The clients whose queues this server counts."""
        return list(self._queues)

    def clients_at_or_over(self, limit: int) -> list[str]:
        """Clients whose last known depth is at least ``limit`` events."""
        return [c for c, q in self._queues.items() if q.delivered - q.acked >= limit]

    def forget(self, client_id: str) -> None:
        """Stop counting a client's queue (it was dropped or unregistered)."""
        self._queues.pop(client_id, None)
