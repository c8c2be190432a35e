"""``bench.cpu``'s machine-wide reading: busy seconds from ``/proc/stat``'s aggregate line,
and the busy cores between two readings."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import pytest

from bench.cpu import MachineCpu, busy_seconds

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# user nice system idle iowait irq softirq steal guest guest_nice
_STAT = "cpu  100 20 30 5000 70 4 6 10 0 0\ncpu0 50 10 15 2500 35 2 3 5 0 0\nintr 1 2 3\n"


def test_busy_seconds_count_user_nice_system_irq_softirq_and_steal_not_idle_or_iowait() -> None:
    assert busy_seconds(_STAT) == pytest.approx((100 + 20 + 30 + 4 + 6 + 10) / _TICKS_PER_S)


@pytest.mark.parametrize("text", ["", "intr 1 2 3\n", "cpu0 1 2 3 4 5 6 7 8\n", "cpu 1 2\n"])
def test_text_without_the_aggregate_cpu_line_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="aggregate cpu line"):
        busy_seconds(text)


def test_an_unreadable_source_or_a_stop_without_start_gives_nan(tmp_path: Path) -> None:
    missing = MachineCpu(tmp_path / "no-such-stat")
    missing.start()
    assert math.isnan(missing.stop())
    stat = tmp_path / "stat"
    stat.write_text(_STAT)
    assert math.isnan(MachineCpu(stat).stop())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc/stat")
def test_a_busy_loop_shows_as_at_least_half_a_core_and_never_more_than_the_machine_has() -> None:
    # Whatever else runs can only add to the machine's busy time: if this loop is kept
    # from its core, something else is keeping that core busy.
    meter = MachineCpu()
    meter.start()
    end = time.monotonic() + 0.5
    spins = 0
    while time.monotonic() < end:
        spins += 1
    cores = meter.stop()
    assert spins > 0
    machine = os.cpu_count() or 1
    # The kernel counts in clock ticks: each core's count may be a tick ahead at either end.
    ticks_of_slack = 2 * machine / (_TICKS_PER_S * 0.5)
    assert 0.5 <= cores <= machine + ticks_of_slack
