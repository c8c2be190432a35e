"""Everything a cache server produces: events, replies, markers and dead letters.

The outbox is the floor of the server: every other part hands it what to send. Replies
and subscription-queue messages of one poll batch are gathered per client, addressed in
the shared client topics of its Kafka principal (the client's partition, keyed by its id),
and sent as few Kafka messages as possible, in order
(:func:`regionbus.schemas.codec.encode_batches`); events to
``{ns}.events`` and gateway queues, and dead letters, go at once. Delivery failures are
counted, so the server commits no offset past an operation whose effects were lost (the
offsets part rewinds instead). Every message is numbered as it is handed to the producer,
and :meth:`Outbox.settled` says when every message up to a :meth:`Outbox.mark` has its
delivery report: the offsets part commits then, without stopping the loop for a flush.

With security on, every message to a client's queue or replies is signed for that client
(:attr:`Outbox.seal`, `regionbus.broker.security.SecurityGuard.client_headers`), so the
client can tell a server's message from a forged one.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Final

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import Message as KafkaMessage

from regionbus.broker.client_proxy import ClientProxy, QueueAccount
from regionbus.broker.client_topics import ClientTopicPartitions
from regionbus.broker.queue_holds import QueueHolds
from regionbus.broker.queue_runs import Addressed, OpenRuns, Recipients
from regionbus.broker.stats import ServerStats
from regionbus.schemas.addressing import RECIPIENTS_HEADER, ClientAddress
from regionbus.schemas.codec import encode, encode_batches, split_batch
from regionbus.schemas.dead_letter import Source, dead_letter_headers
from regionbus.schemas.errors import RegionBusError
from regionbus.schemas.messages import Control, Operation, Reply
from regionbus.schemas.naming import Topics, client_partition
from regionbus.schemas.record_guard import UnreadableRecords
from regionbus.schemas.signing import HeaderList
from regionbus.schemas.tracing import batch_headers

log = logging.getLogger("regionbus.server")

DeliveryReport = Callable[[KafkaError | None, KafkaMessage], None]
"""A librdkafka delivery callback: ``(error or None, message)``."""

Seal = Callable[[str, str, int, bytes], HeaderList | None]
"""Signing headers of a message to a client: ``(client id, topic, partition, value)``."""

TOPIC_GONE: Final = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)
"""Client errors that mean the topic (or its partition) does not exist (any more)."""

REFUSED_BY_TOPIC: Final = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.POLICY_VIOLATION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
)
"""Errors by which a topic refuses a record for what the topic is (its configs, its
ACLs), so sending the record again would be refused again."""

RECIPIENT_HEADER: Final = "rb.recipient"
"""Of a dead letter a client topic refused: the record key addressing its client(s)."""

_BUFFER_FULL_POLL_S = 0.05

VALUE_DROPPED_HEADER: Final = "rb.value-dropped"
"""Of a dead letter sent without the record's value (too large for the dead-letter topic):
the value's size in bytes."""


class Outbox:
    """The server's producer, with its batching per client topic and delivery bookkeeping.

    Args:
        producer: The server's idempotent ``acks=all`` producer.
        topics: The namespace's topic names.
        member_id: The server's member id (dead-letter headers).
        stats: The server's counters (replies, routed events, dead letters).
        client_topics: The partition counts of the shared client topics.
        topic_gone: Told the name of a server topic a delivery found missing (the topic
            keeper checks it at once instead of at its next period).
        holds: The full queues held now (`regionbus.broker.queue_holds`): what goes to
            them is parked until :meth:`release`; None parks nothing.
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
    ) -> None:
        self.producer = producer
        self.topics = topics
        self.member_id = member_id
        self.stats = stats
        self.client_topics = client_topics
        self._topic_gone = topic_gone
        self.delivery_failures = 0
        """Messages Kafka did not take (other than for a vanished client topic)."""
        self.gathered: list[Addressed] = []
        """What this poll batch gathered, in the order the runs began."""
        self._replies: dict[tuple[str, int, bytes], Addressed] = {}
        self._open: dict[tuple[str, int], OpenRuns] = {}
        self.seal: Seal | None = None
        """Signs what goes to client topics (set when security is on), else None."""
        self._numbered = 0
        self._settled_below = 0
        self._settled_above: set[int] = set()
        self._holds = holds
        self._parked: list[Addressed] = []
        """Runs held back, in the order they were gathered (see :meth:`send`)."""
        self._parked_members: Counter[str] = Counter()
        """Of the parked runs: how many go to each client's queue."""
        self._parked_writers: Counter[str] = Counter()
        """Of the parked runs: how many hold events of each originator, or its replies."""
        self.parked_bytes = 0
        """Bytes of events and replies parked."""

    # --- sending now -------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int = -1,
        on_delivery: DeliveryReport | None = None,
        headers: HeaderList | None = None,
        also_settles: int = -1,
    ) -> None:
        """Hand one message to the producer, waiting (serving delivery reports) while its
        buffer is full; ``partition=-1`` lets the producer choose. ``also_settles`` is a
        number reserved for a parked run, settled with this message."""
        number = self._numbered
        self._numbered += 1
        settles = (number,) if also_settles < 0 else (number, also_settles)
        callback = partial(self._settle, settles, on_delivery or self.on_delivery)
        while True:
            try:
                if partition >= 0:
                    self.producer.produce(
                        topic,
                        value,
                        key,
                        partition=partition,
                        on_delivery=callback,
                        headers=headers,
                    )
                else:
                    self.producer.produce(topic, value, key, on_delivery=callback, headers=headers)
                return
            except BufferError:
                self.producer.poll(_BUFFER_FULL_POLL_S)
            except KafkaException as exc:
                # The producer already knows the topic is gone (deleted): a failed delivery.
                self._delivery_failed(topic, exc.args[0])
                for settled in settles:
                    self._settled(settled)
                return

    def mark(self) -> int:
        """A mark after every message handed to the producer so far, for :meth:`settled`."""
        return self._numbered

    def settled(self, mark: int) -> bool:
        """Whether every message handed to the producer before ``mark`` (:meth:`mark`) has
        its delivery report: delivered, or counted in :attr:`delivery_failures`. Reports
        are served by the producer's ``poll``."""
        return self._settled_below >= mark

    def _settle(
        self,
        numbers: tuple[int, ...],
        report: DeliveryReport,
        error: KafkaError | None,
        message: KafkaMessage,
    ) -> None:
        try:
            report(error, message)
        finally:
            for number in numbers:
                self._settled(number)

    def _settled(self, number: int) -> None:
        # Reports of different partitions come in any order: keep those above the lowest
        # number still unsettled until it is settled too.
        if number != self._settled_below:
            self._settled_above.add(number)
            return
        self._settled_below += 1
        while self._settled_below in self._settled_above:
            self._settled_above.remove(self._settled_below)
            self._settled_below += 1

    def on_delivery(self, error: KafkaError | None, message: KafkaMessage) -> None:
        """Count a message Kafka did not take (see :meth:`_delivery_failed`)."""
        if error is not None:
            self._delivery_failed(message.topic() or "", error, message)

    def _delivery_failed(
        self, topic: str, error: KafkaError, message: KafkaMessage | None = None
    ) -> None:
        """One for a client's queue or reply topic that is gone is moot (the client closed
        and deleted it) and must not hold back the commit of everything else; one such a
        topic refuses for what it is (`REFUSED_BY_TOPIC`: its ``max.message.bytes``, its
        ACLs) is dead-lettered for its recipients, who alone miss it, while the others go
        on; any other is counted, so the offsets are rewound and it is sent again."""
        parsed = self.topics.client_topic(topic)
        if parsed is not None and message is not None and error.code() in REFUSED_BY_TOPIC:
            self._dead_letter_refused(message, error)
            return
        if error.code() in TOPIC_GONE and parsed is not None and parsed.kafka_principal:
            self.client_topics.forget(topic)
            log.info("dropped a message for %s: the topic is gone (%s)", topic, error)
            return
        self.delivery_failures += 1
        log.error("delivery to %s failed: %s", topic, error)
        if error.code() in TOPIC_GONE:
            self._topic_gone(topic)

    def dead_letter(
        self,
        raw: bytes | None,
        source: Source,
        reason: str,
        extra_headers: HeaderList | None = None,
        *,
        category: str,
        last_offset: int | None = None,
    ) -> None:
        """Set a message the server cannot process aside in ``{ns}.dead-letter``, unchanged,
        with the reason and where it came from in headers; ``category`` (see
        :class:`ServerStats`) labels the dead-letter metric; ``last_offset`` is the last
        offset of a dead letter that stands for several records."""
        self.stats.dead_lettered(category)
        log.warning(
            "dead-lettered %s[%d]@%d: %s", source.topic, source.partition, source.offset, reason
        )
        headers = [
            *dead_letter_headers(reason, source, self.member_id, last_offset),
            *(extra_headers or []),
        ]
        sent = partial(self._dead_letter_sent, headers)
        self.produce(self.topics.dead_letter, raw, None, on_delivery=sent, headers=headers)

    def _dead_letter_refused(self, message: KafkaMessage, error: KafkaError) -> None:
        """Set a record a client topic refused aside, with its key and headers (the
        recipients, the signature) and the topic and partition it was for."""
        topic, partition = message.topic() or "", message.partition()
        key = message.key()
        self.dead_letter(
            message.value(),
            Source(topic, -1 if partition is None else partition, -1),
            f"{topic} refused the record for its recipients: {error.str()}",
            [(RECIPIENT_HEADER, key), *(message.headers() or [])],
            category="refused_by_recipient_topic",
        )

    def _dead_letter_sent(
        self, headers: HeaderList, error: KafkaError | None, message: KafkaMessage
    ) -> None:
        """A dead letter Kafka refused as too large (a dead-letter topic made before its size
        limit left room for the headers) goes again without its value, whose size it names
        in ``rb.value-dropped``: the record stays at its source offset, and a refused dead
        letter counted as a failed delivery would have the record read again for ever."""
        value = message.value()
        if error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE and value:
            dropped = (VALUE_DROPPED_HEADER, str(len(value)).encode())
            log.error("dead letter too large for %s, sent without its value", message.topic())
            self.produce(self.topics.dead_letter, None, None, headers=[*headers, dropped])
            return
        self.on_delivery(error, message)

    def dead_letter_unreadable(self, skipped: UnreadableRecords) -> None:
        """Dead-letter a record batch the consumer could not read (it has no value to
        keep): the reason and its offsets, category ``unreadable``."""
        self.dead_letter(
            None,
            skipped.source,
            skipped.describe(),
            category="unreadable",
            last_offset=skipped.last_offset,
        )

    # --- gathered per poll batch -------------------------------------------------------

    def reply(self, reply: Reply, to: ClientAddress) -> None:
        """Queue a reply to a client, in the shared reply topic of its Kafka principal;
        dropped (and counted) when that topic does not exist (a forged principal, a
        client that never started).

        Args:
            reply: The reply.
            to: The client asked: the address of its request
                (:meth:`ClientAddress.of`), whose principal names the reply topic it reads.
        """
        client_id = to.client_id
        topic = self.topics.client_replies(to.kafka_principal)
        partitions = self.client_topics.partitions(topic)
        if not partitions:
            self.stats.replies_dropped += 1
            return
        address = (topic, client_partition(client_id, partitions), client_id.encode())
        addressed = self._replies.get(address)
        if addressed is None:
            addressed = self._replies[address] = Addressed(*address, client_id, None)
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

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every message to be delivered (or fail).

        Returns:
            How many are still in flight.
        """
        return self.producer.flush(timeout_s)


__all__ = [
    "RECIPIENT_HEADER",
    "REFUSED_BY_TOPIC",
    "TOPIC_GONE",
    "VALUE_DROPPED_HEADER",
    "DeliveryReport",
    "Outbox",
]
