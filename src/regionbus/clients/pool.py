"""The client's connection pool: sends operations to ``{ns}.ops`` and gathers replies.

One Kafka producer sends every operation to the partition of its bucket; one thread reads
the client's partition of its Kafka principal's shared reply topic, takes the records keyed
by its client id, and completes the futures of pending requests. A request sent to
several buckets (interest registration, keys on server) completes when every bucket has
answered; a bucket's large answer may come in chunks (``more=True``); one unanswered for
``read_timeout_ms`` fails with :class:`ServerTimeoutError`, whether the caller waits on it
or not (a pipelined put's future). confluent-kafka errors are translated here, at this one
boundary, by `regionbus.schemas.transport.kafka_error`: a refusal for want of a Kafka ACL is a
:class:`KafkaAuthorizationError`, and a request whose message Kafka refused fails with it
at once rather than waiting out ``read_timeout_ms``.
"""

from __future__ import annotations

import itertools
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import suppress
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from regionbus.clients.auth import signer_for
from regionbus.clients.client_topics import ClientTopicAdmin
from regionbus.clients.pending import (
    PENDING_CHECK_INTERVAL_S,
    EntriesTaker,
    ReplyCallback,
    RequestTable,
    future_callback,
)
from regionbus.clients.poll_pace import BUSY_POLL_S, PollPace
from regionbus.clients.reply_consumer import open_reply_consumer
from regionbus.clients.resend import LastReply
from regionbus.clients.server_trust import ServerMessages
from regionbus.clients.settings import ClientSettings
from regionbus.clients.tracing import writer_spans
from regionbus.schemas.codec import decode_items, encode, encode_batches
from regionbus.schemas.errors import (
    RegionBusError,
    ServerTimeoutError,
    TransportError,
    UnconnectedError,
)
from regionbus.schemas.eventid import EventID
from regionbus.schemas.kafka_clients import kafka_producer
from regionbus.schemas.kafka_outage import KafkaOutage
from regionbus.schemas.messages import Control, Operation, Reply
from regionbus.schemas.naming import Topics
from regionbus.schemas.record_guard import UnreadableRecords
from regionbus.schemas.signing import HeaderList, Signer
from regionbus.schemas.tracing import batch_headers, record_headers, tracing_for
from regionbus.schemas.transport import kafka_error, poll_batch

log = logging.getLogger("regionbus.client")


class Pool:
    """Producer, reply reader and request bookkeeping of one client.

    Args:
        settings: The client's settings.
        client_id: The client id (the key of its replies and queue records).
        member_id: The member id used in EventIDs (unique per connection).

    Raises:
        KafkaAuthorizationError: the Kafka principal may not describe ``{ns}.ops`` or may
            not create or read its shared queue and reply topics (they are another
            principal's, or its ACLs are missing).
        TransportError: Kafka cannot be reached or the servers' ``{ns}.ops`` topic does not
            appear within ``read_timeout_ms`` (``metadata_timeout_s`` if shorter); the
            message names the address or namespace and how to fix it.
    """

    def __init__(self, settings: ClientSettings, client_id: str, member_id: str) -> None:
        self.settings = settings
        self.topics = Topics(settings.namespace)
        self.client_id = client_id
        self.member_id = member_id
        self._signer = signer_for(settings)
        self.tracing = tracing_for(settings, "regionbus-client")
        """This client's spans, None with tracing off (`regionbus.clients.tracing`)."""
        self.server_replies = ServerMessages(self._signer)
        """The check that replies come from a cache server (with a principal)."""
        self.kafka_outage = KafkaOutage(f"client {client_id}")
        """This client's view of Kafka outages; its subscription queue reports to it too."""
        self.client_topics = ClientTopicAdmin(settings, self.topics, client_id)
        """The admin of this client's own topics, and its first contact with Kafka."""
        self.kafka_principal = settings.topic_principal
        """The Kafka principal whose shared topics this client reads (every operation says
        so, for the servers to address its reply)."""
        # Made first: it connects and gets its producer id while the topics are asked.
        self._producer = kafka_producer(
            settings.librdkafka(
                **{
                    "linger.ms": settings.linger_ms,
                    "acks": "all",
                    # Kept in order per partition across a leader change, and written once:
                    # a retry after a lost acknowledgement is not appended again (one round
                    # trip at start on Apache Kafka). The EventID still guards the resends
                    # of unanswered operations, which are new messages.
                    "enable.idempotence": True,
                    "client.id": member_id,
                    **self.kafka_outage.client_config("producer"),
                }
            )
        )
        self.total_buckets, self.address = self.client_topics.first_contact()
        """The buckets of the namespace, and where this client's queue and replies are."""
        self._pending = RequestTable(
            settings.read_timeout_ms / 1000, settings.retry_interval_ms / 1000
        )
        # Delivery reports run on whichever thread polls the producer; the reply thread
        # fails the requests, so callbacks keep running on it alone.
        self._failed_deliveries: queue.SimpleQueue[tuple[tuple[int, ...], RegionBusError]] = (
            queue.SimpleQueue()
        )
        self.retries = 0
        """Operations sent again because their reply did not come in time."""
        self._last_reply = LastReply()
        self.reply_refusal: RegionBusError | None = None
        """Kafka's refusal to let this client read its reply topic, once it came: every
        request then fails with it (a new client cache is needed once the ACL is back)."""
        self.undecodable_replies = 0
        """Messages on the reply topic that were not a decodable Reply (logged, skipped: a
        client may lack the rights to produce to the dead-letter topic)."""
        self._request_ids = itertools.count(random.getrandbits(40) << 16)
        self._threads = threading.local()
        self._thread_ids = itertools.count(1)
        self._closed = threading.Event()
        self._pace = PollPace()
        self._reply_consumer = open_reply_consumer(
            settings, client_id, member_id, self.address, self.kafka_outage
        )
        self._reply_thread = threading.Thread(
            target=self._read_replies, name=f"replies-{client_id}", daemon=True
        )
        self._reply_thread.start()

    def queue_end(self) -> int:
        """The end (high watermark) of this client's queue partition now: where a client
        that never acked starts reading, if read before it connects (nothing is queued for
        it before the servers know it).

        Raises:
            KafkaAuthorizationError: the principal may not read the queue topic.
            TransportError: Kafka did not answer within ``metadata_timeout_s``.
        """
        address = self.address
        return self.client_topics.ends([(address.queue_topic, address.queue_partition)])[0]

    def queue_start(self) -> int:
        """The log start of this client's queue partition now: the first offset Kafka still
        keeps (retention deletes records before it, read or not).

        Raises:
            KafkaAuthorizationError: the principal may not read the queue topic.
            TransportError: Kafka did not answer within ``metadata_timeout_s``.
        """
        address = self.address
        return self.client_topics.starts([(address.queue_topic, address.queue_partition)])[0]

    # --- identities --------------------------------------------------------------------

    def next_event_id(self, bucket: int) -> EventID:
        """A new EventID of the calling thread: sequence ids start at 0 and rise by one."""
        state = self._threads
        if not hasattr(state, "thread_id"):
            state.thread_id = next(self._thread_ids)
            state.sequence = itertools.count()
        return EventID(self.member_id, state.thread_id, next(state.sequence), bucket)

    def next_request_id(self) -> int:
        """A new request id, unique within this client (random base, so a reconnecting
        client never mistakes an old reply for a new one)."""
        return next(self._request_ids)

    # --- sending -----------------------------------------------------------------------

    def request(
        self,
        ops: Sequence[tuple[Operation, int]],
        take_entries: EntriesTaker | None = None,
    ) -> Future[list[Reply]]:
        """Send operations that share one request id; complete when each has been answered.

        Args:
            ops: ``(operation, bucket)`` pairs; all operations carry the same request id.
            take_entries: Takes each successful reply's entries as its chunk arrives (on
                the reply thread); the replies the future completes with carry none then.

        Returns:
            A future of every reply (chunks included), in arrival order. It fails with
            `KafkaAuthorizationError` when Kafka refuses the message (no Write ACL on
            ``{ns}.ops``) or stops letting this client read its reply topic.

        Raises:
            UnconnectedError: the pool is closed.
            KafkaAuthorizationError: Kafka refused to let this client read its reply topic
                (:attr:`reply_refusal`).
            TransportError: the producer refused the message.
        """
        future, callback = future_callback()
        self._register([(ops[0][0].request_id, len(ops), callback)], [ops], take_entries)
        self._send(ops)
        return future

    def request_with_callback(
        self, ops: Sequence[tuple[Operation, int]], callback: ReplyCallback
    ) -> None:
        """Like :meth:`request`, calling ``callback`` (on the reply thread) instead of
        completing a future: the cheaper path for pipelined writes.

        Raises:
            UnconnectedError, TransportError: as :meth:`request`.
        """
        self._register([(ops[0][0].request_id, len(ops), callback)], [ops])
        self._send(ops)

    def request_each(self, ops: Sequence[tuple[Operation, int]]) -> list[Future[list[Reply]]]:
        """Send operations that are separate requests (own request ids), batched per bucket
        into as few Kafka messages as fit; one future per operation.

        Raises:
            UnconnectedError, TransportError: as :meth:`request`.
        """
        made = [future_callback() for _ in ops]
        self.request_each_with_callbacks(ops, [callback for _, callback in made])
        return [future for future, _ in made]

    def request_each_with_callbacks(
        self,
        ops: Sequence[tuple[Operation, int]],
        callbacks: Sequence[ReplyCallback],
        take_entries: EntriesTaker | None = None,
    ) -> None:
        """Send operations that are separate requests (own request ids), batched per bucket
        into as few Kafka messages as fit; ``callbacks[i]`` is called (on the reply thread)
        when ``ops[i]`` is answered, fails or times out; ``take_entries`` as for
        :meth:`request`.

        Raises:
            UnconnectedError, TransportError: as :meth:`request`.
        """
        registrations = [
            (op.request_id, 1, callback) for (op, _), callback in zip(ops, callbacks, strict=True)
        ]
        self._register(registrations, [[item] for item in ops], take_entries)
        self._send(ops)

    def _register(
        self,
        requests: list[tuple[int, int, ReplyCallback]],
        ops: Sequence[Sequence[tuple[Operation, int]]] = (),
        take_entries: EntriesTaker | None = None,
    ) -> None:
        if self._closed.is_set():
            raise UnconnectedError("the client cache is closed")
        if self.reply_refusal is not None:
            raise self.reply_refusal
        self._pending.add(requests, ops, take_entries)

    def _expire_unanswered(self) -> None:
        """Fail requests unanswered for ``read_timeout_ms`` with :class:`ServerTimeoutError`
        (a caller that waits gives up at the same time; a pipelined one learns it here)."""
        for pending in self._pending.expired(time.monotonic()):
            pending.callback(
                None,
                ServerTimeoutError(
                    f"no reply from the server within {self.settings.read_timeout_ms} ms"
                ),
            )

    def _retry_unanswered(self) -> None:
        """Send unanswered changes again, with the same EventIDs and ``possible_duplicate``
        (their server may have died before replying; the new primary applies each EventID
        once and answers the retry from the stored result), as :mod:`regionbus.clients.resend` says:
        backing off, only to buckets gone quiet, never during a Kafka outage, and a bounded
        number at a time."""
        if self.kafka_outage.ongoing:
            return
        again = self._pending.due_for_resend(time.monotonic(), self._last_reply)
        if not again:
            return
        log.info("resending %d unanswered operations with their EventIDs", len(again))
        self.retries += len(again)
        try:
            self._send(again)
        except RegionBusError as exc:
            log.warning("resend failed: %s", exc)

    def _send(self, ops: Sequence[tuple[Operation, int]]) -> None:
        self._pace.busy()
        traced = None if self.tracing is None else writer_spans(self.tracing, ops, self.topics.ops)
        if len(ops) == 1:
            op, bucket = ops[0]
            headers = record_headers(traced[bucket]) if traced else None
            one = (op.request_id,)
            self._produce(self.topics.ops, encode(op), bucket, op.key, one, headers=headers)
            return
        by_bucket: dict[int, list[bytes]] = {}
        requests: dict[int, set[int]] = {}
        for op, bucket in ops:
            by_bucket.setdefault(bucket, []).append(encode(op))
            requests.setdefault(bucket, set()).add(op.request_id)
        for bucket, framed in by_bucket.items():
            values = encode_batches(framed)
            stamps = batch_headers(values, traced[bucket]) if traced and bucket in traced else ()
            for value, headers in itertools.zip_longest(values, stamps):
                # A batch that fails fails every request with an operation in the bucket.
                ids = tuple(requests[bucket])
                self._produce(self.topics.ops, value, bucket, None, ids, headers=headers)

    def forget(self, request_id: int) -> None:
        """Stop waiting for a request (after a timeout)."""
        self._pending.take([request_id])

    def request_control(self, control: Control, *, first: bool = False) -> Future[list[Reply]]:
        """Send a lifecycle message the servers answer (CONNECT, PING with a request id).

        Args:
            control: The message.
            first: It is the client's first message (its CONNECT): sent by a producer of its
                own without idempotence, delivered at once, where this pool's idempotent
                producer first waits for its producer id (up to librdkafka's 500 ms retry
                of that request at start). A control message needs no idempotence: the
                servers answer a repeated one alike.

        Returns:
            A future of the one reply.

        Raises:
            UnconnectedError: the pool is closed.
            KafkaAuthorizationError: Kafka refused it (no Write ACL on ``{ns}.control``).
            TransportError: it could not be delivered within ``read_timeout_ms``.
        """
        future, callback = future_callback()
        self._register([(control.request_id, 1, callback)])
        topic = self.topics.control
        try:
            if first:
                self._send_first(control)
            else:
                # Not flushed: a refused delivery fails the request (its reply never comes).
                self._produce(
                    topic, encode(control), 0, control.client_id, request_ids=(control.request_id,)
                )
        except RegionBusError:
            self.forget(control.request_id)
            raise
        return future

    def _send_first(self, control: Control) -> None:
        """Deliver a control message with a producer made for it (see
        :meth:`request_control`), then let that producer go.

        Raises:
            KafkaAuthorizationError, TransportError: as :meth:`send_control`.
        """
        producer = kafka_producer(
            self.settings.librdkafka(
                **{
                    "acks": "all",
                    "linger.ms": 0,
                    "enable.idempotence": False,
                    "client.id": self.member_id,
                    **self.kafka_outage.client_config("connect"),
                }
            )
        )
        try:
            self._deliver(control, producer)
        finally:
            self.kafka_outage.forget("connect")
            close = getattr(producer, "close", None)
            if close is not None:
                with suppress(Exception):
                    close()

    def send_control(self, control: Control) -> None:
        """Send a lifecycle message to ``{ns}.control`` and flush it.

        Raises:
            KafkaAuthorizationError: Kafka refused it (no Write ACL on ``{ns}.control``).
            TransportError: it could not be delivered within ``read_timeout_ms``.
        """
        self._deliver(control, self._producer)

    def _deliver(self, control: Control, producer: Any) -> None:
        """Produce a control message with ``producer`` and wait for its delivery.

        Raises:
            KafkaAuthorizationError: Kafka refused it (no Write ACL on ``{ns}.control``).
            TransportError: it could not be delivered within ``read_timeout_ms``.
        """
        refused: list[KafkaError] = []

        def report(error: KafkaError | None, _message: Any) -> None:
            if error is not None:
                refused.append(error)

        topic = self.topics.control
        self._produce(
            topic, encode(control), 0, control.client_id, on_delivery=report, producer=producer
        )
        remaining = producer.flush(self.settings.read_timeout_ms / 1000)
        if remaining:
            raise TransportError(f"{remaining} messages not delivered to Kafka")
        if refused:
            raise kafka_error(refused[0], f"producing to {topic}", f"topic {topic}")

    def flush(self) -> None:
        """Wait until everything sent is delivered to Kafka.

        Raises:
            TransportError: messages are still undelivered after ``read_timeout_ms``.
        """
        remaining = self._producer.flush(self.settings.read_timeout_ms / 1000)
        if remaining:
            raise TransportError(f"{remaining} messages not delivered to Kafka")

    def _produce(
        self,
        topic: str,
        value: bytes,
        partition: int,
        key: str | None,
        request_ids: tuple[int, ...] = (),
        on_delivery: Callable[[KafkaError | None, Any], None] | None = None,
        producer: Any = None,
        headers: HeaderList | None = None,
    ) -> None:
        producer = producer or self._producer
        signer = self._signer
        if signer is not None:  # trace headers (``headers``) are not signed
            headers = [*signer.headers(topic, partition, value), *(headers or [])]
        report = on_delivery or self._delivery_report(topic, request_ids)
        deadline = time.monotonic() + self.settings.read_timeout_ms / 1000
        while True:
            try:
                producer.produce(
                    topic,
                    value,
                    key.encode() if key is not None else None,
                    partition=partition,
                    headers=headers,
                    on_delivery=report,
                )
                producer.poll(0)
                return
            except BufferError as exc:
                # The producer's queue is full (Kafka has been unreachable for a while).
                if time.monotonic() >= deadline:
                    raise TransportError(
                        f"Kafka produce to {topic}: the producer queue stayed full for "
                        f"{self.settings.read_timeout_ms} ms"
                    ) from exc
                producer.poll(0.05)
            except KafkaException as exc:
                raise kafka_error(exc, f"producing to {topic}", f"topic {topic}") from exc

    def _delivery_report(
        self, topic: str, request_ids: tuple[int, ...]
    ) -> Callable[[KafkaError | None, Any], None]:
        def report(error: KafkaError | None, _message: Any) -> None:
            if error is not None:
                failure = kafka_error(error, f"producing to {topic}", f"topic {topic}")
                self._failed_deliveries.put((request_ids, failure))

        return report

    def _fail_undelivered(self) -> None:
        """Fail the requests whose messages Kafka refused or could not take (reply thread)."""
        while True:
            try:
                request_ids, failure = self._failed_deliveries.get_nowait()
            except queue.Empty:
                return
            log.warning("%s", failure)
            self._fail(request_ids, failure)

    def _fail(self, request_ids: Sequence[int] | None, failure: RegionBusError) -> None:
        """Fail these pending requests (every one: None) with ``failure``."""
        for pending in self._pending.take(request_ids):
            pending.callback(None, failure)

    # --- replies -----------------------------------------------------------------------

    def _read_replies(self) -> None:
        next_retry_check = time.monotonic() + PENDING_CHECK_INTERVAL_S
        while not self._closed.is_set():
            if time.monotonic() >= next_retry_check:
                self._expire_unanswered()
                self._retry_unanswered()
                next_retry_check = time.monotonic() + PENDING_CHECK_INTERVAL_S
            # A pending ping polls briskly until answered, without keeping the pace busy.
            poll_s = BUSY_POLL_S if self._pending else self._pace.timeout_s()
            try:
                messages = poll_batch(self._reply_consumer, 500, poll_s)
            except KafkaException as exc:
                log.warning("reply consumer: %s", exc)
                continue
            self._producer.poll(0)
            self._fail_undelivered()
            own_key = self.address.key
            for message in messages:
                if isinstance(message, UnreadableRecords):
                    self.undecodable_replies += 1
                    log.warning("reply topic: %s", message.describe())
                    continue
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                        self._reply_topic_refused(error)
                    continue
                if message.key() != own_key:
                    continue  # another client's replies, in the partition it shares
                unsigned = self.server_replies.problem(message)
                replies, refused = decode_items(message.value(), Reply)
                if refused:
                    # One line per Kafka message, however many of its items are bad.
                    self.undecodable_replies += len(refused)
                    log.warning("%d replies undecodable, dropped: %s", len(refused), refused[0])
                for reply in replies:
                    # A server refusing a request it could not authenticate cannot sign for
                    # a key it does not trust; such a refusal only fails the request.
                    if unsigned is not None and reply.error_type != "AuthenticationError":
                        self.server_replies.drop(message, unsigned)
                        continue
                    self._last_reply.answered(time.monotonic())
                    self._complete(reply)

    @property
    def signer(self) -> Signer | None:
        """This client's signer (its principal), None without security."""
        return self._signer

    def _reply_topic_refused(self, error: KafkaError) -> None:
        """Kafka no longer lets this principal read the reply topic (an ACL was removed): no
        request can be answered any more, so the pending ones fail now with the refusal and
        later ones before they are sent (Kafka reports the refusal once)."""
        topic = self.address.reply_topic
        failure = kafka_error(error, f"reading {topic}", f"topic {topic}")
        log.error("%s; this client cache can send no more requests", failure)
        self.reply_refusal = failure
        self._fail(None, failure)

    def _complete(self, reply: Reply) -> None:
        if reply.entries and reply.ok:
            take = self._pending.entries_taker(reply.request_id)
            if take is not None:
                try:
                    take(reply.entries)
                except Exception:  # a taker's bug must not stop the reply thread
                    log.exception("taking the entries of request %d", reply.request_id)
                reply = reply._replace(entries=())
        pending = self._pending.answered(reply)
        if pending is not None:
            pending.callback(pending.replies, None)

    def close(self, delete_acks: bool = False) -> None:
        """Flush, stop the reply reader and fail every pending request with ``UnconnectedError``.

        Args:
            delete_acks: Also delete the client's consumer group (a non-durable client's,
                or a durable one's that did not ask to be kept alive).
        """
        with suppress(Exception):
            self._producer.flush(5)
        self._closed.set()
        self._reply_thread.join(5)
        with suppress(Exception):
            self._reply_consumer.close()
        self.kafka_outage.forget("replies")
        self._fail(None, UnconnectedError("the client cache was closed"))
        if delete_acks:
            self.client_topics.delete_acks()
        # librdkafka clients otherwise live until garbage collection, reconnecting to a
        # broker that may be gone.
        close_producer = getattr(self._producer, "close", None)
        if close_producer is not None:
            with suppress(Exception):
                close_producer()
        self.kafka_outage.forget("producer")
        self.client_topics.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed.is_set()
