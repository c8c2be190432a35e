"""Avro codec for every regionbus wire record (fastavro, schemaless).

Frame: one magic byte ``0xB1``, one type byte (see :data:`TYPE_BYTES`), then the Avro
binary body written with the schema of that type from this folder's ``*.avsc`` files.
The type byte lets a reader with nothing but the bytes (Spark, a dead-letter tool) pick
the schema; the magic byte rejects foreign data early.

Never pickle: values are bytes produced by a declared serializer
(:mod:`regionbus.schemas.serializers`).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import load_schema

from regionbus.schemas.errors import MessageDecodeError, SerializationError
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import (
    Control,
    ControlKind,
    Entry,
    Event,
    EventKind,
    InterestKind,
    InterestResultPolicy,
    InterestSpec,
    Marker,
    Message,
    Operation,
    OperationKind,
    Reply,
)

MAGIC: Final = 0xB1
_SCHEMA_DIR: Final = Path(__file__).parent

TYPE_BYTES: Final[dict[type, int]] = {Operation: 1, Event: 2, Reply: 3, Control: 4, Marker: 5}
BATCH_TYPE: Final = 6
MAX_BATCH_BYTES: Final = 512 * 1024
"""Largest batch :func:`encode_batches` builds (below Kafka's default 1 MiB message)."""
MAX_BATCH_ITEMS: Final = 4096
"""Most framed messages one batch holds: :func:`encode_batches` never builds more, and
:func:`split_batch` refuses more, so a reader's work on one Kafka message (decoding, dead
letters, Redis) is bounded by what a legal writer sends.

A client's ``put_all`` sends one batch per bucket, and all its entries may fall in one
bucket, so this is the largest share of a ``put_all`` that one batch carries (a longer one
travels as several). Byte size alone bounds nothing useful: 512 KiB hold 5,461 puts of an
88-byte operation, or 524,000 empty items. A ``put_all`` entry limit, once documented,
belongs next to this one: a bucket's share of it should fit here."""
_TYPE_NAMES: Final[dict[int, str]] = {
    1: "Operation",
    2: "Event",
    3: "Reply",
    4: "Control",
    5: "Marker",
}


def load_avro_schema(name: str) -> Any:
    """Load and parse ``regionbus.<name>.avsc`` (named references resolved in this folder).

    Args:
        name: Record name, e.g. ``"Event"``.

    Returns:
        The parsed fastavro schema.
    """
    return parse_schema(load_schema(str(_SCHEMA_DIR / f"regionbus.{name}.avsc")))


_SCHEMAS: Final[dict[int, Any]] = {t: load_avro_schema(n) for t, n in _TYPE_NAMES.items()}
_BATCH_SCHEMA: Final = load_avro_schema("Batch")
_EVENT_KINDS: Final = {k.value: k for k in EventKind}
_OPERATION_KINDS: Final = {k.value: k for k in OperationKind}
_INT_MIN: Final = -(2**31)
_INT_MAX: Final = 2**31 - 1


def _int32(value: int, field: str) -> int:
    """``value`` if it fits an Avro ``int``, else ValueError.

    fastavro reads and writes an ``int`` as a variable-length long without a range check, so
    without this a garbled varint decodes into a bucket or site id no peer (nor Spark's
    32-bit column) can hold.
    """
    if not _INT_MIN <= value <= _INT_MAX:
        raise ValueError(f"{field}={value} does not fit an Avro int")
    return value


# --- records <-> dicts ---------------------------------------------------------------


def _eid_to(e: EventID) -> dict[str, Any]:
    return {
        "member": e.member,
        "thread": e.thread,
        "sequence": e.sequence,
        "bucket": _int32(e.bucket, "bucket"),
    }


def _eid_from(d: dict[str, Any]) -> EventID:
    return EventID(d["member"], d["thread"], d["sequence"], _int32(d["bucket"], "bucket"))


def _interest_to(s: InterestSpec) -> dict[str, Any]:
    return {
        "kind": s.kind.value,
        "keys": list(s.keys),
        "regex": s.regex,
        "policy": s.policy.value,
        "durable": s.durable,
        "receive_values": s.receive_values,
    }


def _interest_from(d: dict[str, Any]) -> InterestSpec:
    return InterestSpec(
        kind=InterestKind(d["kind"]),
        keys=tuple(d["keys"]),
        regex=d["regex"],
        policy=InterestResultPolicy(d["policy"]),
        durable=d["durable"],
        receive_values=d["receive_values"],
    )


def _operation_to(o: Operation) -> dict[str, Any]:
    return {
        "request_id": o.request_id,
        "client_id": o.client_id,
        "event_id": _eid_to(o.event_id) if o.event_id is not None else None,
        "kind": o.kind.value,
        "region": o.region,
        "key": o.key,
        "value": o.value,
        "serializer": o.serializer,
        "callback_argument": o.callback_argument,
        "timestamp_ms": o.timestamp_ms,
        "possible_duplicate": o.possible_duplicate,
        "interest": _interest_to(o.interest) if o.interest is not None else None,
        "origin_site_id": _int32(o.origin_site_id, "origin_site_id"),
        "sites_reached": [_int32(s, "sites_reached") for s in o.sites_reached],
        "keep_alive": o.keep_alive,
    }


def _operation_from(d: dict[str, Any]) -> Operation:
    return Operation(
        request_id=d["request_id"],
        client_id=d["client_id"],
        event_id=_eid_from(d["event_id"]) if d["event_id"] is not None else None,
        kind=_OPERATION_KINDS[d["kind"]],
        region=d["region"],
        key=d["key"],
        value=d["value"],
        serializer=d["serializer"],
        callback_argument=d["callback_argument"],
        timestamp_ms=d["timestamp_ms"],
        possible_duplicate=d["possible_duplicate"],
        interest=_interest_from(d["interest"]) if d["interest"] is not None else None,
        origin_site_id=_int32(d["origin_site_id"], "origin_site_id"),
        sites_reached=tuple(_int32(s, "sites_reached") for s in d["sites_reached"]),
        keep_alive=d["keep_alive"],
    )


def _event_to(e: Event) -> dict[str, Any]:
    return {
        "event_id": _eid_to(e.event_id),
        "kind": e.kind.value,
        "region": e.region,
        "key": e.key,
        "value": e.value,
        "serializer": e.serializer,
        "version": e.version,
        "timestamp_ms": e.timestamp_ms,
        "originator": e.originator,
        "possible_duplicate": e.possible_duplicate,
        "callback_argument": e.callback_argument,
        "origin_site_id": _int32(e.origin_site_id, "origin_site_id"),
        "sites_reached": [_int32(s, "sites_reached") for s in e.sites_reached],
        "expiration": e.expiration,
    }


def _event_from(d: dict[str, Any]) -> Event:
    return Event(
        event_id=_eid_from(d["event_id"]),
        kind=_EVENT_KINDS[d["kind"]],
        region=d["region"],
        key=d["key"],
        value=d["value"],
        serializer=d["serializer"],
        version=d["version"],
        timestamp_ms=d["timestamp_ms"],
        originator=d["originator"],
        possible_duplicate=d["possible_duplicate"],
        callback_argument=d["callback_argument"],
        origin_site_id=_int32(d["origin_site_id"], "origin_site_id"),
        sites_reached=tuple(_int32(s, "sites_reached") for s in d["sites_reached"]),
        expiration=d["expiration"],
    )


def _reply_to(r: Reply) -> dict[str, Any]:
    return {
        "request_id": r.request_id,
        "bucket": _int32(r.bucket, "bucket"),
        "ok": r.ok,
        "error_type": r.error_type,
        "error_message": r.error_message,
        "event_kind": r.event_kind.value if r.event_kind is not None else None,
        "duplicate": r.duplicate,
        "found": r.found,
        "version": r.version,
        "value": r.value,
        "serializer": r.serializer,
        "entries": [
            {"key": e.key, "value": e.value, "serializer": e.serializer, "version": e.version}
            for e in r.entries
        ],
        "more": r.more,
        "client_state": r.client_state,
        "subscription_conflation": r.subscription_conflation,
    }


def _reply_from(d: dict[str, Any]) -> Reply:
    return Reply(
        request_id=d["request_id"],
        bucket=_int32(d["bucket"], "bucket"),
        ok=d["ok"],
        error_type=d["error_type"],
        error_message=d["error_message"],
        event_kind=_EVENT_KINDS[d["event_kind"]] if d["event_kind"] is not None else None,
        duplicate=d["duplicate"],
        found=d["found"],
        version=d["version"],
        value=d["value"],
        serializer=d["serializer"],
        entries=tuple(
            Entry(key=e["key"], version=e["version"], value=e["value"], serializer=e["serializer"])
            for e in d["entries"]
        ),
        more=d["more"],
        client_state=d["client_state"],
        subscription_conflation=d["subscription_conflation"],
    )


def _control_to(c: Control) -> dict[str, Any]:
    return {
        "kind": c.kind.value,
        "client_id": c.client_id,
        "durable_client_id": c.durable_client_id,
        "durable_client_timeout_s": _int32(c.durable_client_timeout_s, "durable_client_timeout_s"),
        "keep_alive": c.keep_alive,
        "timestamp_ms": c.timestamp_ms,
        "request_id": c.request_id,
        "connection_id": c.connection_id,
    }


def _control_from(d: dict[str, Any]) -> Control:
    return Control(
        kind=ControlKind(d["kind"]),
        client_id=d["client_id"],
        durable_client_id=d["durable_client_id"],
        durable_client_timeout_s=_int32(d["durable_client_timeout_s"], "durable_client_timeout_s"),
        keep_alive=d["keep_alive"],
        timestamp_ms=d["timestamp_ms"],
        request_id=d["request_id"],
        connection_id=d["connection_id"],
    )


def _marker_to(m: Marker) -> dict[str, Any]:
    return {
        "client_id": m.client_id,
        "timestamp_ms": m.timestamp_ms,
        "bucket": _int32(m.bucket, "bucket"),
        "connection_id": m.connection_id,
    }


def _marker_from(d: dict[str, Any]) -> Marker:
    return Marker(
        client_id=d["client_id"],
        timestamp_ms=d["timestamp_ms"],
        bucket=_int32(d["bucket"], "bucket"),
        connection_id=d["connection_id"],
    )


_TO: Final[dict[int, Callable[[Any], dict[str, Any]]]] = {
    1: _operation_to,
    2: _event_to,
    3: _reply_to,
    4: _control_to,
    5: _marker_to,
}
_FROM: Final[dict[int, Callable[[dict[str, Any]], Any]]] = {
    1: _operation_from,
    2: _event_from,
    3: _reply_from,
    4: _control_from,
    5: _marker_from,
}


# --- public --------------------------------------------------------------------------


def encode(message: Message) -> bytes:
    """Encode one wire record into its framed Avro bytes.

    Args:
        message: An :class:`Operation`, :class:`Event`, :class:`Reply`, :class:`Control`
            or :class:`Marker`.

    Returns:
        ``0xB1``, the type byte, then the Avro body.

    Raises:
        SerializationError: a field does not fit its schema (wrong type, int out of range).
    """
    type_byte = TYPE_BYTES[type(message)]
    buf = io.BytesIO()
    buf.write(bytes((MAGIC, type_byte)))
    try:
        schemaless_writer(buf, _SCHEMAS[type_byte], _TO[type_byte](message))
    except (ValueError, TypeError, AttributeError, KeyError, OverflowError) as exc:
        raise SerializationError(
            f"cannot encode {type(message).__name__}: {exc}", message_ref=message
        ) from exc
    return buf.getvalue()


def decode(data: bytes | None) -> Message:
    """Decode framed bytes into the record they hold.

    Args:
        data: Bytes as read from a regionbus topic.

    Returns:
        The decoded record, of the type named by the frame's type byte.

    Raises:
        MessageDecodeError: the bytes are empty, carry a foreign magic or type byte, are
            truncated, hold a value outside the schema, or have trailing bytes. The raw
            bytes are kept in ``message_ref``.
    """
    type_byte = _check_frame(data)
    assert data is not None
    if type_byte == BATCH_TYPE:
        raise MessageDecodeError("a Batch: split it with split_batch first", message_ref=data)
    schema = _SCHEMAS.get(type_byte)
    if schema is None:
        raise MessageDecodeError(f"unknown message type byte {type_byte}", message_ref=data)
    buf = io.BytesIO(data)
    buf.seek(2)
    try:
        record = schemaless_reader(buf, schema, None)
        if buf.tell() != len(data):
            raise MessageDecodeError(
                f"{len(data) - buf.tell()} trailing bytes after a {_TYPE_NAMES[type_byte]}",
                message_ref=data,
            )
        return _FROM[type_byte](record)  # type: ignore[arg-type]
    except MessageDecodeError:
        raise
    except Exception as exc:  # fastavro raises many types on garbage: all mean "undecodable"
        raise MessageDecodeError(
            f"undecodable {_TYPE_NAMES[type_byte]}: {type(exc).__name__}: {exc}", message_ref=data
        ) from exc


def _check_frame(data: bytes | None) -> int:
    if not data or len(data) < 2:
        raise MessageDecodeError("empty or truncated message", message_ref=data)
    if data[0] != MAGIC:
        raise MessageDecodeError(f"not a regionbus message (magic {data[0]:#x})", message_ref=data)
    return data[1]


def is_batch(data: bytes | None) -> bool:
    """Whether framed bytes hold a :func:`encode_batches` batch."""
    return data is not None and len(data) >= 2 and data[0] == MAGIC and data[1] == BATCH_TYPE


def split_batch(data: bytes | None, max_items: int = MAX_BATCH_ITEMS) -> list[bytes]:
    """The framed messages inside a batch, or ``[data]`` when it is a single message.

    Args:
        data: Bytes as read from a regionbus topic.
        max_items: Most items a batch may hold (:data:`MAX_BATCH_ITEMS`); counted from the
            Avro block headers before anything is decoded.

    Returns:
        The framed messages, in order (not decoded: decode each with :func:`decode`, so one
        broken item does not lose the others).

    Raises:
        MessageDecodeError: a batch frame whose body is not a valid array of messages, or
            that holds more than ``max_items`` (the whole batch is then one bad message).
    """
    if not is_batch(data):
        return [data]  # type: ignore[list-item]
    assert data is not None
    claimed = _batch_items_claimed(data, max_items)
    if claimed > max_items:
        raise MessageDecodeError(
            f"a Batch of more than {max_items} items (at least {claimed}): more than any "
            "regionbus writer puts in one (MAX_BATCH_ITEMS)",
            message_ref=data,
        )
    buf = io.BytesIO(data)
    buf.seek(2)
    try:
        record = schemaless_reader(buf, _BATCH_SCHEMA, None)
    except Exception as exc:  # fastavro raises many types on garbage
        raise MessageDecodeError(
            f"undecodable Batch: {type(exc).__name__}: {exc}", message_ref=data
        ) from exc
    if buf.tell() != len(data):
        raise MessageDecodeError("trailing bytes after a Batch", message_ref=data)
    messages: list[bytes] = record["messages"]  # type: ignore[index,call-overload,assignment]
    return messages


def _batch_items_claimed(data: bytes, max_items: int) -> int:
    """How many items a batch's Avro array says it holds, read from its block headers,
    stopping once past ``max_items``. Malformed bytes end the count early: the decoding
    that follows reports them."""
    total = 0
    position = 2
    try:
        while total <= max_items:
            count, position = _read_long(data, position)
            if count == 0:
                break
            if count < 0:
                # A negative count is followed by the block's size in bytes: skip it whole.
                count = -count
                size, position = _read_long(data, position)
                position += size
            else:
                for _ in range(min(count, max_items + 1 - total)):
                    length, position = _read_long(data, position)
                    position += length
            total += count
    except (IndexError, ValueError):
        pass
    return total


def _read_long(data: bytes, position: int) -> tuple[int, int]:
    """One Avro long (zig-zag varint) at ``position``: its value and the next position.

    Raises:
        IndexError: the bytes end inside it.
        ValueError: longer than 64 bits.
    """
    shift = result = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 64 bits")


def encode_batches(
    framed: list[bytes], max_bytes: int = MAX_BATCH_BYTES, max_items: int = MAX_BATCH_ITEMS
) -> list[bytes]:
    """Pack framed messages into as few Kafka messages as fit ``max_bytes`` and
    ``max_items`` each.

    A single message is returned as it is (no batch frame); one larger than ``max_bytes``
    travels alone.

    Args:
        framed: Messages from :func:`encode`, in order.
        max_bytes: Largest batch, in bytes.
        max_items: Most messages in one batch (:data:`MAX_BATCH_ITEMS`).

    Returns:
        The Kafka message values, in order.
    """
    out: list[bytes] = []
    group: list[bytes] = []
    size = 0
    for item in framed:
        if group and (size + len(item) + 8 > max_bytes or len(group) >= max_items):
            out.append(_pack(group))
            group, size = [], 0
        group.append(item)
        size += len(item) + 8
    if group:
        out.append(_pack(group))
    return out


def _pack(group: list[bytes]) -> bytes:
    if len(group) == 1:
        return group[0]
    buf = io.BytesIO()
    buf.write(bytes((MAGIC, BATCH_TYPE)))
    schemaless_writer(buf, _BATCH_SCHEMA, {"messages": group})
    return buf.getvalue()


T = TypeVar("T", Operation, Event, Reply, Control, Marker)


def decode_as(data: bytes | None, expected: type[T]) -> T:
    """Decode bytes that must hold one given record type.

    Args:
        data: Bytes as read from a regionbus topic.
        expected: The record class the topic carries.

    Returns:
        The decoded record.

    Raises:
        MessageDecodeError: as :func:`decode`, or the bytes hold another record type.
    """
    message = decode(data)
    if not isinstance(message, expected):
        raise MessageDecodeError(
            f"expected {expected.__name__}, got {type(message).__name__}", message_ref=data
        )
    return message


def decode_items(data: bytes | None, expected: type[T]) -> tuple[list[T], list[str]]:
    """Decode every item of a message (a batch, or one record) that must hold records of one
    type, keeping what decodes as it.

    Args:
        data: Bytes as read from a regionbus topic.
        expected: The record class the topic carries.

    Returns:
        The records, in order, and why each other item was set aside (one reason per item;
        one for the whole value when it is not even a valid batch).
    """
    try:
        items = split_batch(data)
    except MessageDecodeError as exc:
        return [], [str(exc)]
    records: list[T] = []
    refused: list[str] = []
    for raw in items:
        try:
            records.append(decode_as(raw, expected))
        except MessageDecodeError as exc:
            refused.append(str(exc))
    return records, refused
