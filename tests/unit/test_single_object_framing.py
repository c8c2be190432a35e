"""Avro's single-object encoding as the other framing (docs/wire-format.md): the header is
the specification's (``C3 01``, the CRC-64-AVRO fingerprint of the schema's Parsing
Canonical Form, little-endian), the body the regionbus frame's, and every reader takes
both framings, batches included."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from fastavro import schemaless_reader

from regionbus.schemas.codec import (
    SINGLE_OBJECT_MARKER,
    decode,
    encode,
    encode_batches,
    is_batch,
    load_avro_schema,
    regionbus_frame,
    schema_fingerprint,
    split_batch,
)
from regionbus.schemas.errors import MessageDecodeError
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import Event, EventKind, Operation, OperationKind

_EVENT = Event(
    event_id=EventID("java-1.a1b2c3", 1, 0, 6),
    kind=EventKind.CREATE,
    region="orders",
    key="o-1",
    value=b'{"qty":3}',
    serializer="json",
    version=1,
    timestamp_ms=1767225600000,
    originator="java-1",
)


def test_the_header_is_the_avro_specifications_and_the_body_is_unchanged() -> None:
    framed = encode(_EVENT, "avro-single-object")
    assert framed[:2] == SINGLE_OBJECT_MARKER == b"\xc3\x01"
    assert framed[2:10] == schema_fingerprint("Event")
    assert framed[10:] == encode(_EVENT)[2:]
    # A decoder that knows nothing of regionbus reads the body with the schema alone.
    body = io.BytesIO(framed[10:])
    assert schemaless_reader(body, load_avro_schema("Event"), None)["key"] == "o-1"
    # One fingerprint per schema (that Java's Avro computes the same ones is
    # tests/integration/test_wire_java.py's to show).
    assert len({schema_fingerprint(n) for n in ("Event", "Operation", "Reply", "Batch")}) == 4


def test_every_reader_takes_both_framings_batches_included() -> None:
    op = Operation(
        request_id=1,
        client_id="java-1",
        kind=OperationKind.PUT,
        region="orders",
        timestamp_ms=1,
        event_id=EventID("java-1.x", 1, 0, 6),
        key="o-1",
        value=b"1",
        serializer="json",
    )
    assert decode(encode(_EVENT, "avro-single-object")) == decode(encode(_EVENT)) == _EVENT
    assert decode(encode(op, "avro-single-object")) == op
    items = [encode(_EVENT), encode(op, "avro-single-object")]
    [batch] = encode_batches(items, framing="avro-single-object")
    assert batch[2:10] == schema_fingerprint("Batch") and is_batch(batch)
    assert split_batch(batch) == items
    assert [decode(item) for item in split_batch(batch)] == [_EVENT, op]
    assert regionbus_frame(encode(_EVENT)) == encode(_EVENT)


def test_a_single_object_of_another_schema_is_refused() -> None:
    foreign = SINGLE_OBJECT_MARKER + bytes(8) + b"\x00"
    with pytest.raises(MessageDecodeError, match="no regionbus schema"):
        decode(foreign)
    with pytest.raises(MessageDecodeError):
        decode(SINGLE_OBJECT_MARKER + schema_fingerprint("Event")[:3])


def test_the_wire_format_document_lists_the_fingerprints_of_these_schemas() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "wire-format.md").read_text()
    listed = dict(re.findall(r"^\| `(\w+)` \| `((?:[0-9a-f]{2} ){7}[0-9a-f]{2})` \|$", text, re.M))
    names = ("Operation", "Event", "Reply", "Control", "Marker", "Batch", "CqEvent")
    assert listed == {name: schema_fingerprint(name).hex(" ") for name in names}
