"""A reader of ``regionbus.Event`` Avro bodies written for the one schema, for speed.

Why: a durable client replays its whole backlog through ``codec.decode``, and a profile of
the replay put fastavro's ``schemaless_reader`` (which walks the parsed schema, field by
field, for every record, then builds a dict that `regionbus.schemas.wire_records` turns
into an :class:`Event`) at 40 % of the subscription thread and about twice the time a raw
Kafka consumer spends per event in all. Reading the same bytes straight into the
NamedTuples, with the field order fixed here, takes about a third of that.

The frames stay Avro, byte for byte: this only reads them. It reads a strict subset of
what fastavro reads, with the same result (the int range checks of ``wire_records``
included), and gives up (None) on anything else: a long of 10 bytes, an array written in
sized blocks, a boolean byte other than 0 or 1, an enum index past the symbols, a union
branch other than null-then-value, bytes left over. ``codec.decode`` then decodes the body
with fastavro, which decodes it or reports what is wrong with it as before.

The layout is tied to the schema's Parsing Canonical Form fingerprint,
:data:`EVENT_FINGERPRINT`: ``codec`` uses this reader only while ``regionbus.Event.avsc``
has that fingerprint (a changed schema falls back to fastavro, and a unit test fails until
this reader is brought along).
"""

from __future__ import annotations

from typing import Final

from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import Event, EventKind

EVENT_FINGERPRINT: Final = bytes.fromhex("6b682b2c559f15af")
"""CRC-64-AVRO fingerprint (single-object byte order) of the ``regionbus.Event`` schema,
``EventID`` and ``EventKind`` inlined, that this reader is written for."""

KINDS: Final = tuple(EventKind)
"""The ``EventKind`` symbols by enum index: ``codec`` checks they are the schema's, in its
order."""
_INT_MIN: Final = -(2**31)
_INT_MAX: Final = 2**31 - 1
_new = tuple.__new__
_DEFAULT_TAIL: Final = bytes(6)
"""The last six fields at their defaults (not a possible duplicate, no callback argument,
site 0, no sites reached, not an expiration, not a load): six zero bytes."""


class _UnreadError(Exception):
    """The body is outside what this reader takes: fastavro's turn."""


def _long_rest(data: bytes, position: int, result: int) -> tuple[int, int]:
    """The rest of a varint whose first byte (its low 7 bits in ``result``) had the
    continuation bit: the zig-zag decoded value and the next position."""
    byte = data[position]
    if byte < 0x80:  # two bytes: a value length, a sequence, a version
        result |= byte << 7
        return (result >> 1) ^ -(result & 1), position + 1
    result |= (byte & 0x7F) << 7
    shift = 14
    position += 1
    while shift < 63:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7
    raise _UnreadError  # 10 bytes or more: fastavro's rules for those are not repeated here


def _long(data: bytes, position: int) -> tuple[int, int]:
    byte = data[position]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), position + 1
    return _long_rest(data, position + 1, byte & 0x7F)


def _int(data: bytes, position: int) -> tuple[int, int]:
    value, position = _long(data, position)
    if not _INT_MIN <= value <= _INT_MAX:
        raise _UnreadError
    return value, position


def _bytes(data: bytes, position: int) -> tuple[bytes, int]:
    length, position = _long(data, position)
    end = position + length
    if length < 0 or end > len(data):
        raise _UnreadError
    return data[position:end], end


def _string(data: bytes, position: int) -> tuple[str, int]:
    length = data[position]
    if length < 0x80 and not length & 1:  # a length below 64, the common case
        end = position + 1 + (length >> 1)
        # A slice past the end is short, not an error: read_event's final position check
        # refuses it.
        return data[position + 1 : end].decode(), end  # strict UTF-8, as fastavro's default
    length, position = _long(data, position)
    end = position + length
    if length < 0 or end > len(data):
        raise _UnreadError
    return data[position:end].decode(), end


def _optional_string(data: bytes, position: int) -> tuple[str | None, int]:
    branch = data[position]
    if branch == 0:
        return None, position + 1
    if branch != 2:  # zig-zag 1: the second branch
        raise _UnreadError
    return _string(data, position + 1)


def _optional_bytes(data: bytes, position: int) -> tuple[bytes | None, int]:
    branch = data[position]
    if branch == 0:
        return None, position + 1
    if branch != 2:
        raise _UnreadError
    return _bytes(data, position + 1)


def _boolean(data: bytes, position: int) -> tuple[bool, int]:
    byte = data[position]
    if byte > 1:
        raise _UnreadError
    return byte == 1, position + 1


def _int_array(data: bytes, position: int) -> tuple[tuple[int, ...], int]:
    count = data[position]
    if count == 0:  # nearly always: an event no gateway has carried
        return (), position + 1
    items: list[int] = []
    count, position = _long(data, position)
    while count:
        if count < 0:
            raise _UnreadError  # a sized block
        for _ in range(count):
            value, position = _int(data, position)
            items.append(value)
        count, position = _long(data, position)
    return tuple(items), position


def read_event(data: bytes, position: int = 2) -> Event | None:
    """The :class:`Event` whose Avro body starts at ``position`` and ends with ``data``.

    Args:
        data: A framed Event (``0xB1``, type byte 2, body); the frame is not checked here.
        position: Where the body starts.

    Returns:
        The event, equal to what fastavro and ``wire_records`` make of the same bytes; None
        when the body is outside what this reader takes (see the module's description),
        for ``codec.decode`` to decode it with fastavro or report it.
    """
    try:
        member, position = _string(data, position)
        thread, position = _long(data, position)
        sequence, position = _long(data, position)
        bucket, position = _int(data, position)
        kind_index, position = _long(data, position)
        if not 0 <= kind_index < len(KINDS):
            return None
        region, position = _string(data, position)
        key, position = _optional_string(data, position)
        value, position = _optional_bytes(data, position)
        serializer, position = _optional_string(data, position)
        version, position = _long(data, position)
        timestamp_ms, position = _long(data, position)
        originator, position = _string(data, position)
        if data[position:] == _DEFAULT_TAIL:  # nearly every event: no byte-by-byte reading
            possible_duplicate, callback_argument, origin_site_id = False, None, 0
            sites_reached: tuple[int, ...] = ()
            expiration = load = False
            position = len(data)
        else:
            possible_duplicate, position = _boolean(data, position)
            callback_argument, position = _optional_bytes(data, position)
            origin_site_id, position = _int(data, position)
            sites_reached, position = _int_array(data, position)
            expiration, position = _boolean(data, position)
            load, position = _boolean(data, position)
    except (_UnreadError, IndexError, UnicodeDecodeError):
        return None
    if position != len(data):
        return None
    # tuple.__new__ with the fields in declaration order: the NamedTuples' own __new__
    # takes keywords and defaults, which cost more than the reading above.
    return _new(
        Event,
        (
            _new(EventID, (member, thread, sequence, bucket)),
            KINDS[kind_index],
            region,
            version,
            timestamp_ms,
            originator,
            key,
            value,
            serializer,
            possible_duplicate,
            callback_argument,
            origin_site_id,
            sites_reached,
            expiration,
            load,
        ),
    )


__all__ = ["EVENT_FINGERPRINT", "KINDS", "read_event"]
