"""Reading how much of a subscription queue its reader(s) acked.

A client's ack is its committed offset on its partition (consumer group
``{ns}.client.<id>``); :class:`QueueAcks` asks Kafka for it (without waiting, or waiting a
bounded time) and takes the answer into a queue's account
(:class:`regionbus.broker.client_proxy.QueueAccount`). Apart from the proxies, so that what
holds a full queue (`regionbus.broker.queue_holds`) and the depth gauges read acks without
reaching for the table of clients.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from regionbus.broker.client_proxy import ClientProxy, QueueAccount, SharedQueue
from regionbus.schemas.naming import Topics


class AckRead:
    """Committed offsets of a queue's readers, asked of Kafka and answered later.

    Args:
        asked: ``{client id: the admin request's future}``.
    """

    __slots__ = ("_asked",)

    def __init__(self, asked: dict[str, Future[Any]]) -> None:
        self._asked = asked

    def done(self) -> bool:
        """Whether every reader's request has its answer (or failed)."""
        return all(future.done() for future in self._asked.values())

    def answers(self, timeout_s: float = 0.0) -> dict[str, int]:
        """``{client id: committed offset}`` of the readers Kafka answered for, waiting up
        to ``timeout_s`` for each (0: only those answered already). Never raises."""
        found: dict[str, int] = {}
        for client_id, future in self._asked.items():
            if timeout_s <= 0 and not future.done():
                continue
            try:
                answer = future.result(timeout=max(timeout_s, 0.0))
                found[client_id] = answer.topic_partitions[0].offset
            except (KafkaException, TimeoutError, IndexError):
                continue
        return found


class QueueAcks:
    """Reads the acks of the queues of one server.

    Args:
        admin: Kafka admin client (reads the clients' committed offsets).
        topics: The namespace's topic names (the clients' consumer groups).
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        admin: AdminClient,
        topics: Topics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._admin = admin
        self._topics = topics
        self._clock = clock

    def refresh(self, account: QueueAccount) -> int:
        """Read the ack of a queue (its client's committed offset; a shared queue's slowest
        member's) and return its depth after it. An unanswered read leaves the last known
        depth (never raises)."""
        account.refreshed_at = self._clock()
        if account.queue_partition < 0:
            return account.depth
        return self.take_acks(account, self.committed(account))

    def take_acks(self, account: QueueAccount, committed: dict[str, int]) -> int:
        """Note the committed offsets read of a queue's readers (:meth:`committed`,
        :meth:`ask_acks`); return its depth after them."""
        if isinstance(account, SharedQueue):
            account.read_acks(committed)
        elif committed:
            account.acked_below(min(committed.values()))
        return account.depth

    def refresh_member(self, queue: SharedQueue, client_id: str) -> None:
        """Read one member's ack of a shared queue (its own depth, for the gauges: one
        admin request, however many members the queue has). Never raises."""
        if queue.queue_partition >= 0:
            queue.read_acks(self.committed(queue, [client_id]))

    def committed(self, account: QueueAccount, readers: list[str] | None = None) -> dict[str, int]:
        """``{client id: committed offset}`` of the queue's reader(s) on its partition (or
        of ``readers`` among them), as far as Kafka answered within 5 s (asked all at
        once)."""
        return self.ask_acks(account, readers).answers(timeout_s=5)

    def ask_acks(self, account: QueueAccount, readers: list[str] | None = None) -> AckRead:
        """Ask the committed offsets of the queue's reader(s) (or of ``readers`` among
        them) without waiting for them: the answers come in the returned read."""
        account.refreshed_at = self._clock()
        if readers is None:
            readers = (
                [account.client_id]
                if isinstance(account, ClientProxy)
                else sorted(account.members)
                if isinstance(account, SharedQueue)
                else []
            )
        if account.queue_partition < 0:
            return AckRead({})
        partition = TopicPartition(account.queue_topic, account.queue_partition)
        asked: dict[str, Future[Any]] = {}
        for client_id in readers:
            group = self._topics.client_group(client_id)
            try:
                answers: Any = self._admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(group, [partition])]
                )
                asked[client_id] = next(iter(answers.values()))
            except KafkaException:
                continue
        return AckRead(asked)


__all__ = ["AckRead", "QueueAcks"]
