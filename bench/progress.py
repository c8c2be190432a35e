"""What a benchmark run on its own says while it runs, and where its logs stay.

A benchmark runs for minutes; under CI, ``nohup`` or a redirect to a file it would print
nothing between its phases, which cannot be told apart from a hang, and its server logs
went to a temporary folder nobody was told about. A benchmark module calls, one line each:

- :func:`heartbeat` around its whole run: without a terminal, a line every
  :data:`regionbus.runtime.heartbeat.DEFAULT_INTERVAL_S` seconds naming the phase, how long it has
  lasted and its counts; at the end, where the logs are kept;
- :func:`log_dir` for the folder its servers and children log to, made at once and kept
  after the run (``.regionbus/bench/logs/<benchmark>/<start time>``, or under
  ``$REGIONBUS_BENCH_LOG_DIR``), printed as ``logs: <path>``;
- :func:`keep_stack_logs` so the embedded Kafka's and Redis' logs (whose folders are
  deleted when they stop) are copied there first;
- :func:`phase` at each phase (prints it, as the modules did already) and :func:`counts`
  where the phase has a counter.

One run per process: the state is this module's, so a phase deep in a helper needs no
handle passed down. Without a :func:`heartbeat` (a test calling a phase directly) the
calls only print.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Final

from rich.console import Console

from regionbus.demo.flights_run import RunLogs
from regionbus.devstack import LocalStack
from regionbus.runtime.heartbeat import DEFAULT_INTERVAL_S, Heartbeat, PhaseStatus, last_line

LOG_DIR_ENV: Final = "REGIONBUS_BENCH_LOG_DIR"
"""Names the parent folder of every benchmark's run folders (default
:data:`DEFAULT_LOG_DIR`)."""

DEFAULT_LOG_DIR: Final = Path(".regionbus") / "bench" / "logs"
"""Relative to the working directory, as the demo's ``.regionbus/demo/logs``."""

INTERVAL_ENV: Final = "REGIONBUS_BENCH_PROGRESS_INTERVAL_S"
"""Seconds between progress lines when below the default (tests make them come sooner)."""


class BenchStatus(PhaseStatus):
    """A :class:`PhaseStatus` whose phase can be given a counter after it began."""

    def counts(self, detail: Callable[[], str]) -> None:
        """Show ``detail()`` on the current phase's lines (must not block)."""
        with self._lock:
            self._detail = detail


_lock = threading.Lock()
_status: BenchStatus | None = None
_run_logs: RunLogs | None = None


def progress_interval_s() -> float:
    """Seconds between progress lines: ``$REGIONBUS_BENCH_PROGRESS_INTERVAL_S`` when shorter
    than :data:`regionbus.runtime.heartbeat.DEFAULT_INTERVAL_S`, else that.

    Raises:
        ValueError: the variable is not a number.
    """
    return min(float(os.environ.get(INTERVAL_ENV) or DEFAULT_INTERVAL_S), DEFAULT_INTERVAL_S)


@contextmanager
def heartbeat(
    stream: Console | None = None, interval_s: float | None = None
) -> Iterator[BenchStatus]:
    """Print a progress line every ``interval_s`` seconds while the body runs, unless
    stdout is a terminal; at the end print where the logs are kept.

    Args:
        stream: Where the lines go (default: a console on stdout).
        interval_s: Seconds between lines (default :func:`progress_interval_s`).

    Yields:
        The run's status, which :func:`phase` and :func:`counts` keep current.

    Raises:
        ValueError: ``interval_s`` or ``$REGIONBUS_BENCH_PROGRESS_INTERVAL_S`` is not a
            positive number.
    """
    global _status, _run_logs
    console = stream or Console()
    if interval_s is None:
        interval_s = progress_interval_s()
    status = BenchStatus("starting Kafka, Redis and the servers")
    beat = Heartbeat(status, console.file, interval_s=interval_s, enabled=not console.is_terminal)
    with _lock:
        _status = status
    try:
        with beat:
            yield status
    finally:
        with _lock:
            kept, _status, _run_logs = _run_logs, None, None
        if kept is not None:
            console.print(
                f"logs kept in {kept.path}", highlight=False, markup=False, soft_wrap=True
            )


def log_dir(benchmark: str, console: Console | None = None) -> Path:
    """Make this run's log folder, print ``logs: <path>``, and return it.

    Args:
        benchmark: The benchmark's name, e.g. ``"core"`` (a folder level).
        console: Where the line goes (default: a console on stdout).

    Returns:
        ``$REGIONBUS_BENCH_LOG_DIR`` (default :data:`DEFAULT_LOG_DIR`)
        ``/<benchmark>/<YYYYmmdd-HHMMSS>``, absolute; it is never deleted.

    Raises:
        OSError: the folder cannot be made.
    """
    global _run_logs
    logs = RunLogs(Path(os.environ.get(LOG_DIR_ENV) or DEFAULT_LOG_DIR) / benchmark)
    with _lock:
        _run_logs = logs
    (console or Console()).print(
        f"logs: {logs.path}", highlight=False, markup=False, soft_wrap=True
    )
    return logs.path


def current_log_dir() -> Path:
    """This run's log folder, as :func:`log_dir` made it.

    Raises:
        RuntimeError: :func:`log_dir` was not called in this run.
    """
    with _lock:
        logs = _run_logs
    if logs is None:
        raise RuntimeError("no log folder yet: call log_dir first")
    return logs.path


@contextmanager
def keep_stack_logs(stack: LocalStack) -> Iterator[None]:
    """Copy the embedded Kafka's and Redis' logs into the run's :func:`log_dir` when the
    body ends; enter it after the stack, so it runs before the stack deletes their
    folders. Best effort; nothing without a log folder."""
    try:
        yield
    finally:
        with _lock:
            logs = _run_logs
        if logs is not None:
            logs.keep_stack_logs(stack)


def embedded_stack(
    stack: ExitStack, benchmark: str, console: Console, *, announce: bool = True
) -> tuple[LocalStack, Path]:
    """Start the embedded Kafka and Redis for a benchmark's run, keep their logs in its
    :func:`log_dir`, and say where all of it is.

    Args:
        stack: Closes the stack (and copies its logs) when it unwinds.
        benchmark: The benchmark's name (its log folder).
        console: Where the addresses and the log folder are printed.
        announce: Print them here; False for a caller that prints its own line (with its
            server's pid, say).

    Returns:
        The started stack and the run's log folder.

    Raises:
        StackError: Kafka or Redis could not be started.
    """
    work_dir = log_dir(benchmark, console)
    local = stack.enter_context(LocalStack(use_docker=False))
    stack.enter_context(keep_stack_logs(local))
    if announce:
        console.print(
            f"kafka {local.kafka_bootstrap_servers} ({local.kafka_source}), redis "
            f"{local.redis_url} ({local.redis_source}), logs in {work_dir}",
            style="dim",
        )
    return local, work_dir


def phase(console: Console, text: str, detail: Callable[[], str] | None = None) -> None:
    """Print ``text`` and make it the run's phase (the heartbeat's line).

    Args:
        console: Where ``text`` is printed now.
        text: What the benchmark does now, e.g. ``"(a) regionbus: 10,000 puts ..."``.
        detail: A counter for the heartbeat's line (must not block); None for none.
    """
    console.print(text, highlight=False)
    with _lock:
        status = _status
    if status is not None:
        status.phase(text.removesuffix(" ..."), detail)


def counts(detail: Callable[[], str]) -> None:
    """Show ``detail()`` on the heartbeat's lines until the next phase, e.g.
    ``lambda: f"{acks.acked:,} of {ops:,} puts answered"``; nothing without a heartbeat."""
    with _lock:
        status = _status
    if status is not None:
        status.counts(detail)


__all__ = [
    "DEFAULT_LOG_DIR",
    "INTERVAL_ENV",
    "LOG_DIR_ENV",
    "BenchStatus",
    "counts",
    "embedded_stack",
    "heartbeat",
    "keep_stack_logs",
    "last_line",
    "log_dir",
    "phase",
    "progress_interval_s",
]
