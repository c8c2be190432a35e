"""CPU time used by the processes of a run, so a phase can say where the cores went.

On a 2-core machine every process of the run (writer, server, readers, Kafka, Redis)
competes for the same cores, so operations per second follow CPU time per operation.
Read from ``/proc/<pid>/stat`` (Linux; all threads of the process). Elsewhere the
figures are simply absent.
"""

from __future__ import annotations

import os
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
