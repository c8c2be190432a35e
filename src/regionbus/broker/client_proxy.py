"""One object per client this server serves (Geode's ``CacheClientProxy``), and one per
queue of records it sends to several clients at once.

A :class:`ClientProxy` holds what this server keeps for one client: where its subscription
queue and replies go (the shared topics of its Kafka principal, its partition, its
address), the events this server queued for it and how many the client has acked (its
queue's depth against ``maximum_message_count``, SPEC §4), and its counters. The
:class:`ClientProxies` of a server create them as clients are first routed to and forget
them in one call, so nothing a client owned on a server outlives it there.

A :class:`SharedQueue` is the same account for the records this server sends to the
clients that share an interest (`regionbus.broker.audiences`) in one partition: one record
for all of them. Its depth is that of its slowest member (what the capacity holds a writer
for); each member's own depth is what it has not acked itself (what the gauges show).

A queue's depth counts the events this server queued, as they are queued (not as Kafka
confirms them), less those acked. A client's ack is its committed offset on its partition
(consumer group ``{ns}.client.<id>``); the delivery report of each record says at which
offset it landed, so the events below the committed offset are acked. Each server counts
the events *it* queued: with several bucket primaries the capacity applies per server.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from regionbus.schemas.naming import Topics, client_partition

PartitionsOf = Callable[[str], int]
"""Partition count of a topic (0 when it does not exist)."""

SHARED_QUEUE_IDLE_S = 600.0
"""A shared queue no event was routed to for this long is forgotten (its sharers are gone,
or now share another)."""


class QueueAccount:
    """Events queued into one partition for a client (or clients), and how many are acked.

    Attributes:
        queue_topic: The shared queue topic.
        queue_partition: The partition (-1 while the topic is unknown).
        queued: Events this server queued there.
        acked: Of those, the events below the last ack read.
        lost: Of those, the events of records Kafka did not take.
        refreshed_at: When the ack was last read (monotonic seconds; 0 = never).
        overflowing: The queue stayed full through one hold and may grow; it is not held
            for again until its depth falls below the capacity.
        parked: Of :attr:`queued`, the events the outbox holds back while the queue is
            full (not sent yet, so its client cannot ack them).
        marks: ``(offset, events queued up to and including that record)`` of each record
            Kafka confirmed, oldest first, until acked past.
    """

    __slots__ = (
        "acked",
        "lost",
        "marks",
        "overflowing",
        "parked",
        "queue_partition",
        "queue_topic",
        "queued",
        "refreshed_at",
    )

    def __init__(self, queue_topic: str, queue_partition: int) -> None:
        self.queue_topic = queue_topic
        self.queue_partition = queue_partition
        self.queued = 0
        self.acked = 0
        self.lost = 0
        self.refreshed_at = 0.0
        self.overflowing = False
        self.parked = 0
        self.marks: deque[tuple[int, int]] = deque()

    @property
    def depth(self) -> int:
        """Events queued here and not acked (as of the last ack read)."""
        return self.queued - self.acked - self.lost

    def delivered(self, offset: int, queued_through: int) -> None:
        """A record whose events bring :attr:`queued` to ``queued_through`` landed at
        ``offset`` of the partition."""
        self.marks.append((offset, queued_through))

    def undelivered(self, events: int) -> None:
        """A record of ``events`` events was not taken by Kafka: they are not queued."""
        self.lost += events

    def acked_below(self, committed: int) -> None:
        """Every record below ``committed`` is acked."""
        marks = self.marks
        while marks and marks[0][0] < committed:
            _, self.acked = marks.popleft()

    def unacked_after(self, committed: int) -> int:
        """Events queued here that a reader who committed ``committed`` has not acked."""
        return self.queued - self.acked_by_each({"": committed})[""] - self.lost

    def acked_by_each(self, committed: dict[str, int]) -> dict[str, int]:
        """``{reader: events it acked}`` of readers who committed the given offsets, found
        in one walk of :attr:`marks` (readers in offset order), however many readers
        share it."""
        found: dict[str, int] = {}
        acked = self.acked
        marks = iter(self.marks)
        mark = next(marks, None)
        for reader, offset in sorted(committed.items(), key=lambda item: item[1]):
            while mark is not None and mark[0] < offset:
                acked = mark[1]
                mark = next(marks, None)
            found[reader] = acked
        return found


class ClientProxy(QueueAccount):
    """What this server keeps for one client.

    Attributes:
        client_id: The client (or durable client) id.
        key: The Kafka record key addressing the client in the shared topics (its id,
            UTF-8).
        kafka_principal: The Kafka principal whose shared topics it reads (None: the
            namespace's unscoped ones).
        events_routed: Events routed to it in records of its own (the
            ``events_routed_total`` series adds those of its shared queues).
    """

    __slots__ = ("client_id", "events_routed", "kafka_principal", "key")

    def __init__(
        self, client_id: str, kafka_principal: str | None, queue_topic: str, queue_partition: int
    ) -> None:
        super().__init__(queue_topic, queue_partition)
        self.client_id = client_id
        self.key = client_id.encode()
        self.kafka_principal = kafka_principal
        self.events_routed = 0


class SharedQueue(QueueAccount):
    """The records this server sends to the clients that share one interest in one
    partition (one record each for all of them).

    Attributes:
        identity: ``(topic, partition, source, receive_values, principal)``: what stays
            the same while its members come and go.
        members: The clients of its latest record.
        events: Events routed into it.
        joined: ``{client id: events}`` routed into it before each member joined (so a
            member's own count is ``events - joined``).
        last_used: Monotonic seconds of its latest event.
        member_committed: ``{client id: offset}`` each member had committed at the last
            read of its ack.
        member_acked: ``{client id: events}`` each member had acked then (a member not
            read yet counts as the slowest).
    """

    __slots__ = (
        "events",
        "identity",
        "joined",
        "last_used",
        "member_acked",
        "member_committed",
        "members",
    )

    def __init__(self, identity: tuple[Any, ...], queue_topic: str, queue_partition: int) -> None:
        super().__init__(queue_topic, queue_partition)
        self.identity = identity
        self.members: frozenset[str] = frozenset()
        self.events = 0
        self.joined: dict[str, int] = {}
        self.last_used = 0.0
        self.member_acked: dict[str, int] = {}
        self.member_committed: dict[str, int] = {}

    def set_members(self, members: frozenset[str]) -> None:
        """The clients of its records from now on."""
        if members is self.members:
            return
        joined = self.joined
        self.joined = {c: joined.get(c, self.events) for c in members}
        acked = self.member_acked
        self.member_acked = {c: acked[c] for c in members if c in acked}
        committed = self.member_committed
        self.member_committed = {c: committed[c] for c in members if c in committed}
        self.members = members

    def read_acks(self, committed: dict[str, int]) -> None:
        """Some members' committed offsets were read: their own depths follow, and once
        every member's is known, the records below the slowest one's are acked."""
        self.member_committed.update(committed)
        self.member_acked.update(self.acked_by_each(committed))
        known = self.member_committed
        if known and all(c in known for c in self.members):
            self.acked_below(min(known[c] for c in self.members))

    def member_depth(self, client_id: str) -> int:
        """Events queued here that ``client_id`` has not acked (as of the last ack read)."""
        acked = max(self.member_acked.get(client_id, self.acked), self.acked)
        return self.queued - acked - self.lost


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


class ClientProxies:
    """The client proxies and shared queues of one server, and the reading of their acks.

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
        self._shared: dict[tuple[Any, ...], SharedQueue] = {}
        self.version = 0
        """Changes whenever a proxy or shared queue is made or forgotten (what was
        computed from them is to be computed again)."""

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
            self.version += 1
        return proxy

    def find(self, client_id: str) -> ClientProxy | None:
        """The proxy of a client, or None when this server keeps none."""
        return self._proxies.get(client_id)

    def shared(self, identity: tuple[Any, ...], members: frozenset[str]) -> SharedQueue:
        """The shared queue of ``identity`` (``(topic, partition, ...)``), made on first
        use, its members set to ``members``."""
        queue = self._shared.get(identity)
        if queue is None:
            queue = self._shared[identity] = SharedQueue(identity, identity[0], identity[1])
            self.version += 1
        queue.set_members(members)
        return queue

    def forget(self, client_id: str) -> None:
        """Forget a client here: its address, queue depth and counters, and its place in
        the shared queues."""
        self._proxies.pop(client_id, None)
        self.version += 1
        for queue in self._shared.values():
            if client_id in queue.joined:
                queue.set_members(queue.members - {client_id})

    def retain(self, client_ids: set[str]) -> list[str]:
        """Forget every client not in ``client_ids``.

        Returns:
            The client ids forgotten.
        """
        gone = [c for c in self._proxies if c not in client_ids]
        for client_id in gone:
            self.forget(client_id)
        for queue in self._shared.values():
            if not queue.members <= client_ids:
                queue.set_members(queue.members & client_ids)
        return gone

    def forget_idle_shared(self) -> int:
        """Forget the shared queues unused for :data:`SHARED_QUEUE_IDLE_S`.

        Returns:
            How many were forgotten.
        """
        now = self._clock()
        idle = [k for k, q in self._shared.items() if now - q.last_used > SHARED_QUEUE_IDLE_S]
        for identity in idle:
            del self._shared[identity]
        if idle:
            self.version += 1
        return len(idle)

    def __iter__(self) -> Iterator[ClientProxy]:
        return iter(list(self._proxies.values()))

    def __len__(self) -> int:
        return len(self._proxies)

    def ids(self) -> list[str]:
        """The clients served here."""
        return list(self._proxies)

    def shared_queues(self) -> list[SharedQueue]:
        """The shared queues kept here."""
        return list(self._shared.values())

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

    def snapshot(self) -> dict[str, int]:
        """``{client id: depth}``: what it has not acked of its own records and of each
        shared queue it is a member of (not the slowest member's backlog); safe to call
        from another thread (the metrics endpoint's)."""
        depths = {c: p.depth for c, p in list(self._proxies.items())}
        for queue in list(self._shared.values()):
            for client_id in queue.members:
                depths[client_id] = depths.get(client_id, 0) + queue.member_depth(client_id)
        return depths

    def routed(self) -> dict[str, int]:
        """``{client id: events routed}`` (own records and shared ones since it joined);
        safe to call from another thread."""
        counts = {c: p.events_routed for c, p in list(self._proxies.items())}
        for queue in list(self._shared.values()):
            for client_id, before in list(queue.joined.items()):
                counts[client_id] = counts.get(client_id, 0) + queue.events - before
        return counts


__all__ = [
    "SHARED_QUEUE_IDLE_S",
    "AckRead",
    "ClientProxies",
    "ClientProxy",
    "PartitionsOf",
    "QueueAccount",
    "SharedQueue",
]
