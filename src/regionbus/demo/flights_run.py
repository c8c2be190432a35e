"""What the flights demo says while it runs, where it keeps its logs, and how long its
durable desk may stay away.

- :class:`DemoStatus` is the line a :class:`regionbus.runtime.heartbeat.Heartbeat` prints every few
  seconds when no progress bar is drawn (output not a terminal, or ``--no-progress``).
- :class:`RunLogs` is the run's log folder (``.regionbus/demo/logs/<start time>`` by
  default): the cache server writes ``server.log`` there, and Kafka's and Redis' logs are
  copied in when the run ends, so the explanation of a failure outlives the run.
- :func:`durable_timeout_s` sizes the operations desk's ``durable_client_timeout_s`` to
  the replay, so a machine several times slower than a quiet one does not see the desk
  reaped while it is away.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Final

from rich.progress import Progress

from regionbus.devstack import LocalStack
from regionbus.runtime.heartbeat import PhaseStatus

DEFAULT_LOG_DIR: Final = Path(".regionbus") / "demo" / "logs"

QUIET_MACHINE_OPS_PER_S: Final = 2_000
"""Replay rate of the whole year on a quiet 2-core machine (1,001,615 operations in about
8 minutes), the basis of :func:`durable_timeout_s` for an unpaced replay."""

SLOW_MACHINE_FACTOR: Final = 3
"""How much slower than a quiet machine the demo must survive."""

MIN_DURABLE_TIMEOUT_S: Final = 300
"""Geode's ``durable-client-timeout`` default, the floor."""


def durable_timeout_s(operations: int, days: int, speed: float) -> int:
    """The operations desk's ``durable_client_timeout_s`` for a replay.

    The desk is away for a third of the replay; the timeout covers the whole replay's
    expected length on a machine :data:`SLOW_MACHINE_FACTOR` times slower than a quiet one,
    so it is never the reason the desk is reaped.

    Args:
        operations: Operations in the timeline.
        days: Days replayed.
        speed: Simulated seconds per real second; 0 is as fast as possible.

    Returns:
        Seconds, at least :data:`MIN_DURABLE_TIMEOUT_S`.
    """
    replay_s = operations / QUIET_MACHINE_OPS_PER_S
    if speed > 0:
        replay_s = max(replay_s, days * 86_400 / speed)
    return max(MIN_DURABLE_TIMEOUT_S, math.ceil(SLOW_MACHINE_FACTOR * replay_s))


class DemoStatus(PhaseStatus):
    """What the demo is doing now, for the heartbeat line. Thread-safe.

    The replay phase reads the replay's progress (a rich ``Progress`` keeps its counts
    even when it draws nothing).
    """

    def replay(self, progress: Progress) -> None:
        """Enter the replay phase, whose line shows ``progress``'s first task."""
        self.phase("replay", lambda: _progress_line(progress))


def _progress_line(progress: Progress) -> str:
    if not progress.tasks:
        return ""
    task = progress.tasks[0]
    total = task.total or 0
    share = f" ({100 * task.completed / total:.1f} %)" if total else ""
    rate = task.fields.get("rate", "")
    return (
        f"{task.description}, {task.completed:,.0f} of {total:,.0f} operations{share}"
        f"{', ' + rate if rate else ''}"
    )


class RunLogs:
    """One run's log folder, made at once and kept after the run.

    Args:
        base: Parent folder of the runs' folders (default :data:`DEFAULT_LOG_DIR`).

    Attributes:
        path: ``base/<YYYYmmdd-HHMMSS>`` (a suffix when two runs start in one second).
    """

    def __init__(self, base: Path = DEFAULT_LOG_DIR) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = base / stamp
        suffix = 1
        while path.exists():
            suffix += 1
            path = base / f"{stamp}-{suffix}"
        path.mkdir(parents=True)
        self.path = path.resolve()

    def keep_stack_logs(self, stack: LocalStack) -> None:
        """Copy the embedded Kafka's and Redis' logs here (their folders are temporary): a
        cluster node's as ``<node folder>-<log name>``; best effort: a log that cannot be
        copied is left out."""
        clustered = stack.kafka_cluster is not None or stack.redis_cluster is not None
        for path in stack.log_paths:
            name = (
                f"{path.parent.parent.name}-{path.parent.name}-{path.name}"
                if clustered
                else path.name
            )
            if path.exists():
                try:
                    shutil.copyfile(path, self.path / name)
                except OSError:
                    continue


__all__ = [
    "DEFAULT_LOG_DIR",
    "MIN_DURABLE_TIMEOUT_S",
    "QUIET_MACHINE_OPS_PER_S",
    "SLOW_MACHINE_FACTOR",
    "DemoStatus",
    "RunLogs",
    "durable_timeout_s",
]
