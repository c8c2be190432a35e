"""The client's connection pool: sends operations to ``{ns}.ops`` and gathers replies.

One Kafka producer sends every operation to the partition of its bucket; one thread reads
the client's reply topic and completes the futures of pending requests. A request sent to
several buckets (interest registration, keys on server) completes when every bucket has
answered; a bucket's large answer may come in chunks (``more=True``). confluent-kafka
errors are translated here, at this one boundary, into :class:`TransportError`.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import suppress

from confluent_kafka import (
    KafkaException,
    TopicPartition,
)

from clients.auth import signer_for
from clients.settings import ClientSettings
from schemas.codec import decode_as, encode, encode_batches, split_batch
from schemas.errors import (
    ConfigurationError,
    MessageDecodeError,
    TransportError,
    UnconnectedError,
)
from schemas.eventid import EventID
from schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from schemas.messages import Control, Operation, Reply
from schemas.naming import Topics
from schemas.topics import client_topic_specs, ensure_topics
from schemas.transport import poll_batch, watermarks

log = logging.getLogger("regionbus.client")


ReplyCallback = Callable[[list[Reply] | None, BaseException | None], None]
"""Called once with ``(replies, None)`` when a request completes, or ``(None, error)``."""


class _Pending:
    __slots__ = ("callback", "done", "expected", "ops", "replies", "sent_at")

    def __init__(
        self,
        expected: int,
        callback: ReplyCallback,
        ops: Sequence[tuple[Operation, int]] = (),
    ) -> None:
        self.expected = expected
        self.done = 0
        self.replies: list[Reply] = []
        self.callback = callback
        # Changes (with EventIDs) are sent again when unanswered; reads are not.
        self.ops = [(op, b) for op, b in ops if op.event_id is not None]
        self.sent_at = time.monotonic()


def _future_callback() -> tuple[Future[list[Reply]], ReplyCallback]:
    future: Future[list[Reply]] = Future()

    def complete(replies: list[Reply] | None, error: BaseException | None) -> None:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(replies or [])

    return future, complete


class Pool:
    """Producer, reply reader and request bookkeeping of one client.

    Args:
        settings: The client's settings.
        client_id: The client id (reply topic ``{ns}.reply.<client_id>``).
        member_id: The member id used in EventIDs (unique per connection).

    Raises:
        TransportError: Kafka cannot be reached or the servers' ``{ns}.ops`` topic does not
            appear within ``metadata_timeout_s``.
    """

    def __init__(self, settings: ClientSettings, client_id: str, member_id: str) -> None:
        self.settings = settings
        self.topics = Topics(settings.namespace)
        self.client_id = client_id
        self.member_id = member_id
        self._signer = signer_for(settings)
        self._admin = kafka_admin(settings.librdkafka())
        self.total_buckets = self._wait_for_ops_topic()
        self.create_client_topics()
        self._producer = kafka_producer(
            settings.librdkafka(
                **{
                    "linger.ms": settings.linger_ms,
                    "acks": "all",
                    # Order per partition with up to five requests in flight, and no
                    # duplicate from librdkafka's own retries; on Apache Kafka the producer
                    # id costs nothing measurable at start (client start 264 vs 268 ms).
                    "enable.idempotence": True,
                    "client.id": member_id,
                }
            )
        )
        self._pending: dict[int, _Pending] = {}
        self.retries = 0
        """Operations sent again because their reply did not come in time."""
        self.undecodable_replies = 0
        """Messages on the reply topic that were not a decodable Reply (logged, skipped: a
        client may lack the rights to produce to the dead-letter topic)."""
        self._lock = threading.Lock()
        self._request_ids = itertools.count(random.getrandbits(40) << 16)
        self._threads = threading.local()
        self._thread_ids = itertools.count(1)
        self._closed = threading.Event()
        self._reply_consumer = kafka_consumer(
            settings.librdkafka(
                **{
                    "group.id": f"{self.topics.client_group(client_id)}.reply",
                    # An explicit offset, not OFFSET_BEGINNING: librdkafka resolves a logical
                    # offset on a just-created topic only on a 500 ms retry timer. Past the
                    # log start (retention), fall back to the earliest offset.
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": settings.fetch_wait_max_ms,
                    "client.id": member_id,
                }
            )
        )
        # Replies to this process come after its start: begin at the high watermark.
        reply_partition = TopicPartition(self.topics.reply(client_id), 0)
        try:
            _, high = watermarks(
                self._reply_consumer, reply_partition, self.settings.metadata_timeout_s
            )
        except KafkaException as exc:
            raise TransportError(f"reply topic of {client_id}: {exc}") from exc
        reply_partition.offset = max(high, 0)
        self._reply_consumer.assign([reply_partition])
        self._reply_thread = threading.Thread(
            target=self._read_replies, name=f"replies-{client_id}", daemon=True
        )
        self._reply_thread.start()

    # --- topics ------------------------------------------------------------------------

    def _wait_for_ops_topic(self) -> int:
        deadline = time.monotonic() + self.settings.metadata_timeout_s
        while True:
            try:
                topics = self._admin.list_topics(timeout=5).topics
                meta = topics.get(self.topics.ops)
                if meta is not None and meta.error is None and meta.partitions:
                    return len(meta.partitions)
            except KafkaException as exc:
                if time.monotonic() > deadline:
                    raise TransportError(f"Kafka metadata: {exc}") from exc
            if time.monotonic() > deadline:
                raise TransportError(
                    f"topic {self.topics.ops} does not exist: is a cache server of namespace "
                    f"{self.settings.namespace!r} running?"
                )
            time.sleep(0.2)

    def create_client_topics(self) -> None:
        """Create this client's queue and reply topics (1 partition each) if missing, and
        wait until both have a leader.

        Raises:
            TransportError: the broker refused, or the topics had no leader within
                ``metadata_timeout_s``.
        """
        specs = client_topic_specs(
            self.topics, self.client_id, self.settings.durable_client_timeout_s
        )
        try:
            ensure_topics(self._admin, specs, timeout_s=self.settings.metadata_timeout_s)
        except ConfigurationError as exc:
            raise TransportError(str(exc)) from exc

    def delete_client_topics(self) -> None:
        """Delete this client's queue and reply topics and its committed offsets on them
        (best effort, at a non-durable close)."""
        topics = [self.topics.queue(self.client_id), self.topics.reply(self.client_id)]
        group = self.topics.client_group(self.client_id)
        with suppress(Exception):
            for future in self._admin.delete_topics(topics, operation_timeout=5).values():
                with suppress(Exception):
                    future.result(timeout=5)
        with suppress(Exception):
            deleted = self._admin.delete_consumer_groups([group, f"{group}.reply"])
            for future in deleted.values():
                with suppress(Exception):
                    future.result(timeout=5)

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

    def request(self, ops: Sequence[tuple[Operation, int]]) -> Future[list[Reply]]:
        """Send operations that share one request id; complete when each has been answered.

        Args:
            ops: ``(operation, bucket)`` pairs; all operations carry the same request id.

        Returns:
            A future of every reply (chunks included), in arrival order.

        Raises:
            UnconnectedError: the pool is closed.
            TransportError: the producer refused the message.
        """
        future, callback = _future_callback()
        self.request_with_callback(ops, callback)
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
        futures = []
        registrations = []
        for op, _ in ops:
            future, callback = _future_callback()
            futures.append(future)
            registrations.append((op.request_id, 1, callback))
        self._register(registrations, [[item] for item in ops])
        self._send(ops)
        return futures

    def _register(
        self,
        requests: list[tuple[int, int, ReplyCallback]],
        ops: Sequence[Sequence[tuple[Operation, int]]] = (),
    ) -> None:
        if self._closed.is_set():
            raise UnconnectedError("the client cache is closed")
        with self._lock:
            for i, (request_id, expected, callback) in enumerate(requests):
                self._pending[request_id] = _Pending(
                    expected, callback, ops[i] if i < len(ops) else ()
                )

    def _retry_unanswered(self) -> None:
        """Send changes unanswered for ``retry_interval_ms`` again, with the same EventIDs
        and ``possible_duplicate`` (their server may have died before replying; the new
        primary applies each EventID once and answers the retry from the stored result)."""
        limit_s = self.settings.retry_interval_ms / 1000
        now = time.monotonic()
        again: list[tuple[Operation, int]] = []
        with self._lock:
            for pending in self._pending.values():
                if pending.ops and now - pending.sent_at >= limit_s:
                    pending.sent_at = now
                    again.extend((op._replace(possible_duplicate=True), b) for op, b in pending.ops)
        if again:
            log.info("resending %d unanswered operations with their EventIDs", len(again))
            self.retries += len(again)
            try:
                self._send(again)
            except TransportError as exc:
                log.warning("resend failed: %s", exc)

    def _send(self, ops: Sequence[tuple[Operation, int]]) -> None:
        if len(ops) == 1:
            op, bucket = ops[0]
            self._produce(self.topics.ops, encode(op), bucket, op.key)
            return
        by_bucket: dict[int, list[bytes]] = {}
        for op, bucket in ops:
            by_bucket.setdefault(bucket, []).append(encode(op))
        for bucket, framed in by_bucket.items():
            for value in encode_batches(framed):
                self._produce(self.topics.ops, value, bucket, None)

    def forget(self, request_id: int) -> None:
        """Stop waiting for a request (after a timeout)."""
        with self._lock:
            self._pending.pop(request_id, None)

    def request_control(self, control: Control) -> Future[list[Reply]]:
        """Send a lifecycle message the servers answer (CONNECT, PING with a request id).

        Returns:
            A future of the one reply.

        Raises:
            UnconnectedError: the pool is closed.
            TransportError: it could not be delivered within ``read_timeout_ms``.
        """
        future, callback = _future_callback()
        self._register([(control.request_id, 1, callback)])
        try:
            self.send_control(control)
        except TransportError:
            self.forget(control.request_id)
            raise
        return future

    def send_control(self, control: Control) -> None:
        """Send a lifecycle message to ``{ns}.control`` and flush it.

        Raises:
            TransportError: it could not be delivered within ``read_timeout_ms``.
        """
        self._produce(self.topics.control, encode(control), 0, control.client_id)
        self.flush()

    def flush(self) -> None:
        """Wait until everything sent is delivered to Kafka.

        Raises:
            TransportError: messages are still undelivered after ``read_timeout_ms``.
        """
        remaining = self._producer.flush(self.settings.read_timeout_ms / 1000)
        if remaining:
            raise TransportError(f"{remaining} messages not delivered to Kafka")

    def _produce(self, topic: str, value: bytes, partition: int, key: str | None) -> None:
        signer = self._signer
        headers = signer.headers(topic, partition, value) if signer is not None else None
        while True:
            try:
                self._producer.produce(
                    topic,
                    value,
                    key.encode() if key is not None else None,
                    partition=partition,
                    headers=headers,
                )
                self._producer.poll(0)
                return
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:
                raise TransportError(f"Kafka produce to {topic}: {exc}") from exc

    # --- replies -----------------------------------------------------------------------

    def _read_replies(self) -> None:
        next_retry_check = time.monotonic() + 0.5
        while not self._closed.is_set():
            if time.monotonic() >= next_retry_check:
                self._retry_unanswered()
                next_retry_check = time.monotonic() + 0.5
            try:
                messages = poll_batch(self._reply_consumer, 500, 0.1)
            except KafkaException as exc:
                log.warning("reply consumer: %s", exc)
                continue
            self._producer.poll(0)
            for message in messages:
                if message.error() is not None:
                    continue
                try:
                    items = split_batch(message.value())
                except MessageDecodeError as exc:
                    self.undecodable_replies += 1
                    log.warning("undecodable reply batch dropped: %s", exc)
                    continue
                for raw in items:
                    try:
                        reply = decode_as(raw, Reply)
                    except MessageDecodeError as exc:
                        self.undecodable_replies += 1
                        log.warning("undecodable reply dropped: %s", exc)
                        continue
                    self._complete(reply)

    def _complete(self, reply: Reply) -> None:
        with self._lock:
            pending = self._pending.get(reply.request_id)
            if pending is None:
                return
            pending.replies.append(reply)
            if not reply.more:
                pending.done += 1
            if pending.done < pending.expected:
                return
            del self._pending[reply.request_id]
        pending.callback(pending.replies, None)

    def close(self, delete_topics: bool = False) -> None:
        """Flush, stop the reply reader and fail every pending request with ``UnconnectedError``.

        Args:
            delete_topics: Also delete the client's queue and reply topics (a non-durable
                client's, or a durable one's that did not ask to be kept alive).
        """
        with suppress(Exception):
            self._producer.flush(5)
        self._closed.set()
        self._reply_thread.join(5)
        with suppress(Exception):
            self._reply_consumer.close()
        with self._lock:
            pending, self._pending = self._pending, {}
        for p in pending.values():
            p.callback(None, UnconnectedError("the client cache was closed"))
        if delete_topics:
            self.delete_client_topics()
        # librdkafka clients otherwise live until garbage collection, reconnecting to a
        # broker that may be gone.
        close_producer = getattr(self._producer, "close", None)
        if close_producer is not None:
            with suppress(Exception):
                close_producer()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed.is_set()
