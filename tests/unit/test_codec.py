"""The Avro wire codec: every record round-trips; foreign or broken bytes raise a typed error."""

from __future__ import annotations

import time

import pytest

from regionbus.schemas.codec import (
    BATCH_TYPE,
    MAGIC,
    MAX_BATCH_ITEMS,
    decode,
    decode_as,
    encode,
    encode_batches,
    is_batch,
    split_batch,
)
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
    Operation,
    OperationKind,
    Reply,
)

EID = EventID("client-1", 3, 41, 7)

RECORDS = [
    Operation(
        request_id=1,
        client_id="c",
        kind=OperationKind.PUT,
        region="r",
        timestamp_ms=5,
        event_id=EID,
        key="k",
        value=b"\x00\x01",
        serializer="bytes",
        callback_argument=b"cb",
        possible_duplicate=True,
        origin_site_id=2,
        sites_reached=(1, 2),
    ),
    Operation(
        request_id=2,
        client_id="c",
        kind=OperationKind.REGISTER_INTEREST,
        region="r",
        timestamp_ms=5,
        interest=InterestSpec(
            InterestKind.REGEX, (), "a.*", InterestResultPolicy.KEYS, True, False
        ),
    ),
    Event(EID, EventKind.UPDATE, "r", 9, 10, "c", key="k", value=b"v", serializer="json"),
    Event(EID, EventKind.REGION_CLEAR, "r", 11, 10, "c"),
    Reply(
        request_id=3,
        bucket=2,
        ok=True,
        event_kind=EventKind.CREATE,
        found=True,
        version=4,
        entries=(Entry("a", 1, b"x", "str"), Entry("b", 2)),
        more=True,
    ),
    Reply(request_id=4, bucket=0, ok=False, error_type="CacheWriterError", error_message="no"),
    Control(ControlKind.CLOSE, "c", 12, durable_client_id="d", keep_alive=True),
    Marker("c", 13),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_round_trips(record: object) -> None:
    data = encode(record)  # type: ignore[arg-type]
    assert data[0] == 0xB1
    assert decode(data) == record
    assert decode_as(data, type(record)) == record  # type: ignore[type-var]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (None, "empty"),
        (b"\xb1", "empty or truncated"),
        (b'{"json": 1}', "not a regionbus message"),
        (b"\xb1\x09abc", "unknown message type"),
        (b"\xb1\x02\xff\xff\xff\xff", "undecodable Event"),
    ],
)
def test_broken_bytes_raise_message_decode_error_keeping_the_bytes(
    data: bytes | None, reason: str
) -> None:
    with pytest.raises(MessageDecodeError, match=reason) as info:
        decode(data)
    assert info.value.message_ref == data


def test_trailing_bytes_are_rejected() -> None:
    data = encode(Marker("c", 1)) + b"x"
    with pytest.raises(MessageDecodeError, match="trailing"):
        decode(data)


def test_decode_as_rejects_another_record_type() -> None:
    with pytest.raises(MessageDecodeError, match="expected Reply, got Marker"):
        decode_as(encode(Marker("c", 1)), Reply)


def test_a_field_outside_its_schema_fails_to_encode_with_a_typed_error() -> None:
    bad = Marker("c", 2**70)
    with pytest.raises(SerializationError):
        encode(bad)


def test_batches_keep_order_and_respect_the_size_limit() -> None:
    framed = [encode(Marker("c", i)) for i in range(100)]
    batches = encode_batches(framed, max_bytes=200)
    assert len(batches) > 1
    assert all(len(b) <= 200 + len(framed[0]) for b in batches)
    assert [m for b in batches for m in split_batch(b)] == framed


def test_a_single_message_is_not_wrapped_in_a_batch() -> None:
    one = encode(Marker("c", 1))
    assert encode_batches([one]) == [one]
    assert split_batch(one) == [one]
    assert not is_batch(one)


def test_a_broken_batch_frame_is_a_typed_error_and_decode_refuses_batches() -> None:
    [batch] = encode_batches([encode(Marker("c", 1)), encode(Marker("c", 2))])
    assert is_batch(batch)
    with pytest.raises(MessageDecodeError, match="Batch"):
        split_batch(batch[:-3])
    with pytest.raises(MessageDecodeError, match="split_batch"):
        decode(batch)


def _array_batch(block_counts: list[int], item: bytes = b"") -> bytes:
    """A Batch frame whose Avro array is written in blocks of the given counts (positive:
    items follow; negative: the block's byte size follows, as Avro allows)."""

    def long(value: int) -> bytes:
        zigzag = (value << 1) ^ (value >> 63)
        out = bytearray()
        while zigzag >= 0x80:
            out.append((zigzag & 0x7F) | 0x80)
            zigzag >>= 7
        out.append(zigzag)
        return bytes(out)

    body = bytearray()
    for count in block_counts:
        items = (long(len(item)) + item) * abs(count)
        body += long(count) + (long(len(items)) if count < 0 else b"") + items
    body += long(0)
    return bytes((MAGIC, BATCH_TYPE)) + bytes(body)


@pytest.mark.parametrize(
    "blocks",
    [[990_000], [MAX_BATCH_ITEMS + 1], [MAX_BATCH_ITEMS, 1], [-3000, -3000], [1] * 5000],
)
def test_a_batch_of_more_items_than_any_writer_sends_is_refused_before_decoding(
    blocks: list[int],
) -> None:
    data = _array_batch(blocks)
    started = time.perf_counter()
    with pytest.raises(MessageDecodeError, match=f"more than {MAX_BATCH_ITEMS} items"):
        split_batch(data)
    assert time.perf_counter() - started < 1.0  # no item decoded
    assert len(split_batch(_array_batch([MAX_BATCH_ITEMS], b"\xb1\x01"))) == MAX_BATCH_ITEMS


def test_batches_never_hold_more_items_than_a_reader_takes() -> None:
    frame = encode(Reply(request_id=1, bucket=0, ok=True))
    values = encode_batches([frame] * (3 * MAX_BATCH_ITEMS + 5))
    counts = [len(split_batch(v)) for v in values]
    assert counts == [MAX_BATCH_ITEMS, MAX_BATCH_ITEMS, MAX_BATCH_ITEMS, 5]
