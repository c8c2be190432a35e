"""The replayer: sends the flights timeline through a ``PROXY`` region, pipelined.

Throughput must never hinge on one round trip per operation (ARCHITECTURE.md), so:

- a day's creates go out with ``put_all`` in chunks (each chunk pipelined; the call
  returns when every create is answered, so the dashboard can register the day's keys
  right after, before most of the day's departures);
- departures, arrivals and cancellations go out with ``put_async`` / ``destroy_async``,
  at most ``max_in_flight`` unanswered at a time (when full, wait for the oldest).

Per key the order holds without waiting: a key's operations go to one Kafka partition
(its bucket) from one producer, and the server applies a partition in order.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from regionbus.clients import Region
from regionbus.demo.flights_data import DaySchedule, FlightOp, Stage
from regionbus.schemas.errors import BulkOperationError, RegionBusError

_PROGRESS_EVERY_OPS = 1_000
_FAILURES_KEPT = 3


class ReplayError(RegionBusError):
    """An operation of the replay went unanswered."""


class Pacer:
    """Sleeps so that simulated time advances ``speed`` seconds per real second.

    Args:
        speed: Simulated seconds per real second; 0 never sleeps (as fast as possible).
    """

    def __init__(self, speed: float) -> None:
        self._speed = speed
        self._origin: tuple[float, int] | None = None

    def wait_for(self, minute: int) -> None:
        """Sleep until simulated ``minute`` (minutes since 2013-01-01 00:00) is due."""
        if self._speed <= 0:
            return
        if self._origin is None:
            self._origin = (time.monotonic(), minute)
            return
        started, first_minute = self._origin
        delay_s = started + (minute - first_minute) * 60 / self._speed - time.monotonic()
        if delay_s > 0:
            time.sleep(delay_s)


@dataclass
class Tally:
    """Operations acknowledged and refused so far.

    Attributes:
        applied: Operations the server acknowledged.
        failed: Operations the server refused.
        failures: ``"key: error"`` of the first few refusals.
    """

    applied: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)

    def fail(self, key: str, exc: BaseException) -> None:
        """Count a refused operation."""
        self.failed += 1
        if len(self.failures) < _FAILURES_KEPT:
            self.failures.append(f"{key}: {type(exc).__name__}: {exc}")


class Replayer:
    """Sends operations through a region with bounded pipelining.

    Args:
        region: A ``PROXY`` region ``flights`` of the replayer's cache.
        create_chunk: Creates per ``put_all`` call.
        max_in_flight: Updates and destroys sent but not yet answered, at most.
        answer_timeout_s: Longest wait for one operation's answer, in seconds.
        check_server: Raises if the cache server died (called when an answer is late).
    """

    def __init__(
        self,
        region: Region,
        create_chunk: int,
        max_in_flight: int,
        answer_timeout_s: float,
        check_server: Callable[[], None],
    ) -> None:
        self.region = region
        self.create_chunk = create_chunk
        self.max_in_flight = max_in_flight
        self.answer_timeout_s = answer_timeout_s
        self.check_server = check_server
        self.tally = Tally()
        self._window: deque[tuple[str, Future[None]]] = deque()

    def creates(self, ops: list[FlightOp]) -> None:
        """Put a day's creates in chunks; return when every one is answered.

        Raises:
            ServerTimeoutError: a chunk was not fully answered within the client's
                ``read_timeout_ms``.
        """
        for start in range(0, len(ops), self.create_chunk):
            chunk = ops[start : start + self.create_chunk]
            try:
                self.region.put_all({op.key: op.value for op in chunk})
                self.tally.applied += len(chunk)
            except BulkOperationError as exc:
                self.tally.applied += len(chunk) - len(exc.failures)
                for key, error in exc.failures.items():
                    self.tally.fail(key, error)

    def send(self, op: FlightOp) -> None:
        """Send one update or destroy, first settling the oldest if the window is full.

        Raises:
            ReplayError: the oldest operation went unanswered for ``answer_timeout_s``.
        """
        if len(self._window) >= self.max_in_flight:
            self._settle(*self._window.popleft())
        if op.stage is Stage.DESTROY:
            future = self.region.destroy_async(op.key)
        else:
            future = self.region.put_async(op.key, op.value)
        self._window.append((op.key, future))

    def drain(self) -> None:
        """Wait for every operation in flight.

        Raises:
            ReplayError: one went unanswered for ``answer_timeout_s``.
        """
        while self._window:
            self._settle(*self._window.popleft())

    def _settle(self, key: str, future: Future[None]) -> None:
        try:
            future.result(self.answer_timeout_s)
        except TimeoutError:
            self.check_server()
            raise ReplayError(f"no answer for {key!r} within {self.answer_timeout_s} s") from None
        except RegionBusError as exc:
            self.tally.fail(key, exc)
            return
        self.tally.applied += 1


def progress_bar(console: Console, enabled: bool) -> Progress:
    """A rich progress bar (date, bar, done/total, ops/s, times); off unless ``enabled``
    and the console is a terminal."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled or not console.is_terminal,
        refresh_per_second=4,
    )


def replay(
    days: Iterable[DaySchedule],
    replayer: Replayer,
    on_day_published: Callable[[DaySchedule], None],
    speed: float,
    progress: Progress,
    total_ops: int,
) -> None:
    """Send the whole timeline and wait for every answer.

    Args:
        days: The timeline, a day at a time.
        replayer: Sends the operations.
        on_day_published: Called once a day's creates are all answered (the dashboard
            registers the day then); must not block.
        speed: Simulated seconds per real second; 0 is as fast as possible.
        progress: Where to show progress.
        total_ops: Operations in the timeline (the bar's total).

    Raises:
        ReplayError: an operation went unanswered.
        ServerTimeoutError: a ``put_all`` chunk went unanswered.
        ServerProcessError: the cache server exited.
    """
    pacer = Pacer(speed)
    task = progress.add_task("replay", total=total_ops, rate="")
    sent = 0
    started = time.monotonic()
    next_update = _PROGRESS_EVERY_OPS
    for day in days:
        if day.creates:
            pacer.wait_for(day.creates[0].minute)
        replayer.creates(day.creates)
        on_day_published(day)
        sent += len(day.creates)
        for op in day.events:
            pacer.wait_for(op.minute)
            replayer.send(op)
            sent += 1
            if sent >= next_update:
                next_update = sent + _PROGRESS_EVERY_OPS
                rate = sent / max(time.monotonic() - started, 1e-9)
                progress.update(
                    task, completed=sent, description=str(day.date), rate=f"{rate:,.0f} ops/s"
                )
        replayer.check_server()
    replayer.drain()
    progress.update(task, completed=sent, description="replay done")


__all__ = ["Pacer", "ReplayError", "Replayer", "Tally", "progress_bar", "replay"]
