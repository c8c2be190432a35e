"""How the benchmarks send load: paced at a rate, or pipelined as fast as answers come.

``paced`` calls a send function at a steady rate (latency phases); ``write_async`` keeps
at most a window of ``put_async`` in flight and ``write_put_all`` sends ``put_all`` chunks
(throughput phases); ``Acks`` counts their answers on the pool's reply thread. Every value
is stamped with its send time (``bench.workers.stamped_value``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from bench import progress
from bench.report import NS_PER_S
from bench.services import ACK_TIMEOUT_S
from bench.workers import stamped_value
from regionbus.clients import Region
from regionbus.schemas.errors import BulkOperationError

log = logging.getLogger("regionbus.bench")


@dataclass
class Acks:
    """Completion of pipelined puts, counted on the pool's reply thread.

    Attributes:
        expected: Puts whose answers are awaited.
        acked: Answered with success.
        errors: Answered with an error (or timed out).
        last_ns: Wall-clock time of the latest answer (``time.time_ns()``).
    """

    expected: int
    acked: int = 0
    errors: int = 0
    last_ns: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._all_done = threading.Event()
        if self.expected == 0:
            self._all_done.set()

    def done(self, future: Future[None]) -> None:
        """Count one answer (a done callback of ``put_async``'s future)."""
        now_ns = time.time_ns()
        with self._lock:
            if future.exception() is None:
                self.acked += 1
            else:
                self.errors += 1
            self.last_ns = now_ns
            if self.acked + self.errors >= self.expected:
                self._all_done.set()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for every answer; True when all came."""
        return self._all_done.wait(timeout_s)


def write_async(
    region: Region,
    *,
    ops: int,
    window: int,
    key_space: int,
    value_bytes: int,
    keys: Sequence[str] = (),
) -> tuple[int, Acks]:
    """``put_async`` of ``ops`` stamped values with at most ``window`` puts in flight.

    Args:
        region: The region written (values are raw bytes).
        ops: Puts to send, to keys ``tp-<i mod key_space>``.
        window: Most puts unanswered at a time.
        key_space: Distinct keys.
        value_bytes: Bytes of every value (the first 8 are the send time).
        keys: When given, the keys instead, put in turn (``keys[i mod len(keys)]``).

    Returns:
        ``(start_ns, acks)``: wall-clock time of the first put, and the answers once all
        came (or after 120 s, with a warning).
    """
    acks = Acks(ops)
    progress.counts(lambda: f"{acks.acked + acks.errors:,} of {ops:,} puts answered")
    in_flight = threading.BoundedSemaphore(window)

    def release(future: Future[None]) -> None:
        acks.done(future)
        in_flight.release()

    start_ns = time.time_ns()
    for i in range(ops):
        in_flight.acquire()
        key = keys[i % len(keys)] if keys else f"tp-{i % key_space}"
        region.put_async(key, stamped_value(value_bytes)).add_done_callback(release)
    if not acks.wait(ACK_TIMEOUT_S):
        log.warning("%d of %d puts unanswered", ops - acks.acked - acks.errors, ops)
    return start_ns, acks


def write_put_all(
    region: Region, *, ops: int, chunk: int, key_space: int, value_bytes: int
) -> tuple[int, Acks]:
    """``put_all`` in chunks of ``chunk`` entries, one chunk after the other.

    Args:
        region: The region written (values are raw bytes).
        ops: Entries to put, to keys ``tp-<i mod key_space>``.
        chunk: Entries per ``put_all``.
        key_space: Distinct keys.
        value_bytes: Bytes of every value (the first 8 are the send time).

    Returns:
        ``(start_ns, acks)``, as :func:`write_async`.
    """
    acks = Acks(ops)
    progress.counts(lambda: f"{acks.acked + acks.errors:,} of {ops:,} entries answered")
    start_ns = time.time_ns()
    for first in range(0, ops, chunk):
        indexes = range(first, min(first + chunk, ops))
        entries = {f"tp-{i % key_space}": stamped_value(value_bytes) for i in indexes}
        failed = 0
        try:
            region.put_all(entries)
        except BulkOperationError as exc:
            failed = len(exc.failures)
        acks.acked += len(entries) - failed
        acks.errors += len(indexes) - (len(entries) - failed)
        acks.last_ns = time.time_ns()
    return start_ns, acks


def paced_count(rate: int, seconds: float) -> int:
    """How many sends :func:`paced` makes at ``rate`` per second for ``seconds`` seconds
    (at least one)."""
    return max(1, int(rate * seconds))


def paced(
    send: Callable[[int, bytes], None], rate: int, seconds: float, value_bytes: int
) -> tuple[int, int, int]:
    """Call ``send(i, value)`` ``rate`` times a second for ``seconds`` seconds
    (:func:`paced_count` calls in all).

    Returns:
        ``(sent, first_send_ns, last_send_ns)`` (wall clock).
    """
    total = paced_count(rate, seconds)
    interval_ns = NS_PER_S // rate
    start = time.perf_counter_ns()
    first_ns = time.time_ns()
    last_ns = first_ns
    sent = 0
    progress.counts(lambda: f"{sent:,} of {total:,} sent")
    for i in range(total):
        wait_ns = start + i * interval_ns - time.perf_counter_ns()
        if wait_ns > 0:
            time.sleep(wait_ns / NS_PER_S)
        send(i, stamped_value(value_bytes))
        last_ns = time.time_ns()
        sent += 1
    return total, first_ns, last_ns


def paced_puts(
    region: Region, rate: int, seconds: float, value_bytes: int, keys: Sequence[str] = ()
) -> tuple[int, int, int, int]:
    """A latency phase's writer: ``put_async`` of keys ``lat-<i>`` (or ``keys``, in turn)
    at ``rate`` per second for ``seconds`` seconds, each value stamped with its send time,
    then every answer waited for (``ACK_TIMEOUT_S`` in all; failures are logged, not
    raised).

    Answers are counted as they come (:class:`Acks`), so the writer keeps no object per
    put it sent, as the raw producer beside it keeps none: holding every future made the
    writer's heap grow with the phase, and Python's full collections of it stopped the
    writer 90-160 ms every 8 s at 1,000 puts/s, which the puts stamped then measured.

    Returns:
        ``(sent, acknowledged, first_send_ns, last_send_ns)`` (wall clock).
    """
    acks = Acks(paced_count(rate, seconds))

    def send(i: int, value: bytes) -> None:
        key = keys[i % len(keys)] if keys else f"lat-{i}"
        region.put_async(key, value).add_done_callback(acks.done)

    sent, first_ns, last_ns = paced(send, rate, seconds, value_bytes)
    if not acks.wait(ACK_TIMEOUT_S):
        log.warning("%d of %d latency puts unanswered", sent - acks.acked - acks.errors, sent)
    if acks.errors:
        log.warning("%d latency puts failed", acks.errors)
    return sent, acks.acked, first_ns, last_ns


__all__ = ["Acks", "paced", "paced_count", "paced_puts", "write_async", "write_put_all"]
