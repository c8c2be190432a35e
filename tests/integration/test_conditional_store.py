"""The branches of ``apply_entry.lua`` for Geode's conditional operations, in the Redis store
alone: each condition, what a change that happens returns, and that one that does not is
recorded under its EventID and answered the same when processed again."""

from __future__ import annotations

from typing import Any

import redis

from regionbus.broker.store import ApplyResult, RegionStore
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import EventKind, OperationKind
from regionbus.schemas.naming import bucket_of

PUT, PUT_IF_ABSENT, REPLACE, REMOVE = (
    OperationKind.PUT,
    OperationKind.PUT_IF_ABSENT,
    OperationKind.REPLACE,
    OperationKind.REMOVE,
)


class _Apply:
    def __init__(self, store: RegionStore) -> None:
        self.store = store
        self.sequence = 0

    def __call__(
        self,
        kind: OperationKind,
        key: str,
        value: bytes | None = None,
        *,
        expected: bytes | None = None,
        sequence: int | None = None,
    ) -> ApplyResult:
        bucket = bucket_of("r", key, 16)
        if sequence is None:
            self.sequence += 1
            sequence = self.sequence
        args: Any = self.store.entry_args(
            kind,
            "r",
            key,
            value,
            "json" if value is not None else None,
            EventID("m", 1, sequence, bucket),
            bucket,
            sequence,
            kind is REPLACE,
            expected_value=expected,
        )
        result = self.store.run_batch([args])[0]
        assert isinstance(result, ApplyResult)
        return result


def _value(store: RegionStore, key: str) -> Any:
    entry = store.entries("r").get(key)
    return "absent" if entry is None else entry.value


def test_each_condition_of_the_conditional_operations(
    redis_client: redis.Redis, namespace: str
) -> None:
    store = RegionStore(redis_client, namespace, 16)
    store.create_region("r")
    apply = _Apply(store)

    created = apply(PUT_IF_ABSENT, "a", b"1")
    assert (created.status, created.event_kind) == ("OK", EventKind.CREATE)
    kept = apply(PUT_IF_ABSENT, "a", b"2")
    assert (kept.status, kept.event_kind, kept.old_value) == ("NOOP", None, b"1")
    assert kept.old_serializer == "json"

    assert apply(REPLACE, "none", b"1").status == "NOOP"
    assert _value(store, "none") == "absent"
    replaced = apply(REPLACE, "a", b"3")
    assert (replaced.status, replaced.event_kind, replaced.old_value) == (
        "OK",
        EventKind.UPDATE,
        b"1",
    )
    assert apply(REPLACE, "a", b"4", expected=b"1").status == "NOOP"
    assert apply(REPLACE, "a", b"4", expected=b"3").event_kind is EventKind.UPDATE
    assert _value(store, "a") == b"4"

    assert apply(REMOVE, "a", expected=b"3").status == "NOOP"
    assert apply(REMOVE, "a").status == "NOOP"  # None expects an invalid entry
    removed = apply(REMOVE, "a", expected=b"4")
    assert (removed.status, removed.event_kind) == ("OK", EventKind.DESTROY)
    assert _value(store, "a") == "absent"
    assert apply(REMOVE, "a", expected=b"4").status == "NOOP"

    apply(PUT, "i", b"1")
    invalidated = apply(OperationKind.INVALIDATE, "i")
    assert invalidated.event_kind is EventKind.INVALIDATE
    assert apply(PUT_IF_ABSENT, "i", b"2").status == "NOOP"  # an invalid entry is present
    assert _value(store, "i") is None
    assert apply(REPLACE, "i", b"5", expected=b"1").status == "NOOP"
    assert apply(REMOVE, "i").event_kind is EventKind.DESTROY
    assert apply(PUT_IF_ABSENT, "i", b"6").event_kind is EventKind.CREATE


def test_a_change_that_did_not_happen_is_answered_the_same_when_seen_again(
    redis_client: redis.Redis, namespace: str
) -> None:
    store = RegionStore(redis_client, namespace, 16)
    store.create_region("r")
    apply = _Apply(store)
    apply(PUT, "k", b"1")
    first = apply(PUT_IF_ABSENT, "k", b"2", sequence=50)
    assert (first.status, first.old_value) == ("NOOP", b"1")
    apply(REMOVE, "k", expected=b"1", sequence=51)
    # Read again (a failover re-reads from the committed offset): the entry is gone now,
    # but the put-if-absent changed nothing the first time and changes nothing now.
    again = apply(PUT_IF_ABSENT, "k", b"2", sequence=50)
    assert (again.status, again.event_kind, again.old_value) == ("NOOP", None, b"1")
    assert _value(store, "k") == "absent"
