"""CPU time used by the processes of a run, so a phase can say where the cores went.

On a 2-core machine every process of the run (writer, server, readers, Kafka, Redis)
competes for the same cores, so operations per second follow CPU time per operation.
Read from ``/proc/<pid>/stat`` (Linux; all threads of the process), and the machine's
busy cores from ``/proc/stat``. Elsewhere the figures are simply absent.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_UTIME_FIELD = 13
_STIME_FIELD = 14


def _clock_ticks_per_s() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return 100


_TICKS_PER_S = _clock_ticks_per_s()


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds a process has used so far; None when unknown.

    Args:
        pid: Process id (its threads are included, its children are not).
    """
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces.
    fields = text[text.rindex(")") + 2 :].split()
    offset = 2
    return (int(fields[_UTIME_FIELD - offset]) + int(fields[_STIME_FIELD - offset])) / _TICKS_PER_S


class CpuMeter:
    """CPU seconds used by named processes between :meth:`start` and :meth:`stop`.

    Args:
        pids: ``{name: pid}``, or ``{name: [pid, ...]}`` for a service of several processes
            (a Redis Cluster's nodes), whose CPU is summed; a None pid (a service not
            started by this run) is skipped.
    """

    def __init__(self, pids: Mapping[str, int | Sequence[int] | None]) -> None:
        self._pids = {
            name: [pid] if isinstance(pid, int) else list(pid)
            for name, pid in pids.items()
            if pid is not None
        }
        self._start: dict[str, float] = {}
        self.used_s: dict[str, float] = {}

    def _read(self, name: str) -> float | None:
        values = [cpu_seconds(pid) for pid in self._pids[name]]
        return None if not values or None in values else sum(v for v in values if v is not None)

    def start(self) -> None:
        """Take the first reading."""
        self._start = {}
        for name in self._pids:
            value = self._read(name)
            if value is not None:
                self._start[name] = value

    def stop(self) -> dict[str, float]:
        """Take the second reading.

        Returns:
            ``{name: CPU seconds used in between}`` for every process read both times.
        """
        self.used_s = {}
        for name, before in self._start.items():
            after = self._read(name)
            if after is not None:
                self.used_s[name] = after - before
        return self.used_s


_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
"""Of ``/proc/stat``'s ``cpu`` line after its name: user, nice, system, irq, softirq, steal
(idle and iowait are the rest)."""


def busy_seconds(proc_stat: str) -> float:
    """CPU seconds every core of the machine spent busy since boot, from ``/proc/stat``'s text.

    Args:
        proc_stat: The text of ``/proc/stat`` (its first line, ``cpu  user nice system idle
            iowait irq softirq steal ...``, in clock ticks, summed over the cores).

    Raises:
        ValueError: the text does not start with an aggregate ``cpu`` line.
    """
    first = proc_stat.split("\n", 1)[0].split()
    if not first or first[0] != "cpu" or len(first) < 9:
        raise ValueError(f"not /proc/stat's aggregate cpu line: {proc_stat[:60]!r}")
    ticks = [int(value) for value in first[1:]]
    return sum(ticks[i] for i in _BUSY_FIELDS) / _TICKS_PER_S


class MachineCpu:
    """How many of the machine's cores were busy, on average, between :meth:`start` and
    :meth:`stop`, whatever process kept them busy.

    A phase whose figure is this close to ``os.cpu_count()`` left nothing spare: its
    latencies then include waits for a core, as any other run at that load would.

    Args:
        path: Where the kernel's CPU counters are (``/proc/stat``; tests give a file).
    """

    def __init__(self, path: Path = Path("/proc/stat")) -> None:
        self._path = path
        self._start: tuple[float, float] | None = None

    def _read(self) -> tuple[float, float] | None:
        try:
            return time.monotonic(), busy_seconds(self._path.read_text())
        except (OSError, ValueError):
            return None

    def start(self) -> None:
        """Take the first reading."""
        self._start = self._read()

    def stop(self) -> float:
        """Take the second reading.

        Returns:
            Busy cores on average since :meth:`start` (0 to the core count); NaN when the
            machine's figures cannot be read (not Linux) or :meth:`start` did not run.
        """
        end = self._read()
        if self._start is None or end is None or end[0] <= self._start[0]:
            return math.nan
        return (end[1] - self._start[1]) / (end[0] - self._start[0])
