"""How one function execution reaches the regions from its worker thread
(`regionbus.schemas.functions.RegionAccess`): reads straight from the store, changes
handed to the server's loop, which produces them to their buckets in order
(`regionbus.broker.functions`).

A worker thread never applies a change itself: the change would skip the bucket's order,
its primary's fencing epoch and its distribution. It queues the change here; at its next
turn the loop gives it an EventID of the server's function thread and produces it to the
key's partition of ``{ns}.ops``, where the key's primary (this server or another) applies
and distributes it as any client's. At most :data:`CHANGES_IN_FLIGHT` changes of one
execution are queued or undelivered at once: a function that changes faster waits,
within its time budget, so one execution holds a bounded part of the server's memory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Final, NamedTuple

from regionbus.broker.cq_registry import CqTable
from regionbus.broker.store import RegionStore
from regionbus.schemas.entry_checks import check_value_size
from regionbus.schemas.errors import (
    FunctionTimeoutError,
    RegionNotFoundError,
    SerializationError,
    ValueTooLargeError,
)
from regionbus.schemas.messages import OperationKind
from regionbus.schemas.naming import bucket_of
from regionbus.schemas.serializers import plain_bytes

CHANGES_IN_FLIGHT: Final = 1_000
"""Changes of one execution queued for the loop or not yet delivered to Kafka, at most."""

PAGE_ENTRIES: Final = 500
"""About how many entries one Redis read of a bucket's entries takes."""

_CHANGE_KINDS: Final = frozenset(
    (
        OperationKind.PUT,
        OperationKind.DESTROY,
        OperationKind.INVALIDATE,
        OperationKind.LOCAL_DESTROY,
        OperationKind.LOCAL_INVALIDATE,
    )
)


class Change(NamedTuple):
    """A change a function made, before it has an EventID."""

    kind: OperationKind
    region: str
    key: str
    bucket: int
    value: bytes | None
    serializer: str | None
    callback_argument: bytes | None


class PendingChanges:
    """The changes of one execution between its worker thread and the loop.

    Args:
        deadline_s: The execution's deadline, monotonic seconds.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(self, deadline_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._deadline_s = deadline_s
        self._clock = clock
        self._ready = threading.Condition()
        self._queued: list[Change] = []
        self._in_flight = 0
        self.failure: str | None = None
        """Why a change was not delivered, once one was not."""

    def add(self, change: Change) -> None:
        """Queue a change (the worker thread), waiting while :data:`CHANGES_IN_FLIGHT`
        are in flight.

        Raises:
            FunctionTimeoutError: the deadline passed first.
        """
        with self._ready:
            while self._in_flight >= CHANGES_IN_FLIGHT:
                left = self._deadline_s - self._clock()
                if left <= 0:
                    raise FunctionTimeoutError("function_timeout_ms passed")
                self._ready.wait(left)
            self._queued.append(change)
            self._in_flight += 1

    def take(self) -> list[Change]:
        """The changes queued since the last call (the loop)."""
        with self._ready:
            taken, self._queued = self._queued, []
            return taken

    def delivered(self, failure: str | None) -> None:
        """One change's delivery report: delivered, or ``failure`` (the loop)."""
        with self._ready:
            self._in_flight -= 1
            if failure is not None and self.failure is None:
                self.failure = failure
            self._ready.notify_all()

    @property
    def settled(self) -> bool:
        """Every change queued so far is delivered or failed."""
        with self._ready:
            return self._in_flight == 0


class ExecutionAccess:
    """One execution's way to the regions (`regionbus.schemas.functions.RegionAccess`);
    every call first checks the execution's deadline.

    Args:
        store: The region store (thread-safe reads).
        values: Decodes stored values (with the Avro schemas clients brought).
        changes: Where the execution's changes go.
        deadline_s: The execution's deadline, monotonic seconds.
        total_buckets: Buckets of the namespace.
        max_value_size_bytes: The servers' ``max_value_size_bytes``.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        store: RegionStore,
        values: CqTable,
        changes: PendingChanges,
        deadline_s: float,
        total_buckets: int,
        max_value_size_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._values = values
        self._changes = changes
        self._deadline_s = deadline_s
        self._total_buckets = total_buckets
        self._max_value_size_bytes = max_value_size_bytes
        self._clock = clock

    def check_deadline(self) -> None:
        """Refuse to go on past the deadline.

        Raises:
            FunctionTimeoutError: the execution is past its ``function_timeout_ms`` (its
                caller was answered so already).
        """
        if self._clock() > self._deadline_s:
            raise FunctionTimeoutError(
                "the function ran past function_timeout_ms; its caller was answered"
            )

    def bucket_of(self, region: str, key: str) -> int:
        return bucket_of(region, key, self._total_buckets)

    def get(self, region: str, key: str) -> Any:
        self.check_deadline()
        exists, entry = self._store.get(region, key, self.bucket_of(region, key))
        if not exists:
            raise RegionNotFoundError(f"region {region!r} not found")
        return None if entry is None else self._values.value(entry.value, entry.serializer)

    def change(
        self,
        kind: OperationKind,
        region: str,
        key: str,
        value: Any,
        callback_argument: bytes | None,
    ) -> None:
        assert kind in _CHANGE_KINDS
        self.check_deadline()
        check_value_size(None, callback_argument)
        data, serializer = (None, None) if kind is not OperationKind.PUT else plain_bytes(value)
        if data is not None and len(data) > self._max_value_size_bytes:
            raise ValueTooLargeError(
                f"value of {len(data)} bytes exceeds max_value_size_bytes="
                f"{self._max_value_size_bytes}"
            )
        bucket = self.bucket_of(region, key)
        self._changes.add(Change(kind, region, key, bucket, data, serializer, callback_argument))

    def entries(self, region: str, bucket: int) -> Iterator[tuple[str, Any]]:
        self.check_deadline()
        if not self._store.region_exists(region, bucket):
            raise RegionNotFoundError(f"region {region!r} not found")
        for page in self._store.pages(region, bucket, PAGE_ENTRIES):
            self.check_deadline()
            for entry in page:
                try:
                    value = self._values.value(entry.value, entry.serializer)
                except SerializationError as exc:
                    raise SerializationError(
                        f"the value of {entry.key!r} does not decode on the server: {exc}"
                    ) from None
                yield entry.key, value


__all__ = ["CHANGES_IN_FLIGHT", "Change", "ExecutionAccess", "PendingChanges"]
