"""The benchmark's child processes and how the parent talks to them.

Readers run in processes of their own (``spawn``: never fork a process that holds
librdkafka threads), so the writer, the readers and the cache server use separate cores.
Here the regionbus kinds: subscribers (``ClientCache``s with an ``ALL_KEYS`` listener) and
a tracking subscriber (which put arrived, in which bucket, and how often); the raw Kafka
kinds (consumers, the two-hop relay, the fan-out relay) are in ``bench.raw_workers``.

Protocol over a duplex pipe: the child sends ``("ready", None)`` once connected; the
parent may send ``("expect", n)`` (stop when every reader has n messages, or when nothing
arrived for ``idle_timeout_s``) or ``("stop", None)``; the child answers
``("result", {...})`` and exits. Children ignore SIGINT (the parent decides when to stop)
and turn SIGTERM into ``SystemExit`` so their clients close.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from types import FrameType, TracebackType
from typing import Any, Self

from bench.server import BenchError
from regionbus.clients import (
    ALL_KEYS,
    BytesSerializer,
    CacheListener,
    ClientCache,
    ClientSettings,
    EntryEvent,
    InterestResultPolicy,
)

log = logging.getLogger("regionbus.bench")

TIMESTAMP_BYTES = 8
"""Every benchmark value starts with its send time: ``time.time_ns()``, 8 bytes big-endian."""

_POLL_INTERVAL_S = 0.02


def stamped_value(value_bytes: int) -> bytes:
    """A value of ``value_bytes`` bytes (at least 8) starting with the send time in ns."""
    return time.time_ns().to_bytes(TIMESTAMP_BYTES, "big") + b"x" * (value_bytes - TIMESTAMP_BYTES)


@dataclass
class Tally:
    """What one reader received: count, first and last receive time, and send times.

    Attributes:
        record_latency: Keep ``(send_ns, receive_ns)`` of every message.
        count: Messages received.
        first_ns: Wall-clock receive time of the first message (``time.time_ns()``).
        last_ns: Wall-clock receive time of the last message.
        sent_ns: Send times read from the values (when ``record_latency``).
        received_ns: Receive times, in the order of ``sent_ns``.
    """

    record_latency: bool
    count: int = 0
    first_ns: int = 0
    last_ns: int = 0
    sent_ns: list[int] = field(default_factory=list)
    received_ns: list[int] = field(default_factory=list)

    def hit(self, value: bytes | None) -> None:
        """Count one message received now."""
        now_ns = time.time_ns()
        if not self.count:
            self.first_ns = now_ns
        self.count += 1
        self.last_ns = now_ns
        if self.record_latency and value is not None and len(value) >= TIMESTAMP_BYTES:
            self.sent_ns.append(int.from_bytes(value[:TIMESTAMP_BYTES], "big"))
            self.received_ns.append(now_ns)


def tallies_result(tallies: list[Tally], status: str, cpu_start_s: float) -> dict[str, Any]:
    return {
        "status": status,
        "cpu_s": time.process_time() - cpu_start_s,
        "counts": [t.count for t in tallies],
        "first_ns": [t.first_ns for t in tallies],
        "last_ns": [t.last_ns for t in tallies],
        "sent_ns": [s for t in tallies for s in t.sent_ns],
        "received_ns": [r for t in tallies for r in t.received_ns],
    }


def wait_until_done(conn: Connection, tallies: list[Tally], idle_timeout_s: float) -> str:
    """Serve the parent's messages until every reader has what it expects, or a stop."""
    expected: int | None = None
    last_total = -1
    last_change = time.monotonic()
    while True:
        if conn.poll(_POLL_INTERVAL_S):
            kind, arg = conn.recv()
            if kind == "stop":
                return "stopped"
            if kind == "expect":
                expected = int(arg)
                last_change = time.monotonic()
        if expected is not None and all(t.count >= expected for t in tallies):
            return "complete"
        total = sum(t.count for t in tallies)
        now = time.monotonic()
        if total != last_total:
            last_total, last_change = total, now
        elif expected is not None and now - last_change > idle_timeout_s:
            return "idle"


def _exit_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def child_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)


# --- regionbus subscribers ---------------------------------------------------------------


class CountingListener(CacheListener):
    """Counts creates and updates (and their latency) into a :class:`Tally`."""

    def __init__(self, tally: Tally) -> None:
        self._tally = tally

    def after_create(self, event: EntryEvent) -> None:
        self._tally.hit(event.new_value_bytes)

    def after_update(self, event: EntryEvent) -> None:
        self._tally.hit(event.new_value_bytes)


def run_subscribers(
    conn: Connection,
    *,
    settings: dict[str, Any],
    region: str,
    clients: int,
    record_latency: bool,
    idle_timeout_s: float,
) -> None:
    """Child: ``clients`` ClientCaches, each with ``ALL_KEYS`` interest and a counting listener.

    Args:
        conn: The pipe to the parent.
        settings: ``ClientSettings`` fields (namespace, bootstrap servers, fetch wait, ...).
        region: The region to subscribe to (values are raw bytes).
        clients: How many client caches (each has its own subscription queue).
        record_latency: Keep send and receive times of every event.
        idle_timeout_s: After ``expect``, give up when nothing arrived for this long.
    """
    child_signals()
    caches: list[ClientCache] = []
    try:
        tallies = [Tally(record_latency) for _ in range(clients)]
        client_settings = ClientSettings(**settings)
        for tally in tallies:
            cache = ClientCache(client_settings, client_id=f"bench-sub-{uuid.uuid4().hex[:10]}")
            caches.append(cache)
            cache.create_region(
                region, listeners=[CountingListener(tally)], serializer=BytesSerializer()
            ).register_interest(ALL_KEYS, InterestResultPolicy.NONE)
        cpu_start_s = time.process_time()
        conn.send(("ready", None))
        status = wait_until_done(conn, tallies, idle_timeout_s)
        conn.send(("result", tallies_result(tallies, status, cpu_start_s)))
    finally:
        for cache in caches:
            with suppress(Exception):
                cache.close()


class _TrackingListener(CacheListener):
    """Records the first arrival of every put (its index from the key ``<prefix>-<i>``, its
    bucket, send and receive time) and counts events of a put that arrive again."""

    def __init__(self, tally: TrackedTally) -> None:
        self._tally = tally
        self._seen: set[int] = set()

    def _record(self, event: EntryEvent) -> None:
        index = int(event.key.rpartition("-")[2])
        if index in self._seen:
            self._tally.listener_duplicates += 1
            return
        self._seen.add(index)
        self._tally.hit(event.new_value_bytes)
        self._tally.indexes.append(index)
        self._tally.buckets.append(event.event_id.bucket if event.event_id else -1)

    def after_create(self, event: EntryEvent) -> None:
        self._record(event)

    def after_update(self, event: EntryEvent) -> None:
        self._record(event)


@dataclass
class TrackedTally(Tally):
    """A :class:`Tally` of distinct puts that also keeps each one's index and bucket.

    Attributes:
        indexes: Put indexes in arrival order (first arrivals only).
        buckets: The bucket of each, from its EventID (-1 without one).
        listener_duplicates: Arrivals of a put already seen (message tracking missed them).
    """

    indexes: list[int] = field(default_factory=list)
    buckets: list[int] = field(default_factory=list)
    listener_duplicates: int = 0


def run_tracking_subscriber(
    conn: Connection, *, settings: dict[str, Any], region: str, idle_timeout_s: float
) -> None:
    """Child: one ClientCache with ``ALL_KEYS`` interest whose listener tracks every put.

    The result adds to the usual tally lists: ``indexes`` and ``buckets`` (first arrivals,
    in the order of ``sent_ns``), ``listener_duplicates``, and the client's subscription
    counters ``duplicates_dropped`` and ``events_received``. ``expect(n)`` waits for ``n``
    distinct puts.

    Args:
        conn: The pipe to the parent.
        settings: ``ClientSettings`` fields.
        region: The region to subscribe to (keys ``<prefix>-<i>``, values stamped bytes).
        idle_timeout_s: After ``expect``, give up when nothing arrived for this long.
    """
    child_signals()
    cache: ClientCache | None = None
    try:
        tally = TrackedTally(record_latency=True)
        cache = ClientCache(
            ClientSettings(**settings), client_id=f"bench-track-{uuid.uuid4().hex[:10]}"
        )
        cache.create_region(
            region, listeners=[_TrackingListener(tally)], serializer=BytesSerializer()
        ).register_interest(ALL_KEYS, InterestResultPolicy.NONE)
        cpu_start_s = time.process_time()
        conn.send(("ready", None))
        status = wait_until_done(conn, [tally], idle_timeout_s)
        stats = cache.subscription_stats
        cache.close()  # no event may arrive while the lists are copied
        result = tallies_result([tally], status, cpu_start_s)
        result.update(
            indexes=list(tally.indexes),
            buckets=list(tally.buckets),
            listener_duplicates=tally.listener_duplicates,
            duplicates_dropped=stats.duplicates_dropped,
            events_received=stats.events_received,
        )
        conn.send(("result", result))
    finally:
        if cache is not None:
            with suppress(Exception):
                cache.close()


# --- the parent's side -----------------------------------------------------------------


class Child:
    """A child process running one of the ``run_*`` functions of this module.

    Args:
        target: The function (called with the pipe and ``kwargs``).
        name: Process name, for logs.
        **kwargs: Its keyword arguments (picklable).

    Use as a context manager: it starts on enter and on exit stops the child, politely
    first (``stop`` message), then SIGTERM, then SIGKILL.
    """

    def __init__(self, target: Callable[..., None], name: str, **kwargs: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe(duplex=True)
        self._process: BaseProcess = context.Process(
            target=target, name=name, args=(child_conn,), kwargs=kwargs, daemon=True
        )
        self.name = name

    @property
    def pid(self) -> int | None:
        """The child's process id once started."""
        return self._process.pid

    def start(self) -> Self:
        """Start the child process."""
        self._process.start()
        log.info("%s started: pid %s", self.name, self._process.pid)
        return self

    def _receive(self, kind: str, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while not self._conn.poll(0.1):
            if not self._process.is_alive():
                raise BenchError(f"{self.name} exited with {self._process.exitcode}")
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: no {kind!r} within {timeout_s} s")
        got, arg = self._conn.recv()
        if got != kind:
            raise BenchError(f"{self.name}: expected {kind!r}, got {got!r}")
        return arg

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait for the child's ``ready``.

        Raises:
            BenchError: the child exited or was not ready within ``timeout_s`` seconds.
        """
        self._receive("ready", timeout_s)

    def expect(self, count: int) -> None:
        """Tell the child how many messages each of its readers should get."""
        self._conn.send(("expect", count))

    def result(self, timeout_s: float) -> dict[str, Any]:
        """Ask the child to finish now and return its result.

        Raises:
            BenchError: the child exited or did not answer within ``timeout_s`` seconds.
        """
        self._conn.send(("stop", None))
        result: dict[str, Any] = self._receive("result", timeout_s)
        return result

    def wait_result(self, timeout_s: float) -> dict[str, Any]:
        """Wait for the result the child sends once its readers are done (after ``expect``).

        Raises:
            BenchError: the child exited or did not answer within ``timeout_s`` seconds.
        """
        result: dict[str, Any] = self._receive("result", timeout_s)
        return result

    def stop(self, timeout_s: float = 15.0) -> None:
        """End the child: a ``stop`` message, then SIGTERM, then SIGKILL. Safe to repeat."""
        if self._process.pid is None:
            return
        if self._process.is_alive():
            with suppress(OSError, ValueError):
                self._conn.send(("stop", None))
            self._process.join(timeout_s)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._conn.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
