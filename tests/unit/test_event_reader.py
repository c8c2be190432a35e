"""The Event reader written for speed (`regionbus.schemas.event_reader`) against fastavro.

Oracle: fastavro's ``schemaless_reader`` and ``wire_records``' dict-to-Event, the path
``codec.decode`` took for every Event before. For any Event, and for any valid frame broken
one way, the reader gives what that path gives, or None where the path raises or where the
reader leaves the bytes to it.
"""

from __future__ import annotations

import io

from fastavro import schemaless_reader
from hypothesis import example, given, settings

from regionbus.schemas import codec
from regionbus.schemas.codec import TYPE_BYTES, decode, encode, load_avro_schema
from regionbus.schemas.event_reader import read_event
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import Event, EventKind
from regionbus.schemas.wire_records import FROM_AVRO
from tests.unit.test_codec_properties import EVENTS, _zigzag_varint, broken_frames

_EVENT_SCHEMA = load_avro_schema("Event")


def _fastavro_event(data: bytes) -> Event | None:
    """What fastavro and ``wire_records`` make of a framed Event's body (None: refused)."""
    buf = io.BytesIO(data)
    buf.seek(2)
    try:
        record = schemaless_reader(buf, _EVENT_SCHEMA, None)
        if buf.tell() != len(data):
            return None
        event: Event = FROM_AVRO[Event](record)
    except Exception:  # fastavro raises many types on garbage; decode maps them all
        return None
    return event


def test_the_reader_is_on_for_todays_event_schema() -> None:
    """A changed Event schema turns the reader off (fastavro decodes alone): update
    ``event_reader`` to the new schema and its ``EVENT_FINGERPRINT``."""
    assert codec.EVENT_READER_ON


@settings(max_examples=300)
@given(EVENTS)
@example(
    Event(
        EventID("m", 2**63 - 1, -(2**63), -(2**31)),
        EventKind.REGION_INVALIDATE,
        "r",
        -1,
        2**40,
        "o",
        key="ключ",
        sites_reached=(2**31 - 1, -(2**31), 0),
        expiration=True,
        load=True,
    )
)
def test_every_event_reads_as_fastavro_reads_it(event: Event) -> None:
    data = encode(event)
    read = read_event(data)
    # Longs of 10 bytes are left to fastavro; every other event is read here.
    assert read == _fastavro_event(data) == event or read is None
    assert decode(data) == event


@settings(max_examples=600)
@given(broken_frames(EVENTS.map(encode)))
@example(encode(Event(EventID("m", 1, 2, 3), EventKind.CREATE, "r", 1, 1, "o")) + b"\x00")
def test_broken_event_frames_read_as_fastavro_reads_them_or_are_left_to_it(data: bytes) -> None:
    if data[:2] != bytes((codec.MAGIC, TYPE_BYTES[Event])):
        return  # not an Event frame: never given to the reader
    read = read_event(data)
    assert read is None or read == _fastavro_event(data)


def test_what_the_reader_leaves_is_decoded_or_refused_by_fastavro() -> None:
    """A boolean byte of 2 and an out-of-range bucket: not read here; ``decode`` gives
    fastavro's answer (a refusal for the bucket, as before the reader)."""
    plain = encode(Event(EventID("m", 1, 2, 3), EventKind.CREATE, "r", 1, 1, "o"))
    bucket_at = 2 + 1 + len(b"m") + 1 + 1  # member, thread, sequence
    huge_bucket = plain[:bucket_at] + _zigzag_varint(2**40) + plain[bucket_at + 1 :]
    assert read_event(huge_bucket) is None
    assert _fastavro_event(huge_bucket) is None
    last_boolean = plain[:-1] + b"\x02"
    assert read_event(last_boolean) is None
    assert decode(last_boolean) == _fastavro_event(last_boolean)
