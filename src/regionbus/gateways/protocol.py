"""The wire records between a gateway sender and a gateway receiver, and their topics.

A sender produces a :class:`GatewayBatch` to the receiver's inbound topic
``{remote ns}.gwr.<receiver id>`` on the remote site's Kafka; the receiver answers with a
:class:`GatewayAck` on the topic the batch names (``{remote ns}.gwack.<site>.<sender>``,
also on the remote Kafka), so a sender needs to reach one Kafka: the remote one.

Framing as :mod:`regionbus.schemas.codec` (magic byte ``0xB1``, then a type byte) with type bytes
``0x20`` (batch) and ``0x21`` (ack), private to gateways; the batch's events are framed
:class:`regionbus.schemas.messages.Event` records, decodable by anyone.
"""

from __future__ import annotations

import io
from typing import Any, Final, NamedTuple

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from regionbus.schemas.codec import MAGIC
from regionbus.schemas.errors import MessageDecodeError

BATCH_TYPE: Final = 0x20
ACK_TYPE: Final = 0x21
_INT_RANGE: Final = range(-(2**31), 2**31)
_INT_FIELDS: Final = {BATCH_TYPE: ("site_id",), ACK_TYPE: ("events_received",)}
_LONG_RANGE: Final = range(-(2**63), 2**63)
_LONG_FIELDS: Final = {BATCH_TYPE: ("sequence", "acked_through"), ACK_TYPE: ()}

_BATCH_SCHEMA: Final = parse_schema(
    {
        "type": "record",
        "name": "GatewayBatch",
        "namespace": "regionbus.gateways",
        "doc": "One batch of queued events from a gateway sender.",
        "fields": [
            {"name": "batch_id", "type": "string"},
            {"name": "sender_id", "type": "string"},
            {"name": "site_id", "type": "int"},
            {"name": "ack_topic", "type": "string"},
            {"name": "possible_duplicate", "type": "boolean"},
            {"name": "events", "type": {"type": "array", "items": "bytes"}},
            {"name": "parallel", "type": "boolean", "default": False},
            {"name": "sequence", "type": "long", "default": 0},
            {"name": "acked_through", "type": "long", "default": 0},
        ],
    }
)
_ACK_SCHEMA: Final = parse_schema(
    {
        "type": "record",
        "name": "GatewayAck",
        "namespace": "regionbus.gateways",
        "doc": "A receiver's reply to one batch, with the events it failed.",
        "fields": [
            {"name": "batch_id", "type": "string"},
            {"name": "receiver_id", "type": "string"},
            {"name": "events_received", "type": "int"},
            {
                "name": "exceptions",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "BatchEventException",
                        "fields": [
                            {"name": "event_index", "type": "int"},
                            {"name": "event_id", "type": "string"},
                            {"name": "error_type", "type": "string"},
                            {"name": "message", "type": "string"},
                        ],
                    },
                },
            },
        ],
    }
)


class GatewayBatch(NamedTuple):
    """A batch as sent.

    Attributes:
        batch_id: Unique per sender run and batch (``"<run>-<n>"``); a resend keeps it.
        sender_id: The sending gateway sender's id.
        site_id: The sending site's ``distributed_system_id``.
        ack_topic: Where the receiver must put the ack (on its own Kafka).
        possible_duplicate: True for a resend after no ack.
        events: Framed :class:`regionbus.schemas.messages.Event` records, in queue order.
        parallel: Order per bucket is all the batch needs: the sender's queue is parallel
            (one partition per bucket), or serial but split by key or bucket over several
            dispatchers (``order_policy`` KEY or PARTITION, where Geode's dispatchers
            deliver concurrently, so only a key's order holds across them). The receiver
            then sends all of it at once. False: it applies the events one after the
            other in queue order (Geode ``GatewayReceiverCommand`` applies a batch's
            events in order).
        sequence: Position of the batch in its sender run (``"<run>-<n>"``: n, from 1);
            0 for a sender that does not number its batches. With several batches in
            flight, the receiver applies batch n only after batch n-1 (a batch lost on
            the way makes it wait for the sender's resend, never apply a later one first).
        acked_through: Sequence of the last batch of the run the sender had an ack for,
            with every one before it, when it sent this one: the receiver may apply this
            batch if it applied ``sequence - 1`` itself or the sender says it was acked
            (after a receiver restart, a resend).
    """

    batch_id: str
    sender_id: str
    site_id: int
    ack_topic: str
    possible_duplicate: bool
    events: tuple[bytes, ...]
    parallel: bool = False
    sequence: int = 0
    acked_through: int = 0

    @property
    def run_id(self) -> str:
        """The sender run the batch belongs to (``batch_id`` up to its last ``-``)."""
        return self.batch_id.rpartition("-")[0]


class BatchEventException(NamedTuple):
    """One event of a batch the receiver could not apply.

    Attributes:
        event_index: Position of the event in the batch.
        event_id: Its EventID as text.
        error_type: Error class name (e.g. ``"CacheWriterError"``).
        message: Error message.
    """

    event_index: int
    event_id: str
    error_type: str
    message: str


class GatewayAck(NamedTuple):
    """The receiver's ack of one batch.

    Attributes:
        batch_id: The acked batch.
        receiver_id: The receiver that applied it.
        events_received: Events in the batch.
        exceptions: The events that failed; every other event was applied (or recognised
            as a duplicate, or refused by conflict resolution).
    """

    batch_id: str
    receiver_id: str
    events_received: int
    exceptions: tuple[BatchEventException, ...] = ()

    @property
    def last_successful_index(self) -> int:
        """Index of the last event applied before the first failure (-1 if the first
        failed; docs/behaviour.md §6); ``events_received - 1`` without failure."""
        if not self.exceptions:
            return self.events_received - 1
        return min(e.event_index for e in self.exceptions) - 1


def _write(type_byte: int, schema: Any, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    buf.write(bytes((MAGIC, type_byte)))
    schemaless_writer(buf, schema, record)
    return buf.getvalue()


def _read(data: bytes | None, type_byte: int, schema: Any, name: str) -> dict[str, Any]:
    if not data or len(data) < 2 or data[0] != MAGIC or data[1] != type_byte:
        raise MessageDecodeError(f"not a {name}", message_ref=data)
    buf = io.BytesIO(data)
    buf.seek(2)
    try:
        record: dict[str, Any] = schemaless_reader(buf, schema, None)  # type: ignore[assignment]
    except Exception as exc:  # fastavro raises many types on garbage: all mean "undecodable"
        raise MessageDecodeError(f"undecodable {name}: {exc}", message_ref=data) from exc
    if buf.tell() != len(data):
        raise MessageDecodeError(f"trailing bytes after a {name}", message_ref=data)
    # fastavro reads an Avro int as a long without a range check: a garbled varint would
    # otherwise pass as a site id or event index no peer can encode.
    ints = [(f, record[f]) for f in _INT_FIELDS[type_byte]]
    ints += [("event_index", e["event_index"]) for e in record.get("exceptions", ())]
    for field, value in ints:
        if value not in _INT_RANGE:
            raise MessageDecodeError(
                f"{name}.{field}={value} does not fit an Avro int", message_ref=data
            )
    for field in _LONG_FIELDS[type_byte]:
        if record[field] not in _LONG_RANGE:
            raise MessageDecodeError(
                f"{name}.{field}={record[field]} does not fit an Avro long", message_ref=data
            )
    return record


def encode_batch(batch: GatewayBatch) -> bytes:
    """Encode a batch (framed Avro)."""
    record = batch._asdict()
    record["events"] = list(batch.events)
    return _write(BATCH_TYPE, _BATCH_SCHEMA, record)


def decode_batch(data: bytes | None) -> GatewayBatch:
    """Decode a batch.

    Raises:
        MessageDecodeError: the bytes are not a valid gateway batch.
    """
    record = _read(data, BATCH_TYPE, _BATCH_SCHEMA, "GatewayBatch")
    record["events"] = tuple(record["events"])
    return GatewayBatch(**record)


def encode_ack(ack: GatewayAck) -> bytes:
    """Encode an ack (framed Avro)."""
    record = ack._asdict()
    record["exceptions"] = [e._asdict() for e in ack.exceptions]
    return _write(ACK_TYPE, _ACK_SCHEMA, record)


def decode_ack(data: bytes | None) -> GatewayAck:
    """Decode an ack.

    Raises:
        MessageDecodeError: the bytes are not a valid gateway ack.
    """
    record = _read(data, ACK_TYPE, _ACK_SCHEMA, "GatewayAck")
    record["exceptions"] = tuple(BatchEventException(**e) for e in record["exceptions"])
    return GatewayAck(**record)


__all__ = [
    "BatchEventException",
    "GatewayAck",
    "GatewayBatch",
    "decode_ack",
    "decode_batch",
    "encode_ack",
    "encode_batch",
]
