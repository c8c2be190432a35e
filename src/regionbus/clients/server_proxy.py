"""The remote half of a client region (Geode ``ServerRegionProxy``): requests to the servers.

It builds each operation (request id, EventID, bucket), sends it through the cache's pool,
waits for the replies within ``read_timeout_ms`` and turns an error reply into the
exception it names. It keeps no state of the region's entries: that is the local store's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Protocol

from regionbus.clients.pending import EntriesTaker
from regionbus.clients.settings import ClientSettings
from regionbus.clients.windowed import BulkOutcome, put_or_remove_all, send_windowed
from regionbus.schemas.errors import (
    RegionBusError,
    ServerTimeoutError,
    error_from_wire,
)
from regionbus.schemas.limits import (
    KEYS_PER_REGISTRATION_MESSAGE,
    REGISTRATION_MESSAGES_IN_FLIGHT,
)
from regionbus.schemas.messages import (
    CqSpec,
    FunctionSpec,
    InterestKind,
    InterestSpec,
    Operation,
    OperationKind,
    QuerySpec,
    Reply,
)
from regionbus.schemas.naming import bucket_of, region_bucket
from regionbus.schemas.operation_kinds import kind_row

if TYPE_CHECKING:
    from regionbus.clients.pool import Pool


class CacheConnection(Protocol):
    """What a region needs of its client cache."""

    @property
    def pool(self) -> Pool:
        """The cache's connection pool."""
        ...

    @property
    def client_id(self) -> str:
        """The client id (the address of its replies and queue records)."""
        ...

    @property
    def total_buckets(self) -> int:
        """Buckets of the namespace (partitions of ``{ns}.ops``)."""
        ...

    @property
    def settings(self) -> ClientSettings:
        """The client's settings."""
        ...

    @property
    def max_value_size_bytes(self) -> int:
        """The largest value the servers take (their ``max_value_size_bytes``)."""
        ...

    def require_subscription(self) -> None:
        """Raise ``UnconnectedError`` unless the cache has a subscription queue."""
        ...

    def regex_registrations(self) -> int:
        """How many regex registrations the cache holds, over all its regions."""
        ...

    def key_registrations(self) -> int:
        """How many keys the cache holds registered, over all its regions."""
        ...

    def forget_region(self, name: str) -> None:
        """Remove a destroyed region from the cache."""
        ...


def raise_first_error(replies: Sequence[Reply]) -> None:
    """Raise the error the first failed reply names, if any.

    Raises:
        RegionBusError: the class the reply's ``error_type`` names (see
            `regionbus.schemas.errors.error_from_wire`).
    """
    for reply in replies:
        if not reply.ok:
            raise error_from_wire(reply.error_type, reply.error_message)


class _Pipelined:
    """The reply callback of one pipelined operation: ``finish(op, reply)``, then its future.

    One slotted object (not a closure: a function and a cell per captured name) lives as
    long as the operation is in flight; thousands are, and each object alive at a
    collection is one more the collector scans.
    """

    __slots__ = ("finish", "future", "op")

    def __init__(self, op: Operation, finish: Callable[[Operation, Reply], None]) -> None:
        self.op = op
        self.finish = finish
        self.future: Future[None] = Future()

    def __call__(self, replies: list[Reply] | None, error: BaseException | None) -> None:
        try:
            if error is not None:
                raise error
            assert replies
            self.finish(self.op, replies[0])
            self.future.set_result(None)
        except BaseException as exc:
            self.future.set_exception(exc)


class ServerRegionProxy:
    """Sends one region's operations to the bucket primaries that own them.

    Args:
        cache: The client cache the region belongs to.
        region: The region's name.
        serializer_name: Name of the region's serializer, stamped on the values it sends.
    """

    def __init__(self, cache: CacheConnection, region: str, serializer_name: str) -> None:
        self._cache = cache
        self.region = region
        self.serializer_name = serializer_name

    @property
    def total_buckets(self) -> int:
        """Buckets of the namespace."""
        return self._cache.total_buckets

    def bucket(self, key: str) -> int:
        """The bucket of one of this region's keys."""
        return bucket_of(self.region, key, self._cache.total_buckets)

    def region_bucket(self) -> int:
        """The bucket that orders this region's clear and destroy."""
        return region_bucket(self.region, self._cache.total_buckets)

    def operation(
        self,
        kind: OperationKind,
        *,
        key: str | None = None,
        value: bytes | None = None,
        callback_argument: bytes | None = None,
        interest: InterestSpec | None = None,
        bucket: int = -1,
        request_id: int | None = None,
        cq: CqSpec | None = None,
        query: QuerySpec | None = None,
        function: FunctionSpec | None = None,
    ) -> Operation:
        """A new operation of this client on this region.

        Args:
            kind: What to do.
            key, value, callback_argument, interest, cq, query, function: Its fields,
                where the kind has them.
            bucket: The bucket the EventID is widened with.
            request_id: Share a request id across several operations; None for a new one.
        """
        pool = self._cache.pool
        return Operation(
            request_id=pool.next_request_id() if request_id is None else request_id,
            client_id=self._cache.client_id,
            kind=kind,
            region=self.region,
            timestamp_ms=int(time.time() * 1000),
            # Every change has an EventID of the calling thread; nothing else has one.
            event_id=pool.next_event_id(bucket) if kind_row(kind).change else None,
            key=key,
            value=value,
            serializer=self.serializer_name if value is not None else None,
            callback_argument=callback_argument,
            interest=interest,
            kafka_principal=pool.kafka_principal,
            cq=cq,
            query=query,
            function=function,
        )

    def wait(self, future: Future[list[Reply]], request_id: int) -> list[Reply]:
        """The replies of a request, within ``read_timeout_ms``.

        Raises:
            ServerTimeoutError: not every reply came in time (the request is forgotten).
        """
        timeout_ms = self._cache.settings.read_timeout_ms
        try:
            return future.result(timeout_ms / 1000)
        except FutureTimeout:
            self._cache.pool.forget(request_id)
            raise ServerTimeoutError(
                f"no reply from the server within {timeout_ms} ms (region {self.region!r})"
            ) from None

    def one(self, op: Operation, bucket: int) -> Reply:
        """Send one operation to its bucket and return its reply.

        Raises:
            RegionBusError: the error the reply names.
            ServerTimeoutError: no reply within ``read_timeout_ms``.
            UnconnectedError, TransportError: the pool could not send it.
        """
        reply = self.wait(self._cache.pool.request([(op, bucket)]), op.request_id)[0]
        raise_first_error([reply])
        return reply

    def every_bucket(
        self, kind: OperationKind, cq: CqSpec | None = None, query: QuerySpec | None = None
    ) -> list[Reply]:
        """Send one operation of ``kind`` (no EventID: a read, a continuous query's ``cq``
        or a one-shot ``query``) to every bucket; wait for all.

        Raises:
            RegionBusError: the error the first failed reply names.
            ServerTimeoutError: not every bucket answered in time.
        """
        request_id = self._cache.pool.next_request_id()
        ops = [
            (
                self.operation(kind, request_id=request_id, cq=cq, query=query),
                b,
            )
            for b in range(self._cache.total_buckets)
        ]
        replies = self.wait(self._cache.pool.request(ops), request_id)
        raise_first_error(replies)
        return replies

    def bulk(
        self,
        prepared: Sequence[tuple[Operation, int]],
        finish: Callable[[Operation, Reply], None],
        *,
        skip_missing: bool,
    ) -> BulkOutcome:
        """Send keyed operations windowed, one request each, and ``finish(op, reply)``
        each as its reply comes (Geode ``putAll`` / ``removeAll``; see
        `regionbus.clients.windowed.put_or_remove_all`).

        Args:
            prepared: ``(operation, bucket)`` pairs; every operation has a key.
            finish: Applies one successful reply; may raise what the reply names.
            skip_missing: Leave out entries missing on the server (``removeAll``).

        Returns:
            What is known of each entry: applied, not applied, or unknown.
        """
        return put_or_remove_all(self._cache.pool, prepared, finish, skip_missing=skip_missing)

    def pipelined(
        self, op: Operation, bucket: int, finish: Callable[[Operation, Reply], None]
    ) -> Future[None]:
        """Send one operation and return at once; ``finish(op, reply)`` runs on the pool's
        reply thread when the reply comes, and the future completes with what it does."""
        done = _Pipelined(op, finish)
        self._cache.pool.request_with_callback([(op, bucket)], done)
        return done.future

    def interest(
        self,
        kind: OperationKind,
        spec: InterestSpec,
        take_entries: EntriesTaker | None = None,
    ) -> list[Reply]:
        """Register or unregister interest on every bucket it concerns and wait for all.

        A key list goes only to its keys' buckets, as operations of at most
        `KEYS_PER_REGISTRATION_MESSAGE` keys, a few in flight at a time; every other kind
        goes to every bucket in one request. A registration that fails or times out part
        way is undone (every key sent is unregistered) before the error is raised.

        Args:
            kind: REGISTER_INTEREST or UNREGISTER_INTEREST.
            spec: The registration.
            take_entries: Takes the bulk-load entries of each reply chunk as it arrives
                (then the replies carry none), so they are never all held at once.

        Returns:
            Every reply (a registration's carry the bulk-load entries, unless taken, and
            the region version of each bucket's snapshot).

        Raises:
            RegionBusError: the error the first failed reply names.
            ServerTimeoutError: not every bucket answered in time (a key registration was
                undone; the message says so, or that undoing it was not confirmed).
        """
        if spec.kind is not InterestKind.KEYS:
            request_id = self._cache.pool.next_request_id()
            ops = [
                (
                    self.operation(kind, interest=spec, request_id=request_id),
                    b,
                )
                for b in range(self._cache.total_buckets)
            ]
            every = self.wait(self._cache.pool.request(ops, take_entries), request_id)
            raise_first_error(every)
            return every
        ops = self._key_chunks(kind, spec)
        replies: list[Reply] = []
        errors: list[RegionBusError] = []

        def answered(
            _index: int, got: list[Reply] | None, error: BaseException | None, _sent: bool
        ) -> bool:
            if error is not None:
                errors.append(
                    error if isinstance(error, RegionBusError) else RegionBusError(str(error))
                )
                return False
            assert got is not None
            replies.extend(got)
            failed = next((r for r in got if not r.ok), None)
            if failed is not None:
                errors.append(error_from_wire(failed.error_type, failed.error_message))
                return False
            return True

        sent = send_windowed(
            self._cache.pool,
            ops,
            answered,
            window=REGISTRATION_MESSAGES_IN_FLIGHT,
            take_entries=take_entries,
        )
        if not errors:
            return replies
        if kind is OperationKind.REGISTER_INTEREST and sent:
            self._undo(ops[:sent], errors[0])
        raise errors[0]

    def _key_chunks(self, kind: OperationKind, spec: InterestSpec) -> list[tuple[Operation, int]]:
        """The operations of a key registration: its keys per bucket, in chunks."""
        by_bucket: dict[int, list[str]] = {}
        for key in dict.fromkeys(spec.keys):
            by_bucket.setdefault(self.bucket(key), []).append(key)
        ops: list[tuple[Operation, int]] = []
        for bucket, bucket_keys in by_bucket.items():
            step = KEYS_PER_REGISTRATION_MESSAGE
            for i in range(0, len(bucket_keys), step):
                chunk = spec._replace(keys=tuple(bucket_keys[i : i + step]))
                ops.append((self.operation(kind, interest=chunk), bucket))
        return ops

    def _undo(self, registered: Sequence[tuple[Operation, int]], cause: RegionBusError) -> None:
        """Unregister the keys of registration operations that may have taken effect, each
        in its bucket after the registration (so it undoes it exactly); the cause's message
        says whether that was confirmed."""
        undo = [
            (
                self.operation(OperationKind.UNREGISTER_INTEREST, interest=op.interest),
                bucket,
            )
            for op, bucket in registered
        ]
        confirmed: list[bool] = []

        def answered(
            _index: int, got: list[Reply] | None, error: BaseException | None, _sent: bool
        ) -> bool:
            confirmed.append(error is None and bool(got) and all(r.ok for r in got or ()))
            return confirmed[-1]

        send_windowed(self._cache.pool, undo, answered, window=REGISTRATION_MESSAGES_IN_FLIGHT)
        done = len(confirmed) == len(undo) and all(confirmed)
        cause.args = (
            f"{cause.args[0] if cause.args else cause}; the registration was "
            + ("undone" if done else "not confirmed undone: it may be partly in effect"),
        )


__all__ = [
    "CacheConnection",
    "ServerRegionProxy",
    "raise_first_error",
]
