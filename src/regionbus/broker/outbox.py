"""Everything a cache server produces: events, replies, markers and dead letters.

The outbox is the floor of the server: every other part hands it what to send. Replies
and subscription-queue messages of one poll batch are gathered per client, addressed in
the shared client topics of its Kafka principal (the client's partition, keyed by its id),
and sent as few Kafka messages as possible, in order
(:func:`regionbus.schemas.codec.encode_batches`); events to
``{ns}.events`` and gateway queues, and dead letters, go at once. Which producer takes a
message, and when every message up to a mark is delivered, is
`regionbus.broker.deliveries`.

With security on, every message to a client's queue or replies is signed for that client
(:attr:`Outbox.seal`, `regionbus.broker.security.SecurityGuard.client_headers`), so the
client can tell a server's message from a forged one.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

from confluent_kafka import KafkaError, Producer
from confluent_kafka import Message as KafkaMessage

from regionbus.broker.client_proxy import ClientProxy, QueueAccount
from regionbus.broker.client_topics import ClientTopicPartitions
from regionbus.broker.deliveries import (
    RECIPIENT_HEADER,
    REFUSED_BY_TOPIC,
    TOPIC_GONE,
    VALUE_DROPPED_HEADER,
    Deliveries,
    DeliveryReport,
)
from regionbus.broker.queue_holds import QueueHolds
from regionbus.broker.queue_runs import Addressed, OpenRuns, Recipients
from regionbus.broker.stats import ServerStats
from regionbus.schemas.addressing import RECIPIENTS_HEADER, ClientAddress
from regionbus.schemas.codec import encode, encode_batches, split_batch
from regionbus.schemas.errors import RegionBusError
from regionbus.schemas.messages import Control, Operation, Reply
from regionbus.schemas.naming import Topics, client_partition
from regionbus.schemas.signing import HeaderList
from regionbus.schemas.tracing import batch_headers

log = logging.getLogger("regionbus.server")

Seal = Callable[[str, str, int, bytes], HeaderList | None]
"""Signing headers of a message to a client: ``(client id, topic, partition, value)``."""


class Outbox(Deliveries):
    """The server's producers, with their batching per client topic and delivery
    bookkeeping (:class:`Deliveries`).

    Args:
        producer: The server's idempotent ``acks=all`` producer of everything but events.
        topics: The namespace's topic names.
        member_id: The server's member id (dead-letter headers).
        stats: The server's counters (replies, routed events, dead letters).
        client_topics: The partition counts of the shared client topics.
        topic_gone: Told the name of a server topic a delivery found missing (the topic
            keeper checks it at once instead of at its next period).
        holds: The full queues held now (`regionbus.broker.queue_holds`): what goes to
            them is parked until :meth:`release`; None parks nothing.
        events_producer: The producer of ``{ns}.events``; None sends events with
            ``producer``.
    """

    def __init__(
        self,
        producer: Producer,
        topics: Topics,
        member_id: str,
        stats: ServerStats,
        client_topics: ClientTopicPartitions,
        topic_gone: Callable[[str], object] = lambda _topic: None,
        holds: QueueHolds | None = None,
        *,
        events_producer: Producer | None = None,
    ) -> None:
        super().__init__(
            producer, events_producer, topics, member_id, stats, client_topics, topic_gone
        )
        self.gathered: list[Addressed] = []
        """What this poll batch gathered, in the order the runs began."""
        self._replies: dict[tuple[str, int, bytes, bool], Addressed] = {}
        self._open: dict[tuple[str, int], OpenRuns] = {}
        self.seal: Seal | None = None
        """Signs what goes to client topics (set when security is on), else None."""
        self._holds = holds
        self._parked: list[Addressed] = []
        """Runs held back, in the order they were gathered (see :meth:`send`)."""
        self._parked_members: Counter[str] = Counter()
        """Of the parked runs: how many go to each client's queue."""
        self._parked_writers: Counter[str] = Counter()
        """Of the parked runs: how many hold events of each originator, or its replies."""
        self.parked_bytes = 0
        """Bytes of events and replies parked."""

    # --- gathered per poll batch -------------------------------------------------------

    def reply(self, reply: Reply, to: ClientAddress, *, bulk: bool = False) -> None:
        """Queue a reply to a client, in the shared reply topic of its Kafka principal;
        dropped (and counted) when that topic does not exist (a forged principal, a
        client that never started).

        Args:
            reply: The reply.
            to: The client asked: the address of its request
                (:meth:`ClientAddress.of`), whose principal names the reply topic it reads.
            bulk: A page of initial results: sent by the lingering producer, so that the
                replies other clients wait for never queue behind it (every reply of one
                request must be sent with the same ``bulk``, to stay in order).
        """
        client_id = to.client_id
        topic = self.topics.client_replies(to.kafka_principal)
        partitions = self.client_topics.partitions(topic)
        if not partitions:
            self.stats.replies_dropped += 1
            return
        partition = client_partition(client_id, partitions)
        address = (topic, partition, client_id.encode(), bulk)
        addressed = self._replies.get(address)
        if addressed is None:
            addressed = Addressed(topic, partition, address[2], client_id, None, bulk=bulk)
            self._replies[address] = addressed
            self.gathered.append(addressed)
        addressed.framed.append(encode(reply))
        self.stats.replies += 1

    def refuse_control(self, control: Control, exc: RegionBusError) -> None:
        """Reply that a connect, ping or close was refused with ``exc`` (its class name and
        message), to the client it names."""
        self.reply(
            Reply(
                request_id=control.request_id,
                bucket=-1,
                ok=False,
                error_type=type(exc).__name__,
                error_message=str(exc),
            ),
            ClientAddress.of(control),
        )

    def reply_error(self, op: Operation, bucket: int, exc: RegionBusError) -> None:
        """Reply that ``op`` failed with ``exc`` (its class name and message)."""
        self.stats.errors += 1
        try:
            self.reply(
                Reply(
                    request_id=op.request_id,
                    bucket=bucket,
                    ok=False,
                    error_type=type(exc).__name__,
                    error_message=str(exc),
                ),
                ClientAddress.of(op),
            )
        except RegionBusError:
            log.warning("cannot reply to %r: %s", op.client_id, exc)

    def queue(self, proxy: ClientProxy, framed: bytes, originator: str | None = None) -> None:
        """Queue an encoded event or marker for a client's subscription queue, counting it
        in the client's queue depth now; ``originator``: the client whose operation made
        the event (its reply waits while the event is parked)."""
        if proxy.queue_partition < 0:
            self.stats.events_unaddressed += 1
            return
        place = (proxy.queue_topic, proxy.queue_partition)
        runs = self._open.get(place)
        if runs is None:
            runs = self._open[place] = OpenRuns()
        client_id = proxy.client_id
        if runs.groups:
            for group in [g for g in runs.groups if client_id in g.members]:
                del runs.groups[group]
        addressed = runs.own.get(client_id)
        if addressed is None:
            addressed = runs.own[client_id] = Addressed(
                *place, proxy.key, client_id, proxy, members=frozenset((client_id,))
            )
            self.gathered.append(addressed)
        addressed.framed.append(framed)
        if originator:
            addressed.originators.add(originator)
        proxy.queued += 1

    def queue_shared(
        self, recipients: Recipients, framed: bytes, originator: str | None = None
    ) -> None:
        """Queue an encoded event for several clients of one partition, in one record
        listing them, counting it in their shared queue's depth now (``originator`` as in
        :meth:`queue`)."""
        place = (recipients.topic, recipients.partition)
        runs = self._open.get(place)
        if runs is None:
            runs = self._open[place] = OpenRuns()
        members = recipients.members
        own = runs.own
        if own:
            closed = [c for c in own if c in members] if len(own) <= len(members) else members
            for client_id in closed:
                own.pop(client_id, None)
        if len(runs.groups) > (recipients in runs.groups):
            for group in [
                g for g in runs.groups if g is not recipients and not g.members.isdisjoint(members)
            ]:
                del runs.groups[group]
        addressed = runs.groups.get(recipients)
        if addressed is None:
            addressed = runs.groups[recipients] = Addressed(
                *place,
                recipients.key,
                recipients.signer,
                recipients.queue,
                recipients.listed,
                members,
            )
            self.gathered.append(addressed)
        addressed.framed.append(framed)
        if originator:
            addressed.originators.add(originator)
        recipients.queue.queued += 1

    def send(self) -> None:
        """Produce what the poll batch gathered, per address, as few messages as possible,
        in the order each client's events were queued; each queue message's delivery
        report tells its account where it landed.

        What goes to a held queue (:class:`regionbus.broker.queue_holds.QueueHolds`) is
        parked instead, and so is, in each client's order, everything after it for any of
        that queue's clients, and the replies to the writers of its events: those wait for
        :meth:`release`, everything else goes now. A parked run keeps a number of its own
        unsettled, so no offset is committed past its operations until it is delivered.
        """
        runs, self.gathered = self.gathered, []
        self._replies = {}
        self._open = {}
        if self._holds is None or (not self._holds and not self._parked):
            for addressed in runs:
                self._produce_run(addressed)
            return
        # Which queue runs park: decided in order, as one parked run blocks its clients'
        # later runs. Then the replies, once every parked writer of the batch is known.
        members = set(self._parked_members)
        writers = set(self._parked_writers)
        parks: list[bool] = []
        for addressed in runs:
            account = addressed.account
            park = account is not None and (
                self._holds.is_held(account) or not members.isdisjoint(addressed.members)
            )
            if park:
                members |= addressed.members
                writers |= addressed.originators
            parks.append(park)
        for addressed, park in zip(runs, parks, strict=True):
            if park or (addressed.account is None and addressed.client_id in writers):
                self._park(addressed)
            else:
                self._produce_run(addressed)

    def _park(self, addressed: Addressed) -> None:
        addressed.reserved = self._numbered
        self._numbered += 1
        self._parked.append(addressed)
        self._count_parked(addressed, 1)

    def _count_parked(self, addressed: Addressed, sign: int) -> None:
        self.parked_bytes += sign * sum(len(framed) for framed in addressed.framed)
        if addressed.account is not None:
            addressed.account.parked += sign * len(addressed.framed)
        for client_id in addressed.members:
            self._parked_members[client_id] += sign
        writers = addressed.originators if addressed.account is not None else (addressed.client_id,)
        for client_id in writers:
            self._parked_writers[client_id] += sign
        if sign < 0:
            self._parked_members = +self._parked_members
            self._parked_writers = +self._parked_writers

    def release(self, disconnected: set[str] | None = None) -> int:
        """Send the parked runs that may go now, in the order they were gathered: those
        whose queue is no longer held and that follow no parked run of the same clients
        (or, for a reply, of its writer's events). What was parked for ``disconnected``
        clients alone (clients just disconnected as unresponsive) is dropped.

        Returns:
            How many runs went (or were dropped).
        """
        if not self._parked:
            return 0
        gone = disconnected or set()
        # As in send: the queue runs first, in order; then the replies, once every writer
        # with events still parked is known (a reply may have been gathered before them).
        members: set[str] = set()
        writers: set[str] = set()
        holds: dict[int, bool] = {}
        for index, addressed in enumerate(self._parked):
            account = addressed.account
            if account is None:
                continue
            if addressed.listed is None and addressed.members <= gone:
                holds[index] = False  # dropped below
                continue
            hold = (self._holds is not None and self._holds.is_held(account)) or (
                not members.isdisjoint(addressed.members)
            )
            if hold:
                members |= addressed.members
                writers |= addressed.originators
            holds[index] = hold
        kept: list[Addressed] = []
        moved = 0
        for index, addressed in enumerate(self._parked):
            # A reply waits while its writer has events parked.
            hold = holds.get(index, addressed.client_id in writers)
            if hold:
                kept.append(addressed)
                continue
            self._count_parked(addressed, -1)
            moved += 1
            if (
                addressed.account is not None
                and addressed.listed is None
                and (addressed.members <= gone)
            ):
                self._settled(addressed.reserved)
            else:
                self._produce_run(addressed)
        self._parked = kept
        return moved

    def release_all(self) -> None:
        """Send every parked run now, held or not (the server is stopping)."""
        parked, self._parked = self._parked, []
        for addressed in parked:
            self._count_parked(addressed, -1)
            self._produce_run(addressed)

    def _produce_run(self, addressed: Addressed) -> None:
        """Produce one run's messages; the last settles the run's reserved number, if it
        was parked."""
        topic, partition, key = addressed.topic, addressed.partition, addressed.key
        framed, account, listed = addressed.framed, addressed.account, addressed.listed
        values = encode_batches(framed)
        traced = batch_headers(values, addressed.traced) if addressed.traced else None
        queued_through = addressed.start
        for index, value in enumerate(values):
            # Signed per message: the signature covers topic, partition, value (and the
            # recipients of a record for several clients).
            headers: HeaderList | None = None
            if self.seal is not None:
                signed = value if listed is None else listed + value
                headers = self.seal(addressed.client_id, topic, partition, signed)
            if listed is not None:
                headers = [(RECIPIENTS_HEADER, listed), *(headers or [])]
            if traced and (stamp := traced[index]):  # not signed: the signature is the value's
                headers = [*(headers or []), *stamp]
            report = None
            if account is not None:
                count = len(framed) if len(values) == 1 else len(split_batch(value))
                queued_through += count
                report = self._queue_delivery(account, queued_through, count)
            self.produce(
                topic,
                value,
                key,
                partition=partition,
                on_delivery=report,
                headers=headers,
                also_settles=addressed.reserved if index == len(values) - 1 else -1,
                bulk=addressed.bulk,
            )

    def _queue_delivery(
        self, account: QueueAccount, queued_through: int, events: int
    ) -> DeliveryReport:
        def delivered(error: KafkaError | None, message: KafkaMessage) -> None:
            if error is not None:
                account.undelivered(events)
                self.on_delivery(error, message)
            else:
                account.delivered(message.offset() or 0, queued_through)

        return delivered


__all__ = [
    "RECIPIENT_HEADER",
    "REFUSED_BY_TOPIC",
    "TOPIC_GONE",
    "VALUE_DROPPED_HEADER",
    "DeliveryReport",
    "Outbox",
    "Seal",
]
