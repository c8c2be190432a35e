"""Read-through: a server ``CacheLoader`` loads what a ``get`` misses (Geode ``CacheLoader``).

How it works:

- Who loads. The bucket's primary, which reads the get. A get that finds no value (no
  entry, or an invalid one: Geode loads then too) in a region with a loader starts a load,
  or joins the one running for that key: concurrent misses of one key load once (Geode's
  ``SearchLoadAndWriteProcessor`` does the same per key).
- Where it runs. On one of ``loader_threads`` worker threads, never on the server's loop:
  other clients' operations go on meanwhile. A load gets ``loader_timeout_ms``; at most
  ``max_pending_loads`` run or wait at once on a server, and a miss beyond that is answered
  ``CacheLoaderError`` at once (no client makes the others wait).
- How the value travels. A loaded value is not written from the worker: the primary
  produces a ``LOAD_CREATE`` operation (Geode ``Operation.NET_LOAD_CREATE``) to the
  bucket's partition of ``{ns}.ops``, signed as the servers' with security on, with an
  EventID of :data:`regionbus.schemas.eventid.LOAD_MEMBER` (a thread drawn by each server
  process, a sequence per process). Read in the bucket's order like any change, it creates
  the entry only when the key still has no value (``apply_entry.lua``): a put that came
  first wins, and the gets are answered with that value instead. It is distributed as a
  create (an update of an invalid entry) whose ``EntryEvent.is_load`` is true, and its
  offset is committed only once its events are delivered, as any change's.
- What a get hears. Every get waiting on the load is answered when its ``LOAD_CREATE`` is
  applied: the value; None when the loader returned None (nothing is created); or
  ``CacheLoaderError`` when it raised or ran out of time.

High availability: a primary that dies after producing a ``LOAD_CREATE`` loses nothing;
its successor applies it (or recognises it by its EventID) and delivers its events. The
gets that waited on the dead primary are not answered by the successor: they fail at the
client's ``read_timeout_ms`` and may be asked again, which finds the created entry.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from regionbus.broker.config import ServerSettings
from regionbus.broker.outbox import DeliveryReport, Outbox
from regionbus.broker.plugins import ServerPlugins
from regionbus.broker.security import SecurityGuard
from regionbus.runtime.leases import wall_clock_ms
from regionbus.schemas.addressing import ClientAddress
from regionbus.schemas.callbacks import LoaderHelper
from regionbus.schemas.codec import encode
from regionbus.schemas.errors import CacheLoaderError, RegionBusError
from regionbus.schemas.eventid import LOAD_MEMBER, EventID
from regionbus.schemas.messages import Operation, OperationKind, Reply
from regionbus.schemas.serializers import plain_bytes

log = logging.getLogger("regionbus.server.loading")


def loaded_bytes(value: Any) -> tuple[bytes, str]:
    """A loader's value as stored (`regionbus.schemas.serializers.plain_bytes`): ``bytes``
    as they are (serializer ``bytes``), anything else as JSON (serializer ``json``).

    Raises:
        SerializationError: the value is not JSON-serializable.
    """
    return plain_bytes(value)


def produce_operation(
    outbox: Outbox,
    security: SecurityGuard | None,
    op: Operation,
    bucket: int,
    on_delivery: DeliveryReport | None = None,
) -> None:
    """Produce an operation of this server to its bucket's partition of ``{ns}.ops``,
    signed as the servers' when security is on: it is read and applied in the bucket's
    order like any client's (a loader's create, a function's changes)."""
    framed = encode(op)
    topic = outbox.topics.ops
    headers = None if security is None else security.server_headers(topic, bucket, framed)
    key = None if op.key is None else op.key.encode()
    outbox.produce(topic, framed, key, partition=bucket, on_delivery=on_delivery, headers=headers)


@dataclass
class _Load:
    """One key's load: the gets waiting on it, and where it is."""

    future: Future[Any]
    bucket: int
    waiters: list[Operation]
    deadline_s: float
    produced: bool = False


class EntryLoads:
    """The loads of this server's buckets.

    Args:
        settings: ``loader_threads``, ``loader_timeout_ms``, ``max_pending_loads``.
        plugins: The regions' loaders.
        outbox: Produces the ``LOAD_CREATE`` operations, and the replies.
        security: Signs the ``LOAD_CREATE`` operations when security is on.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        settings: ServerSettings,
        plugins: ServerPlugins,
        outbox: Outbox,
        security: SecurityGuard | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._plugins = plugins
        self._outbox = outbox
        self._security = security
        self._clock = clock
        self._timeout_s = settings.loader_timeout_ms / 1000
        self._executor: ThreadPoolExecutor | None = None
        self._loads: dict[tuple[str, str], _Load] = {}
        # A thread of its own per server process: a restarted server's loads start a new
        # sequence, never below its last run's in the same thread.
        self._thread = secrets.randbits(31) + 1
        self._sequence = 0

    def __len__(self) -> int:
        return len(self._loads)

    def miss(self, get: Operation, bucket: int) -> bool:
        """A get found no value: load it, or join the load of its key running now.

        Returns:
            False when its region has no loader (the miss is answered as such); True when
            the get is answered later, or was answered ``CacheLoaderError`` now (too many
            loads pending).
        """
        loader = self._plugins.loaders.get(get.region)
        if loader is None:
            return False
        assert get.key is not None
        running = self._loads.get((get.region, get.key))
        if running is not None:
            running.waiters.append(get)
            return True
        if len(self._loads) >= self._settings.max_pending_loads:
            self._outbox.reply_error(
                get,
                bucket,
                CacheLoaderError(
                    f"{len(self._loads)} loads pending on this server already "
                    f"(max_pending_loads); {get.key!r} of {get.region!r} was not loaded"
                ),
            )
            return True
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                self._settings.loader_threads, thread_name_prefix="cache-loader"
            )
        helper = LoaderHelper(get.region, get.key, get.callback_argument)
        self._loads[(get.region, get.key)] = _Load(
            self._executor.submit(loader.load, helper),
            bucket,
            [get],
            self._clock() + self._timeout_s,
        )
        return True

    def poll(self) -> bool:
        """At each turn of the loop: produce the ``LOAD_CREATE`` of every load done, answer
        the gets of a load that returned None or failed, and fail the loads past their
        ``loader_timeout_ms`` (a loader that hangs keeps its thread; its result is dropped).

        Returns:
            Whether any get was answered here (the caller sends the replies).
        """
        if not self._loads:
            return False
        before = len(self._loads)
        now = self._clock()
        for place, load in list(self._loads.items()):
            if load.produced or not load.future.done():
                if now >= load.deadline_s:
                    self._fail(
                        place,
                        CacheLoaderError(
                            f"loading {place[1]!r} of {place[0]!r} took longer than "
                            f"loader_timeout_ms={self._settings.loader_timeout_ms}"
                        ),
                    )
                continue
            try:
                value = load.future.result()
                data = None if value is None else loaded_bytes(value)
            except RegionBusError as exc:
                self._fail(place, CacheLoaderError(f"loading {place[1]!r}: {exc}"))
                continue
            except Exception as exc:  # the loader is the application's code
                log.warning("the loader of %s failed on %r: %r", place[0], place[1], exc)
                self._fail(place, CacheLoaderError(f"the loader of {place[0]!r} failed: {exc!r}"))
                continue
            if data is None:
                self._answer(place, None, None, None)
                continue
            self._produce(place, load, *data)
            load.produced = True
            load.deadline_s = now + self._timeout_s
        return len(self._loads) < before  # an answered load is forgotten

    def _produce(self, place: tuple[str, str], load: _Load, value: bytes, serializer: str) -> None:
        region, key = place
        first, bucket = load.waiters[0], load.bucket
        op = Operation(
            request_id=0,
            client_id=self._settings.member_id,
            kind=OperationKind.LOAD_CREATE,
            region=region,
            timestamp_ms=wall_clock_ms(),
            event_id=EventID(LOAD_MEMBER, self._thread, self._sequence, bucket),
            key=key,
            value=value,
            serializer=serializer,
            callback_argument=first.callback_argument,
        )
        self._sequence += 1
        produce_operation(self._outbox, self._security, op, bucket)

    def applied(
        self,
        load_create: Operation,
        value: bytes | None,
        serializer: str | None,
        version: int | None,
    ) -> None:
        """A ``LOAD_CREATE`` was applied, or found the key valued (then ``value`` is that
        value): answer every get waiting on its load here."""
        assert load_create.key is not None
        self._answer((load_create.region, load_create.key), value, serializer, version)

    def _answer(
        self,
        place: tuple[str, str],
        value: bytes | None,
        serializer: str | None,
        version: int | None,
    ) -> None:
        load = self._loads.pop(place, None)
        if load is None:
            return
        for get in load.waiters:
            self._outbox.reply(
                Reply(
                    request_id=get.request_id,
                    bucket=load.bucket,
                    ok=True,
                    found=value is not None,
                    version=version,
                    value=value,
                    serializer=serializer,
                ),
                ClientAddress.of(get),
            )

    def failed(self, load_create: Operation, error: RegionBusError) -> None:
        """A ``LOAD_CREATE`` was refused (a server writer vetoed it): its gets hear why."""
        assert load_create.key is not None
        self._fail((load_create.region, load_create.key), error)

    def _fail(self, place: tuple[str, str], error: RegionBusError) -> None:
        load = self._loads.pop(place, None)
        if load is None:
            return
        for get in load.waiters:
            self._outbox.reply_error(get, load.bucket, error)

    def close(self) -> None:
        """The server stops: forget the loads (their gets fail at the clients' timeout)
        and close the loaders (Geode ``CacheCallback.close``)."""
        self._loads.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        for region, loader in self._plugins.loaders.items():
            try:
                loader.close()
            except Exception:  # the loader is the application's code
                log.exception("closing the loader of %s", region)


__all__ = ["EntryLoads", "loaded_bytes", "produce_operation"]
