"""One object per client this server serves (Geode's ``CacheClientProxy``), and one per
queue of records it sends to several clients at once.

A :class:`ClientProxy` is the one object through which this server deals with one client:

- its two addresses, where its subscription queue and its replies go (the shared topics of
  its Kafka principal, its partition, its record key), and its principals (the Kafka one
  naming those topics; the security one whose permissions it reads with);
- its record, on the server that keeps the client records (bucket 0's primary,
  `regionbus.broker.client_lifecycle`): connection, liveness, durable timeout;
- a handle on its interest and CQ registrations here (:meth:`ClientProxy.registrations`);
- the events this server queued for it and how many the client has acked (its queue's
  depth against ``maximum_message_count``, docs/behaviour.md §4), and its counters;
- what is done to it: :meth:`ClientProxy.deliver` (read permission, capacity, counts),
  :meth:`ClientProxy.reply` and :meth:`ClientProxy.close`.

The :class:`ClientProxies` of a server create them as clients connect or are first routed
to, and close them in one call, so nothing a client owned on a server outlives it there.

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
from typing import Any, NamedTuple, Protocol

from regionbus.broker.client_registry import ClientRecord
from regionbus.broker.cq_registry import CqTable
from regionbus.broker.interest import InterestTable
from regionbus.broker.security import SecurityGuard
from regionbus.schemas.addressing import ClientAddress
from regionbus.schemas.messages import Reply
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


class ClientOutbox(Protocol):
    """Where a proxy's events and replies go (`regionbus.broker.outbox.Outbox`)."""

    def queue(self, proxy: ClientProxy, framed: bytes, originator: str | None = None) -> None: ...

    def reply(self, reply: Reply, to: ClientAddress) -> None: ...


class FullQueues(Protocol):
    """What holds a queue counted at its capacity (`regionbus.broker.queue_holds`)."""

    def full(self, account: QueueAccount, whose: str) -> None: ...


class ClientServices(NamedTuple):
    """What the client proxies of one server act through (one for all of them).

    Attributes:
        outbox: Queues their events and replies.
        holds: Holds the writers of a queue counted at its capacity.
        interest: The routing table of interest registrations.
        cqs: The routing table of continuous queries.
        security: Read permissions and client principals; None when security is off.
        maximum_message_count: A queue's capacity in unacked events (docs/behaviour.md §4; Geode's
            ``maximum-message-count``, default 230,000).
    """

    outbox: ClientOutbox
    holds: FullQueues
    interest: InterestTable
    cqs: CqTable
    security: SecurityGuard | None
    maximum_message_count: int


class Registrations(NamedTuple):
    """A client's registrations on this server.

    Attributes:
        keys: Keys it registered interest in (all regions).
        regexes: Regular expressions it registered interest with.
        cqs: Names of its continuous queries held here.
    """

    keys: int
    regexes: int
    cqs: tuple[str, ...]


class ClientProxy(QueueAccount):
    """What this server keeps for one client, and what it does to it (Geode's
    ``CacheClientProxy``).

    Attributes:
        client_id: The client (or durable client) id.
        key: The Kafka record key addressing the client in the shared topics (its id,
            UTF-8).
        kafka_principal: The Kafka principal whose shared topics it reads (None: the
            namespace's unscoped ones).
        events_routed: Events routed to it in records of its own (the
            ``events_routed_total`` series adds those of its shared queues).
        record: Its client record, on the server that keeps them (None elsewhere, and
            once it is forgotten for the namespace).
        served: It registered, got ready for events or was routed to here; a proxy made
            only to hold a record (a client that only writes) is not in the queue
            gauges and counters, and has no ack to read.
    """

    __slots__ = (
        "_owner",
        "client_id",
        "events_routed",
        "kafka_principal",
        "key",
        "record",
        "served",
    )

    def __init__(
        self,
        client_id: str,
        kafka_principal: str | None,
        queue_topic: str,
        queue_partition: int,
        owner: ClientProxies | None = None,
    ) -> None:
        super().__init__(queue_topic, queue_partition)
        self.client_id = client_id
        self.key = client_id.encode()
        self.kafka_principal = kafka_principal
        self.events_routed = 0
        self.record: ClientRecord | None = None
        self.served = False
        self._owner = owner

    @property
    def address(self) -> ClientAddress:
        """Where its replies go: its id and the Kafka principal of its reply topic."""
        return ClientAddress(self.client_id, self.kafka_principal)

    def _services(self) -> ClientServices:
        owner = self._owner
        if owner is None or owner.services is None:
            raise RuntimeError(f"the proxy of {self.client_id!r} belongs to no server")
        return owner.services

    def security_principal(self) -> str | None:
        """The security principal its id is bound to (None: security is off, or it never
        sent an authenticated request).

        Raises:
            TransportError: Redis failed.
        """
        security = self._services().security
        return None if security is None else security.principal_of(self.client_id)

    def may_read(self, region: str, key: str | None = None) -> bool:
        """Whether its principal holds ``DATA:READ`` on the region (and key); always
        with security off.

        Raises:
            TransportError: Redis failed.
        """
        security = self._services().security
        return security is None or security.may_receive(self.client_id, region, key)

    def deliver(
        self,
        payload: bytes,
        originator: str,
        *,
        region: str | None = None,
        key: str | None = None,
    ) -> int:
        """Queue one encoded event of ``originator``'s operation for this client.

        With ``region`` (and ``key``), only if it may read it (:meth:`may_read`: the
        caller checked already when it gives none). A queue counted at its capacity is
        held first (docs/behaviour.md §4): the writer's events for it, and its reply, wait in the
        outbox.

        Returns:
            Events queued for it: 1, or 0 when it may not read the event.

        Raises:
            TransportError: Redis failed (reading its permission).
        """
        services = self._services()
        security = services.security  # read once: this runs for every event routed
        if (
            region is not None
            and security is not None
            and not security.may_receive(self.client_id, region, key)
        ):
            return 0
        if self.depth >= services.maximum_message_count and not self.overflowing:
            services.holds.full(self, self.client_id)
        services.outbox.queue(self, payload, originator)
        self.events_routed += 1
        self.served = True
        return 1

    def reply(self, reply: Reply) -> None:
        """Queue a reply to it, in the reply topic of its Kafka principal."""
        self._services().outbox.reply(reply, self.address)

    def registrations(self) -> Registrations:
        """Its interest and CQ registrations held in this server's routing tables."""
        services = self._services()
        return Registrations(
            services.interest.keys_of(self.client_id),
            services.interest.regexes_of(self.client_id),
            tuple(services.cqs.names(self.client_id)),
        )

    def close(self) -> None:
        """Forget what this server keeps of it (:meth:`ClientProxies.close`); its record
        stays until it is forgotten for the namespace."""
        if self._owner is not None:
            self._owner.close(self.client_id)


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


class ClientProxies:
    """The client proxies and shared queues of one server.

    Args:
        topics: The namespace's topic names.
        partitions_of: Partition count of a shared client topic.
        services: What the proxies act through (None: they only keep accounts, as in
            tests of routing alone).
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        topics: Topics,
        partitions_of: PartitionsOf,
        services: ClientServices | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._topics = topics
        self._partitions_of = partitions_of
        self.services = services
        self._clock = clock
        self._proxies: dict[str, ClientProxy] = {}
        self._shared: dict[tuple[Any, ...], SharedQueue] = {}
        self.version = 0
        """Changes whenever a proxy or shared queue is made or forgotten (what was
        computed from them is to be computed again)."""

    def get(self, client_id: str, kafka_principal: str | None) -> ClientProxy:
        """The proxy of a client this server serves (routes to, or holds registrations
        of), made on first use (its address from its Kafka principal's shared queue
        topic), and made again (keeping its record) when its topic did not exist then or
        the client now reads another principal's topics."""
        proxy = self._addressed(client_id, kafka_principal)
        proxy.served = True
        return proxy

    def _addressed(self, client_id: str, kafka_principal: str | None) -> ClientProxy:
        proxy = self._proxies.get(client_id)
        if proxy is None or proxy.queue_partition < 0 or proxy.kafka_principal != kafka_principal:
            topic = self._topics.client_queues(kafka_principal)
            count = self._partitions_of(topic)
            partition = client_partition(client_id, count) if count else -1
            made = ClientProxy(client_id, kafka_principal, topic, partition, self)
            if proxy is not None:
                made.record, made.served = proxy.record, proxy.served
                self.forget(client_id)
            proxy = self._proxies[client_id] = made
            self.version += 1
        return proxy

    def find(self, client_id: str) -> ClientProxy | None:
        """The proxy of a client, or None when this server keeps none."""
        return self._proxies.get(client_id)

    def record_of(self, client_id: str) -> ClientRecord | None:
        """A client's record, when this server keeps it."""
        proxy = self._proxies.get(client_id)
        return None if proxy is None else proxy.record

    def records(self) -> dict[str, ClientRecord]:
        """``{client id: record}`` of the clients whose records this server keeps."""
        return {c: p.record for c, p in list(self._proxies.items()) if p.record is not None}

    def keep_record(self, record_of: str, record: ClientRecord) -> ClientProxy:
        """Keep a client's record on its proxy (made now if new, addressed by the
        record's Kafka principal)."""
        proxy = self._addressed(record_of, record.kafka_principal)
        proxy.record = record
        return proxy

    def drop_record(self, client_id: str) -> None:
        """Keep a client's record no more (the client stays served here)."""
        proxy = self._proxies.get(client_id)
        if proxy is not None:
            proxy.record = None

    def close(self, client_id: str, *, keep_record: bool = True) -> None:
        """Forget what this server keeps of a client, in one call: its routing (interest
        and CQs, in memory: what is stored goes with the DISCONNECTs), its proxy (queue
        address, depth, counters, places in shared records), its principal here; and
        its record too unless ``keep_record`` (a client disconnected here but not yet
        for the namespace keeps it until bucket 0's DISCONNECT)."""
        services = self.services
        if services is not None:
            services.interest.drop_client(client_id)
            services.cqs.drop_client(client_id)
            if services.security is not None:
                services.security.forget_client(client_id, unbind=False)
        proxy = self._proxies.get(client_id)
        self.forget(client_id)
        if keep_record and proxy is not None and proxy.record is not None:
            self.keep_record(client_id, proxy.record)

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
        """The proxies of the clients served here (:attr:`ClientProxy.served`)."""
        return iter([p for p in list(self._proxies.values()) if p.served])

    def __len__(self) -> int:
        return len(self._proxies)

    def ids(self) -> list[str]:
        """The clients this server keeps a proxy of (served, or holding a record)."""
        return list(self._proxies)

    def shared_queues(self) -> list[SharedQueue]:
        """The shared queues kept here."""
        return list(self._shared.values())

    def snapshot(self) -> dict[str, int]:
        """``{client id: depth}``: what it has not acked of its own records and of each
        shared queue it is a member of (not the slowest member's backlog); safe to call
        from another thread (the metrics endpoint's)."""
        depths = {p.client_id: p.depth for p in self}
        for queue in list(self._shared.values()):
            for client_id in queue.members:
                depths[client_id] = depths.get(client_id, 0) + queue.member_depth(client_id)
        return depths

    def routed(self) -> dict[str, int]:
        """``{client id: events routed}`` (own records and shared ones since it joined);
        safe to call from another thread."""
        counts = {p.client_id: p.events_routed for p in self}
        for queue in list(self._shared.values()):
            for client_id, before in list(queue.joined.items()):
                counts[client_id] = counts.get(client_id, 0) + queue.events - before
        return counts


__all__ = [
    "SHARED_QUEUE_IDLE_S",
    "ClientOutbox",
    "ClientProxies",
    "ClientProxy",
    "ClientServices",
    "FullQueues",
    "PartitionsOf",
    "QueueAccount",
    "Registrations",
    "SharedQueue",
]
