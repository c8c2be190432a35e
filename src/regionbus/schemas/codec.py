"""Avro codec for every regionbus wire record (fastavro, schemaless).

Frame: one magic byte ``0xB1``, one type byte (see :data:`TYPE_BYTES`), then the Avro
binary body written with the schema of that type from this folder's ``*.avsc`` files.
The type byte lets a reader with nothing but the bytes (Spark, a dead-letter tool) pick
the schema; the magic byte rejects foreign data early. The records' Avro dicts are
:mod:`regionbus.schemas.wire_records`'.

The other framing, written where a setting asks for it (:data:`Framing`), is Apache Avro's
*single-object encoding* (Avro specification, "Single-object encoding"): ``C3 01``, the
schema's 8-byte CRC-64-AVRO fingerprint (little-endian, of its Parsing Canonical Form),
then the same body, which Avro's standard decoders read (Java's
``org.apache.avro.message.BinaryMessageDecoder``). Every reader here takes both framings
(:func:`regionbus_frame`), so writers may switch one at a time.

Never pickle: values are bytes produced by a declared serializer
(:mod:`regionbus.schemas.serializers`).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form

from regionbus.schemas.errors import MessageDecodeError, SerializationError
from regionbus.schemas.event_reader import EVENT_FINGERPRINT, KINDS, read_event
from regionbus.schemas.messages import (
    Control,
    CqEvent,
    Event,
    Marker,
    Message,
    Operation,
    Reply,
)
from regionbus.schemas.wire_records import FROM_AVRO, TO_AVRO

MAGIC: Final = 0xB1
_SCHEMA_DIR: Final = Path(__file__).parent

TYPE_BYTES: Final[dict[type, int]] = {
    Operation: 1,
    Event: 2,
    Reply: 3,
    Control: 4,
    Marker: 5,
    CqEvent: 7,
}
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
    7: "CqEvent",
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
_CLASSES: Final = {t: cls for cls, t in TYPE_BYTES.items()}

Framing = Literal["regionbus", "avro-single-object"]
"""How a record is framed: ``regionbus`` (``0xB1``, a type byte; the default) or
``avro-single-object`` (Avro's single-object encoding, for standard Avro tools)."""
SINGLE_OBJECT_MARKER: Final = b"\xc3\x01"
"""The first two bytes of an Avro single-object encoding."""
_SINGLE_OBJECT_HEADER_BYTES: Final = 10


def schema_fingerprint(name: str) -> bytes:
    """The 8-byte CRC-64-AVRO fingerprint of ``regionbus.<name>.avsc``'s Parsing Canonical
    Form, in the little-endian order of Avro's single-object encoding."""
    canonical = to_parsing_canonical_form(load_schema(str(_SCHEMA_DIR / f"regionbus.{name}.avsc")))
    return bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))


_FINGERPRINTS: Final[dict[int, bytes]] = {
    t: schema_fingerprint(n) for t, n in {**_TYPE_NAMES, BATCH_TYPE: "Batch"}.items()
}
_TYPE_OF_FINGERPRINT: Final[dict[bytes, int]] = {f: t for t, f in _FINGERPRINTS.items()}
_EVENT_TYPE: Final = TYPE_BYTES[Event]
_EVENT_KIND_SYMBOLS: Final = load_avro_schema("EventKind")["symbols"]
EVENT_READER_ON: Final = _FINGERPRINTS[_EVENT_TYPE] == EVENT_FINGERPRINT and [
    k.value for k in KINDS
] == list(_EVENT_KIND_SYMBOLS)
"""Whether :func:`decode` reads Events with `regionbus.schemas.event_reader` (written for
today's Event schema) before fastavro: only while the schema is the one it was written for."""


def regionbus_frame(data: bytes | None) -> bytes | None:
    """The regionbus frame of a record in either framing: an Avro single-object encoding of
    a regionbus schema becomes ``0xB1``, its type byte and the same body; anything else is
    returned as it is (its checks are the decoder's).

    Raises:
        MessageDecodeError: a single-object encoding of a schema regionbus does not have.
    """
    if not data or data[0] != SINGLE_OBJECT_MARKER[0] or data[:2] != SINGLE_OBJECT_MARKER:
        return data
    type_byte = _TYPE_OF_FINGERPRINT.get(data[2:_SINGLE_OBJECT_HEADER_BYTES])
    if type_byte is None or len(data) < _SINGLE_OBJECT_HEADER_BYTES:
        raise MessageDecodeError(
            f"an Avro single-object encoding of no regionbus schema (fingerprint "
            f"{data[2:_SINGLE_OBJECT_HEADER_BYTES].hex()})",
            message_ref=data,
        )
    return bytes((MAGIC, type_byte)) + data[_SINGLE_OBJECT_HEADER_BYTES:]


def _reframed(framed: bytes, framing: Framing) -> bytes:
    """A regionbus frame in ``framing``."""
    if framing == "regionbus":
        return framed
    return SINGLE_OBJECT_MARKER + _FINGERPRINTS[framed[1]] + framed[2:]


# --- public --------------------------------------------------------------------------


def encode(message: Message, framing: Framing = "regionbus") -> bytes:
    """Encode one wire record into its framed Avro bytes.

    Args:
        message: An :class:`Operation`, :class:`Event`, :class:`Reply`, :class:`Control`,
            :class:`Marker` or :class:`CqEvent`.
        framing: ``regionbus`` or ``avro-single-object`` (:data:`Framing`).

    Returns:
        ``0xB1``, the type byte, then the Avro body (or ``C3 01``, the schema's
        fingerprint, then the body).

    Raises:
        SerializationError: a field does not fit its schema (wrong type, int out of range).
    """
    type_byte = TYPE_BYTES[type(message)]
    buf = io.BytesIO()
    buf.write(bytes((MAGIC, type_byte)))
    try:
        schemaless_writer(buf, _SCHEMAS[type_byte], TO_AVRO[type(message)](message))
    except (ValueError, TypeError, AttributeError, KeyError, OverflowError) as exc:
        raise SerializationError(
            f"cannot encode {type(message).__name__}: {exc}", message_ref=message
        ) from exc
    return _reframed(buf.getvalue(), framing)


def decode(data: bytes | None) -> Message:
    """Decode framed bytes into the record they hold.

    Args:
        data: Bytes as read from a regionbus topic, in either framing.

    Returns:
        The decoded record, of the type named by the frame's type byte (or fingerprint).

    Raises:
        MessageDecodeError: the bytes are empty, carry a foreign magic or type byte (or
            fingerprint), are truncated, hold a value outside the schema, or have trailing
            bytes. The raw bytes are kept in ``message_ref``.
    """
    data = regionbus_frame(data)
    type_byte = _check_frame(data)
    assert data is not None
    if type_byte == _EVENT_TYPE and EVENT_READER_ON:
        # Most records decoded are events (a subscriber's, a replay's): read those without
        # fastavro's walk of the schema; what the reader does not take, fastavro decodes.
        event = read_event(data)
        if event is not None:
            return event
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
        return FROM_AVRO[_CLASSES[type_byte]](record)  # type: ignore[arg-type]
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
    """Whether framed bytes (either framing) hold a :func:`encode_batches` batch."""
    if data is not None and data[:2] == SINGLE_OBJECT_MARKER:
        return data[2:_SINGLE_OBJECT_HEADER_BYTES] == _FINGERPRINTS[BATCH_TYPE]
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
    data = regionbus_frame(data)
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
    framed: list[bytes],
    max_bytes: int = MAX_BATCH_BYTES,
    max_items: int = MAX_BATCH_ITEMS,
    framing: Framing = "regionbus",
) -> list[bytes]:
    """Pack framed messages into as few Kafka messages as fit ``max_bytes`` and
    ``max_items`` each.

    A single message is returned as it is (no batch frame); one larger than ``max_bytes``
    travels alone.

    Args:
        framed: Messages from :func:`encode`, in order.
        max_bytes: Largest batch, in bytes.
        max_items: Most messages in one batch (:data:`MAX_BATCH_ITEMS`).
        framing: The framing of the batches made (:data:`Framing`; the items keep theirs).

    Returns:
        The Kafka message values, in order.
    """
    out: list[bytes] = []
    group: list[bytes] = []
    size = 0
    for item in framed:
        if group and (size + len(item) + 8 > max_bytes or len(group) >= max_items):
            out.append(_pack(group, framing))
            group, size = [], 0
        group.append(item)
        size += len(item) + 8
    if group:
        out.append(_pack(group, framing))
    return out


def _pack(group: list[bytes], framing: Framing) -> bytes:
    if len(group) == 1:
        return group[0]
    buf = io.BytesIO()
    buf.write(bytes((MAGIC, BATCH_TYPE)))
    schemaless_writer(buf, _BATCH_SCHEMA, {"messages": group})
    return _reframed(buf.getvalue(), framing)


T = TypeVar("T", Operation, Event, Reply, Control, Marker, CqEvent)


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
