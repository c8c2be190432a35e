"""Property tests (hypothesis) of every wire codec: generated records round-trip, and any
bytes at all either decode into a record that fits its schema or raise the typed error.

Covered: the framed records of :mod:`regionbus.schemas.codec` (Operation, Event, Reply, Control,
Marker; EventID, InterestSpec and Entry inside them), its Batch frame (nested too), the
gateway batch and ack of :mod:`regionbus.gateways.protocol`, the value serializers, the signing
headers, and the Spark decode helper run over the same bytes (no Spark session needed).

"Rejected" means the project's typed error and nothing else: an ``IndexError``,
``EOFError``, ``struct.error``, ``UnicodeDecodeError``, ``RecursionError`` or a fastavro
internal escaping a decoder would kill the worker thread that called it (invariant 6).
"""

from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader
from fastavro.validation import validate
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from regionbus.gateways.protocol import (
    ACK_TYPE,
    BatchEventException,
    GatewayAck,
    GatewayBatch,
    decode_ack,
    decode_batch,
    encode_ack,
    encode_batch,
)
from regionbus.gateways.protocol import (
    BATCH_TYPE as GATEWAY_BATCH_TYPE,
)
from regionbus.schemas.codec import (
    BATCH_TYPE,
    MAGIC,
    TYPE_BYTES,
    decode,
    decode_as,
    encode,
    encode_batches,
    load_avro_schema,
    split_batch,
)
from regionbus.schemas.errors import (
    AuthenticationError,
    MessageDecodeError,
    SerializationError,
)
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import (
    Control,
    ControlKind,
    CqEvent,
    CqMatch,
    CqSpec,
    Entry,
    Event,
    EventKind,
    FunctionSpec,
    InterestKind,
    InterestResultPolicy,
    InterestSpec,
    Marker,
    Message,
    Operation,
    OperationKind,
    QuerySpec,
    Reply,
)
from regionbus.schemas.serializers import (
    AvroSerializer,
    BytesSerializer,
    JsonSerializer,
    StrSerializer,
)
from regionbus.schemas.signing import (
    HEADER_MAC,
    HEADER_PRINCIPAL,
    HEADER_TIMESTAMP,
    SignedHeaders,
    Signer,
    parse_headers,
)
from regionbus.spark.decode import DECODED_SCHEMA, decode_record_values

ROUND_TRIP = settings(max_examples=150)
FUZZ = settings(max_examples=300)

# --- strategies: realistic ranges of every field --------------------------------------

LONGS = st.integers(-(2**63), 2**63 - 1)
INTS = st.integers(-(2**31), 2**31 - 1)
TEXT = st.text(max_size=40)  # any unicode scalar value (hypothesis excludes surrogates)
NAMES = st.text(min_size=1, max_size=40)
OPT_TEXT = st.none() | TEXT
OPT_BYTES = st.none() | st.binary(max_size=200)
SITES = st.lists(INTS, max_size=5).map(tuple)

EVENT_IDS = st.builds(EventID, member=NAMES, thread=LONGS, sequence=LONGS, bucket=INTS)
INTEREST_SPECS = st.builds(
    InterestSpec,
    kind=st.sampled_from(InterestKind),
    keys=st.lists(TEXT, max_size=6).map(tuple),
    regex=OPT_TEXT,
    policy=st.sampled_from(InterestResultPolicy),
    durable=st.booleans(),
    receive_values=st.booleans(),
)
ENTRIES = st.builds(Entry, key=TEXT, version=LONGS, value=OPT_BYTES, serializer=OPT_TEXT)
CQ_SPECS = st.builds(
    CqSpec,
    name=TEXT,
    query=TEXT,
    durable=st.booleans(),
    initial_results=st.booleans(),
    value_schema=OPT_TEXT,
)
SCALARS = st.none() | st.booleans() | LONGS | st.floats(allow_nan=False) | TEXT
# Collections travel as lists (a tuple would read to fastavro as a union's choice).
QUERY_SPECS = st.builds(
    QuerySpec,
    query=TEXT,
    parameters=st.lists(SCALARS | st.lists(SCALARS, max_size=4), max_size=4).map(tuple),
    value_schema=OPT_TEXT,
)
FUNCTION_SPECS = st.builds(
    FunctionSpec,
    function_id=TEXT,
    execution_id=LONGS,
    arguments=OPT_BYTES,
    arguments_serializer=OPT_TEXT,
    filter=st.lists(TEXT, max_size=4).map(tuple),
    re_execute=st.booleans(),
)
OPERATIONS = st.builds(
    Operation,
    request_id=LONGS,
    client_id=NAMES,
    kind=st.sampled_from(OperationKind),
    region=NAMES,
    timestamp_ms=LONGS,
    event_id=st.none() | EVENT_IDS,
    key=OPT_TEXT,
    value=OPT_BYTES,
    serializer=OPT_TEXT,
    callback_argument=OPT_BYTES,
    possible_duplicate=st.booleans(),
    interest=st.none() | INTEREST_SPECS,
    origin_site_id=INTS,
    sites_reached=SITES,
    keep_alive=st.booleans(),
    cq=st.none() | CQ_SPECS,
    kafka_principal=OPT_TEXT,
    expected_value=OPT_BYTES,
    query=st.none() | QUERY_SPECS,
    function=st.none() | FUNCTION_SPECS,
)
EVENTS = st.builds(
    Event,
    event_id=EVENT_IDS,
    kind=st.sampled_from(EventKind),
    region=NAMES,
    version=LONGS,
    timestamp_ms=LONGS,
    originator=NAMES,
    key=OPT_TEXT,
    value=OPT_BYTES,
    serializer=OPT_TEXT,
    possible_duplicate=st.booleans(),
    callback_argument=OPT_BYTES,
    origin_site_id=INTS,
    sites_reached=SITES,
)
REPLIES = st.builds(
    Reply,
    request_id=LONGS,
    bucket=INTS,
    ok=st.booleans(),
    error_type=OPT_TEXT,
    error_message=OPT_TEXT,
    event_kind=st.none() | st.sampled_from(EventKind),
    duplicate=st.booleans(),
    found=st.booleans(),
    version=st.none() | LONGS,
    value=OPT_BYTES,
    serializer=OPT_TEXT,
    entries=st.lists(ENTRIES, max_size=5).map(tuple),
    more=st.booleans(),
    client_state=OPT_TEXT,
    subscription_conflation=st.booleans(),
    cq_names=st.lists(TEXT, max_size=4).map(tuple),
    max_value_size_bytes=INTS,
    entry_count=LONGS,
    function_state=INTS,
)
CONTROLS = st.builds(
    Control,
    kind=st.sampled_from(ControlKind),
    client_id=NAMES,
    timestamp_ms=LONGS,
    durable_client_id=OPT_TEXT,
    durable_client_timeout_s=INTS,
    keep_alive=st.booleans(),
    request_id=LONGS,
    connection_id=OPT_TEXT,
    kafka_principal=OPT_TEXT,
)
MARKERS = st.builds(
    Marker, client_id=NAMES, timestamp_ms=LONGS, bucket=INTS, connection_id=OPT_TEXT
)
CQ_EVENTS = st.builds(
    CqEvent,
    event=EVENTS,
    cqs=st.lists(
        st.builds(
            CqMatch,
            name=TEXT,
            query_operation=st.none() | st.sampled_from(EventKind),
            error=OPT_TEXT,
        ),
        max_size=4,
    ).map(tuple),
)
MESSAGES: st.SearchStrategy[Message] = st.one_of(
    OPERATIONS, EVENTS, REPLIES, CONTROLS, MARKERS, CQ_EVENTS
)
FRAMES = MESSAGES.map(encode)

GATEWAY_BATCHES = st.builds(
    GatewayBatch,
    batch_id=TEXT,
    sender_id=TEXT,
    site_id=INTS,
    ack_topic=TEXT,
    possible_duplicate=st.booleans(),
    events=st.lists(EVENTS.map(encode), max_size=4).map(tuple),
    sequence=LONGS,
    acked_through=LONGS,
)
GATEWAY_ACKS = st.builds(
    GatewayAck,
    batch_id=TEXT,
    receiver_id=TEXT,
    events_received=INTS,
    exceptions=st.lists(
        st.builds(
            BatchEventException, event_index=INTS, event_id=TEXT, error_type=TEXT, message=TEXT
        ),
        max_size=4,
    ).map(tuple),
)


def _zigzag_varint(n: int) -> bytes:
    """Avro's encoding of a long (zigzag, then little-endian base-128)."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@st.composite
def broken_frames(draw: st.DrawFn, valid: st.SearchStrategy[bytes]) -> bytes:
    """A valid frame broken one way: truncated, one byte changed, another type byte, a
    foreign magic byte, a huge declared length spliced in, or bytes appended."""
    data = draw(valid)
    how = draw(st.sampled_from(["truncate", "flip", "type", "magic", "huge", "append"]))
    if how == "truncate":
        return data[: draw(st.integers(0, len(data) - 1))]
    if how == "flip":
        i = draw(st.integers(0, len(data) - 1))
        return (
            data[:i]
            + bytes([draw(st.integers(0, 255).filter(lambda b: b != data[i]))])
            + data[i + 1 :]
        )
    if how == "type":
        return data[:1] + bytes([draw(st.integers(0, 255))]) + data[2:]
    if how == "magic":
        return bytes([draw(st.integers(0, 255).filter(lambda b: b != MAGIC))]) + data[1:]
    if how == "huge":
        i = draw(st.integers(2, len(data)))
        length = draw(st.sampled_from([2**31, 2**40, 2**62, -(2**62), -1]))
        return data[:i] + _zigzag_varint(length) + data[i:]
    return data + draw(st.binary(min_size=1, max_size=8))


MARKER_WITH_HUGE_BUCKET = bytes((MAGIC, 5, 2, 99, 10)) + _zigzag_varint(2**40) + b"\x00"
"""A Marker whose ``bucket`` (an Avro int) holds 2**40: fastavro reads it without complaint."""
_REPLY = encode(Reply(request_id=0, bucket=0, ok=True))
REPLY_WITH_HUGE_BUCKET = _REPLY[:3] + _zigzag_varint(2**40) + _REPLY[4:]
"""A Reply (request 0, bucket 2**40): the Spark helper puts ``bucket`` in a 32-bit column."""


def framed_garbage(type_bytes: list[int]) -> st.SearchStrategy[bytes]:
    """The right magic and a known type byte, then arbitrary bytes."""
    return st.builds(
        lambda t, body: bytes((MAGIC, t)) + body, st.sampled_from(type_bytes), st.binary()
    )


RECORD_TYPES = sorted(TYPE_BYTES.values())
_SCHEMA_OF = {t: load_avro_schema(cls.__name__) for cls, t in TYPE_BYTES.items()}
ANY_BYTES = st.one_of(
    st.binary(max_size=400),
    framed_garbage([*RECORD_TYPES, BATCH_TYPE]),
    broken_frames(FRAMES),
    broken_frames(st.lists(FRAMES, min_size=2, max_size=4).map(lambda f: encode_batches(f)[0])),
)


def _assert_decodes_or_rejects(data: bytes) -> None:
    """``decode(data)`` is a record that fits its schema and round-trips, or it raises
    :class:`MessageDecodeError` carrying the bytes. Anything else fails the test."""
    try:
        message = decode(data)
    except MessageDecodeError as exc:
        assert exc.message_ref == data
        return
    type_byte = TYPE_BYTES[type(message)]
    assert data[:2] == bytes((MAGIC, type_byte))
    # Independent oracle: fastavro's own reading of the body must fit the schema in full
    # (fastavro's reader does not range-check an Avro int; the codec must).
    raw = schemaless_reader(io.BytesIO(data[2:]), _SCHEMA_OF[type_byte], None)
    assert validate(raw, _SCHEMA_OF[type_byte], raise_errors=False), raw
    assert decode(encode(message)) == message


def _assert_spark_decode_never_raises(values: list[bytes | None]) -> None:
    source_rows, columns = decode_record_values(values)
    assert len(columns) == len(DECODED_SCHEMA.fields)
    assert {len(c) for c in columns} == {len(source_rows)}
    assert sorted(set(source_rows)) == list(range(len(values)))


# --- round trips --------------------------------------------------------------------


@ROUND_TRIP
@given(MESSAGES)
def test_every_record_round_trips(message: Message) -> None:
    data = encode(message)
    assert data[:2] == bytes((MAGIC, TYPE_BYTES[type(message)]))
    assert decode(data) == message
    assert decode_as(data, type(message)) == message  # type: ignore[type-var]


@ROUND_TRIP
@given(st.lists(FRAMES, max_size=12), st.integers(16, 4096))
def test_batches_give_back_every_message_in_order(framed: list[bytes], max_bytes: int) -> None:
    packed = encode_batches(framed, max_bytes)
    assert [m for value in packed for m in split_batch(value)] == framed


@ROUND_TRIP
@given(st.lists(FRAMES, min_size=2, max_size=4), st.lists(FRAMES, min_size=1, max_size=3))
def test_a_batch_inside_a_batch_is_one_opaque_item(inner: list[bytes], outer: list[bytes]) -> None:
    (inner_batch,) = encode_batches(inner)
    (outer_batch,) = encode_batches([*outer, inner_batch])
    items = split_batch(outer_batch)
    assert items == [*outer, inner_batch]
    assert split_batch(items[-1]) == inner
    with pytest.raises(MessageDecodeError):
        decode(items[-1])


@ROUND_TRIP
@given(
    MESSAGES,
    st.sampled_from(["bucket", "origin_site_id", "durable_client_timeout_s"]),
    st.sampled_from([2**31, -(2**31) - 1, 2**40]),
)
def test_an_int_outside_the_avro_int_range_is_refused_when_encoding(
    message: Message, field: str, value: int
) -> None:
    if field == "bucket" and isinstance(message, Event | Operation):
        assume(message.event_id is not None)
        assert message.event_id is not None
        message = message._replace(event_id=message.event_id._replace(bucket=value))
    elif field in message._fields:
        replacement: dict[str, Any] = {field: value}
        message = message._replace(**replacement)
    else:
        assume(False)
    with pytest.raises(SerializationError):
        encode(message)


@ROUND_TRIP
@given(GATEWAY_BATCHES, GATEWAY_ACKS)
def test_gateway_batches_and_acks_round_trip(batch: GatewayBatch, ack: GatewayAck) -> None:
    assert decode_batch(encode_batch(batch)) == batch
    assert decode_ack(encode_ack(ack)) == ack


# --- anything else is refused with the typed error -----------------------------------


@FUZZ
@given(ANY_BYTES)
@example(b"")
@example(bytes((MAGIC, 2)) + _zigzag_varint(2**62))
@example(MARKER_WITH_HUGE_BUCKET)
@example(REPLY_WITH_HUGE_BUCKET)
def test_any_bytes_decode_to_a_valid_record_or_raise_message_decode_error(data: bytes) -> None:
    _assert_decodes_or_rejects(data)


@FUZZ
@given(ANY_BYTES)
@example(bytes((MAGIC, BATCH_TYPE)) + _zigzag_varint(2**40) + b"\x00")
def test_any_bytes_split_into_items_or_raise_message_decode_error(data: bytes) -> None:
    try:
        items = split_batch(data)
    except MessageDecodeError as exc:
        assert exc.message_ref == data
        return
    assert all(isinstance(item, bytes) for item in items)
    for item in items:
        _assert_decodes_or_rejects(item)


@settings(max_examples=60, deadline=timedelta(seconds=2))
@given(FRAMES, st.integers(0, 64), st.sampled_from([2**31, 2**40, 2**62, 2**63 - 1]))
def test_a_huge_declared_length_is_refused_quickly(frame: bytes, at: int, length: int) -> None:
    """A declared string, bytes or array length far beyond the message must not make the
    decoder allocate or loop over it (the 2 s deadline per example is the hang check)."""
    at = min(2 + at, len(frame))
    _assert_decodes_or_rejects(frame[:at] + _zigzag_varint(length) + frame[at:])


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=300),
        framed_garbage([GATEWAY_BATCH_TYPE, ACK_TYPE]),
        broken_frames(GATEWAY_BATCHES.map(encode_batch)),
        broken_frames(GATEWAY_ACKS.map(encode_ack)),
    )
)
@example(bytes((MAGIC, GATEWAY_BATCH_TYPE, 0, 0)) + _zigzag_varint(2**40) + b"\x00\x00\x00")
def test_gateway_decoders_return_a_valid_record_or_raise_message_decode_error(
    data: bytes,
) -> None:
    # fastavro does not range-check an Avro int: the decoders must.
    try:
        batch = decode_batch(data)
    except MessageDecodeError as exc:
        assert exc.message_ref == data
    else:
        assert -(2**31) <= batch.site_id < 2**31, batch
        assert decode_batch(encode_batch(batch)) == batch
    try:
        ack = decode_ack(data)
    except MessageDecodeError as exc:
        assert exc.message_ref == data
    else:
        ints = [ack.events_received, *(e.event_index for e in ack.exceptions)]
        assert all(-(2**31) <= i < 2**31 for i in ints), ack
        assert decode_ack(encode_ack(ack)) == ack


@FUZZ
@given(st.lists(st.none() | ANY_BYTES, max_size=6))
@example([REPLY_WITH_HUGE_BUCKET, MARKER_WITH_HUGE_BUCKET, None, b""])
def test_the_spark_decode_helper_turns_any_bytes_into_rows(values: list[bytes | None]) -> None:
    _assert_spark_decode_never_raises(values)


# --- value serializers ---------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | LONGS | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)
FLIGHT_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Flight",
    "namespace": "test",
    "fields": [
        {"name": "carrier", "type": "string"},
        {"name": "dep_delay", "type": ["null", "double"]},
        {"name": "seats", "type": "int"},
        {"name": "legs", "type": {"type": "array", "items": "string"}},
    ],
}
FLIGHTS = st.fixed_dictionaries(
    {
        "carrier": TEXT,
        "dep_delay": st.none() | st.floats(allow_nan=False),
        "seats": INTS,
        "legs": st.lists(TEXT, max_size=4),
    }
)
_PARSED_FLIGHT = parse_schema(FLIGHT_SCHEMA)


@ROUND_TRIP
@given(JSON_VALUES, TEXT, st.binary(), FLIGHTS)
def test_every_serializer_round_trips(
    value: Any, text: str, raw: bytes, flight: dict[str, Any]
) -> None:
    json_serializer = JsonSerializer()
    assert json_serializer.loads(json_serializer.dumps(value)) == value
    assert StrSerializer().loads(StrSerializer().dumps(text)) == text
    assert BytesSerializer().loads(BytesSerializer().dumps(raw)) == raw
    avro = AvroSerializer(FLIGHT_SCHEMA)
    assert avro.loads(avro.dumps(flight)) == flight


@FUZZ
@given(st.binary(max_size=300) | JSON_VALUES.map(lambda v: json.dumps(v).encode()[:-1]))
@example(b"[" * 100_000)
@example(b'{"a":' * 100_000)
@example(b"1" * 10_000)
@example(b"\xff\xfe\x00")
def test_serializers_load_any_bytes_or_raise_serialization_error(data: bytes) -> None:
    for serializer in (JsonSerializer(), StrSerializer(), AvroSerializer(FLIGHT_SCHEMA)):
        try:
            value = serializer.loads(data)
        except SerializationError:
            continue
        if isinstance(serializer, AvroSerializer):
            assert validate(value, _PARSED_FLIGHT, raise_errors=False)
        else:
            assert serializer.loads(serializer.dumps(value)) == value


# --- signing headers -----------------------------------------------------------------

HEADER_VALUES = st.none() | st.binary(max_size=80) | st.text(max_size=80)
HEADER_NAMES = st.sampled_from([HEADER_PRINCIPAL, HEADER_TIMESTAMP, HEADER_MAC, "other"])


@ROUND_TRIP
@given(
    NAMES,
    st.binary(min_size=1, max_size=32),
    TEXT,
    st.integers(0, 1023),
    st.binary(),
    st.integers(0, 2**53),
)
def test_signed_headers_parse_back_and_verify(
    principal: str, key: bytes, topic: str, partition: int, value: bytes, timestamp_ms: int
) -> None:
    headers = Signer(principal, key).headers(topic, partition, value, timestamp_ms)
    parsed = parse_headers(headers)
    assert (parsed.principal, parsed.timestamp_ms) == (principal, timestamp_ms)
    assert parsed.verify(key, topic, partition, value)
    assert not parsed.verify(key, topic, partition, value + b"!")
    assert parse_headers(dict(headers)) == parsed


@FUZZ
@given(st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=6) | st.none())
@example([(HEADER_PRINCIPAL, b"p"), (HEADER_TIMESTAMP, b"9" * 5000), (HEADER_MAC, b"00")])
@example([(HEADER_PRINCIPAL, b"\xff"), (HEADER_TIMESTAMP, b"1"), (HEADER_MAC, b"zz")])
def test_any_headers_parse_or_raise_authentication_error(
    headers: list[tuple[str, str | bytes | None]] | None,
) -> None:
    try:
        parsed = parse_headers(headers)
    except AuthenticationError:
        return
    assert isinstance(parsed, SignedHeaders)
    assert parsed.principal and isinstance(parsed.timestamp_ms, int)
    assert isinstance(parsed.mac, bytes)
