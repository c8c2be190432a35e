"""What the server refuses before applying anything, and that every operation kind has
its one handler (no Kafka, no Redis)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from regionbus.broker.config import ServerSettings
from regionbus.broker.handlers import OperationHandlers
from regionbus.broker.validation import validate
from regionbus.schemas.errors import InvalidInterestError, InvalidOperationError, ValueTooLargeError
from regionbus.schemas.eventid import EXPIRY_MEMBER, EXPIRY_THREAD, LOAD_MEMBER, EventID
from regionbus.schemas.messages import InterestKind, InterestSpec, Operation, OperationKind
from regionbus.schemas.naming import bucket_of
from regionbus.schemas.operation_kinds import kind_row

SETTINGS = ServerSettings(namespace="unit", total_buckets=16, max_value_size_bytes=64)


def _op(kind: OperationKind, key: str | None = "k", **fields: Any) -> Operation:
    return Operation(
        request_id=1,
        client_id="c",
        kind=kind,
        region="r",
        timestamp_ms=0,
        key=key,
        **{"event_id": EventID("m", 1, 0, 0), **fields},
    )


BUCKET = bucket_of("r", "k", 16)


def test_a_well_formed_put_in_its_keys_bucket_passes() -> None:
    validate(_op(OperationKind.PUT, value=b"1", serializer="json"), BUCKET, SETTINGS)


@pytest.mark.parametrize(
    ("op", "bucket", "message"),
    [
        (_op(OperationKind.GET, key=None, event_id=None), BUCKET, "needs a key"),
        (_op(OperationKind.PUT, value=b"1"), (BUCKET + 1) % 16, "belongs to bucket"),
        (_op(OperationKind.DESTROY, event_id=None), BUCKET, "needs an EventID"),
        (_op(OperationKind.CLEAR, key=None, event_id=None), 0, "needs an EventID"),
        (_op(OperationKind.PUT), BUCKET, "PUT needs a value"),
        (
            _op(OperationKind.REGISTER_INTEREST, key=None, event_id=None),
            0,
            "needs an interest spec",
        ),
    ],
)
def test_a_malformed_operation_is_refused_with_the_reason(
    op: Operation, bucket: int, message: str
) -> None:
    with pytest.raises(InvalidOperationError, match=message):
        validate(op, bucket, SETTINGS)


def test_a_value_over_the_maximum_is_too_large() -> None:
    with pytest.raises(ValueTooLargeError, match="65 bytes exceeds"):
        validate(_op(OperationKind.PUT, value=b"x" * 65), BUCKET, SETTINGS)


def test_a_registration_regex_that_does_not_compile_is_refused() -> None:
    spec = InterestSpec(InterestKind.REGEX, regex="(")
    op = _op(OperationKind.REGISTER_INTEREST, key=None, event_id=None, interest=spec)
    with pytest.raises(InvalidInterestError):
        validate(op, 3, SETTINGS)


def test_every_operation_kind_has_exactly_its_handler_in_the_one_table() -> None:
    entries = SimpleNamespace(add=lambda *_: None, apply=lambda: None)
    parts: dict[str, Any] = {
        name: object()
        for name in (
            "store",
            "registry",
            "ownership",
            "plugins",
            "notifier",
            "distribution",
            "lifecycle",
            "outbox",
            "stats",
            "cqs",
        )
    }
    expiration = SimpleNamespace(apply=lambda *_: None)
    functions = SimpleNamespace(execute=lambda *_: None, attributes=lambda *_: None)
    handlers = OperationHandlers(
        settings=SETTINGS, entries=entries, expiration=expiration, functions=functions, **parts
    )
    assert set(handlers.table) == set(OperationKind)
    for kind in OperationKind:
        if kind_row(kind).expiration:
            assert handlers.table[kind] == expiration.apply
        else:
            assert (handlers.table[kind] == entries.add) is kind_row(kind).batched


EXPIRY_ID = EventID(EXPIRY_MEMBER, EXPIRY_THREAD, 7, BUCKET)


def test_an_expiration_in_its_keys_bucket_with_the_expirations_eventid_passes() -> None:
    validate(_op(OperationKind.EXPIRE_DESTROY, event_id=EXPIRY_ID), BUCKET, SETTINGS)


@pytest.mark.parametrize(
    ("op", "message"),
    [
        (_op(OperationKind.EXPIRE_DESTROY, event_id=None), "needs an EventID"),
        (_op(OperationKind.EXPIRE_INVALIDATE, key=None, event_id=EXPIRY_ID), "needs a key"),
        (_op(OperationKind.EXPIRE_DESTROY), "only an expiration, and every expiration"),
        (_op(OperationKind.PUT, value=b"1", event_id=EXPIRY_ID), "only an expiration"),
        (_op(OperationKind.DESTROY, event_id=EXPIRY_ID), "only an expiration"),
    ],
)
def test_expirations_keep_their_eventid_thread_to_themselves(op: Operation, message: str) -> None:
    # A change in the expirations' thread with a high sequence id would make every later
    # expiration of the bucket look like a duplicate, to the servers and to the clients.
    with pytest.raises(InvalidOperationError, match=message):
        validate(op, BUCKET, SETTINGS)


LOAD_ID = EventID(LOAD_MEMBER, 123_456, 0, BUCKET)


def test_a_loaders_create_with_the_loads_eventid_passes() -> None:
    validate(_op(OperationKind.LOAD_CREATE, value=b"1", event_id=LOAD_ID), BUCKET, SETTINGS)


@pytest.mark.parametrize(
    ("op", "message"),
    [
        (_op(OperationKind.LOAD_CREATE, value=b"1"), "only a loader's create, and every one"),
        (_op(OperationKind.PUT, value=b"1", event_id=LOAD_ID), "only a loader's create"),
        (_op(OperationKind.LOAD_CREATE, event_id=LOAD_ID), "needs a value"),
    ],
)
def test_a_loaders_creates_keep_their_eventid_member_to_themselves(
    op: Operation, message: str
) -> None:
    with pytest.raises(InvalidOperationError, match=message):
        validate(op, BUCKET, SETTINGS)
