"""The front door of a cache server's operations: one polled Kafka message to its handler.

A message from ``{ns}.ops`` (or a lifecycle message from ``{ns}.control``) is checked at
the front door when security is on (:mod:`regionbus.broker.admission`), split into the items of its
batch, each decoded, authorized, validated (:mod:`regionbus.broker.validation`) and handed to the
handler of its kind (:mod:`regionbus.broker.handlers`) or to the client lifecycle. What cannot be
processed is dead-lettered with its reason (invariant 6), and an item whose handling raised
anything but an infrastructure error is set aside (:mod:`regionbus.broker.poison`) so the items
after
it still run. The server's loop (:mod:`regionbus.broker.server`) decides which messages come here.
"""

from __future__ import annotations

import logging
from typing import Final, NamedTuple

from confluent_kafka import Message as KafkaMessage

from regionbus.broker.admission import Admission
from regionbus.broker.client_lifecycle import LIFECYCLE_BUCKET, ClientLifecycle
from regionbus.broker.config import ServerSettings
from regionbus.broker.entry_ops import EntryOperations
from regionbus.broker.handlers import OperationHandlers
from regionbus.broker.outbox import Outbox
from regionbus.broker.pacing import ConnectAdmission
from regionbus.broker.poison import is_infrastructure_error, set_aside
from regionbus.broker.principals import Principal
from regionbus.broker.validation import validate
from regionbus.schemas.codec import decode, split_batch
from regionbus.schemas.dead_letter import Source
from regionbus.schemas.errors import (
    ConfigurationError,
    MessageDecodeError,
    RegionBusError,
    TransportError,
)
from regionbus.schemas.messages import Control, ControlKind, Operation
from regionbus.schemas.naming import Topics, check_name

log = logging.getLogger("regionbus.server")

ITEMS_HEADER: Final = "rb.items"
"""Of a dead letter that is a whole batch: the indexes of the items set aside in it."""

_REASONS_SHOWN: Final = 3
_ITEMS_HEADER_MAX_CHARS: Final = 1000


class _Rejected(NamedTuple):
    """An item of a message dead-lettered without a reply."""

    position: int
    raw: bytes
    reason: str
    category: str


class OperationIntake:
    """Takes one polled message at a time to where its items go.

    Args:
        settings: The server's settings (validation limits).
        topics: The namespace's topic names (which topic carries lifecycle messages).
        outbox: Where dead letters and error replies go.
        lifecycle: Receives lifecycle (``Control``) messages and notes each client seen.
        entries: The batch of entry changes; applied before an error reply, so replies
            keep the order of the operations.
        handlers: The handler table, by operation kind.
        admission: The front-door checks when security is on, else None.
    """

    def __init__(
        self,
        settings: ServerSettings,
        topics: Topics,
        outbox: Outbox,
        lifecycle: ClientLifecycle,
        entries: EntryOperations,
        handlers: OperationHandlers,
        admission: Admission | None,
    ) -> None:
        self._settings = settings
        self._topics = topics
        self._outbox = outbox
        self._lifecycle = lifecycle
        self._entries = entries
        self._handlers = handlers
        self._admission = admission
        self.connects = ConnectAdmission(
            self._admit_connect,
            settings.connects_admitted_per_s,
            settings.connect_burst,
            settings.connects_queued_max,
        )
        """Connects admitted at a bounded rate, the rest waiting for later turns."""

    def message(self, message: KafkaMessage, source: Source) -> None:
        """Process every item of one polled message, in order.

        Args:
            message: A message of ``{ns}.ops`` or ``{ns}.control`` (no error set).
            source: Its topic, partition (the bucket) and offset.

        Raises:
            Exception: only infrastructure errors (Kafka, Redis): anything else an item
                raises is set aside and the next item runs.
        """
        principal = None
        if self._admission is not None:
            principal = self._admission.authenticate(message, source)
            if principal is None:
                return
        if self._entries.latency is not None:
            self._entries.latency.reading(message)
        tracing = self._entries.tracing
        if tracing is not None:
            tracing.reading(message)
        value = message.value()
        try:
            items = split_batch(value)
        except MessageDecodeError as exc:
            self._outbox.dead_letter(value, source, str(exc), category="undecodable")
            return
        rejected: list[_Rejected] = []
        for index, raw in enumerate(items):
            if tracing is not None:
                tracing.item = index
            try:
                reason = self._one(raw, source, principal)
            except Exception as exc:
                # One bad item of a batch must not take the items after it along.
                if is_infrastructure_error(exc):
                    raise
                set_aside(self._outbox, raw, source, exc)
                continue
            if reason is not None:
                rejected.append(_Rejected(index, raw, *reason))
        if rejected:
            self._dead_letter_rejected(value, len(items), rejected, source)

    def _admit_connect(self, control: Control) -> None:
        """An admitted connect, handled by the client lifecycle; dropped when this server
        no longer reads ``{ns}.control`` (the client resends it to the new reader).
        Outside the handling of its message, a failure other than Kafka's or Redis's is
        logged rather than set aside (the client resends an unanswered connect)."""
        if not self._handlers.owns(LIFECYCLE_BUCKET):
            return
        try:
            self._lifecycle.control(control)
        except Exception as exc:
            if is_infrastructure_error(exc):
                raise
            log.exception("connect of %s failed", control.client_id)

    def _dead_letter_rejected(
        self, value: bytes | None, items: int, rejected: list[_Rejected], source: Source
    ) -> None:
        """Dead-letter the items of one message that no sender can be told about: one item
        alone, several as the whole message once (a batch of garbage costs one dead letter,
        not one per item), naming the items in ``rb.items``."""
        first = rejected[0]
        if len(rejected) == 1:
            self._outbox.dead_letter(first.raw, source, first.reason, category=first.category)
            return
        shown = "; ".join(f"item {r.position}: {r.reason}" for r in rejected[:_REASONS_SHOWN])
        indexes = ",".join(str(r.position) for r in rejected)
        self._outbox.dead_letter(
            value,
            source,
            f"{len(rejected)} of {items} items set aside: {shown}",
            [(ITEMS_HEADER, indexes[:_ITEMS_HEADER_MAX_CHARS].encode())],
            category=first.category,
        )

    def _one(
        self, raw: bytes, source: Source, principal: Principal | None
    ) -> tuple[str, str] | None:
        """Process one item; ``(reason, category)`` when it is to be dead-lettered and no
        one told (undecodable, a client id no topic can hold, the wrong record type)."""
        outbox = self._outbox
        try:
            decoded = decode(raw)
            if isinstance(decoded, Operation | Control):
                # Replies and queues are addressed by client id in topics named after its
                # Kafka principal: a name no topic can hold would fail the reply after the
                # apply, killing the loop.
                check_name("client id", decoded.client_id)
                if decoded.kafka_principal is not None:
                    check_name("Kafka principal", decoded.kafka_principal)
        except MessageDecodeError as exc:
            return str(exc), "undecodable"
        except ConfigurationError as exc:
            return str(exc), "invalid_operation"
        admission = self._admission
        if admission and principal and not admission.authorize(decoded, raw, source, principal):
            return None
        expected = Control if source.topic == self._topics.control else Operation
        if not isinstance(decoded, expected):
            return f"expected {expected.__name__}, got {type(decoded).__name__}", "unexpected_type"
        if isinstance(decoded, Control):
            if decoded.kind is ControlKind.CONNECT:
                self.connects.connect(decoded)
            else:
                self._lifecycle.control(decoded)
            return None
        op = decoded
        assert isinstance(op, Operation)
        bucket, offset = source.partition, source.offset
        self._lifecycle.seen(op.client_id)
        try:
            validate(op, bucket, self._settings)
        except RegionBusError as exc:
            self._entries.apply()
            outbox.dead_letter(raw, source, str(exc), category="invalid_operation")
            outbox.reply_error(op, bucket, exc)
            return None
        try:
            self._handlers.handle(op, bucket, offset)
        except TransportError:
            raise
        except RegionBusError as exc:
            outbox.reply_error(op, bucket, exc)
        return None


__all__ = ["ITEMS_HEADER", "OperationIntake"]
