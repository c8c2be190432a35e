"""bench.core's headline rows: the machine's busy cores beside each latency phase."""

from __future__ import annotations

import io
import math
import os

from rich.console import Console

from bench.core import print_cpu_per_put, summary_rows
from bench.report import Figures, Latency, Targets, Throughput


def _throughput() -> Throughput:
    return Throughput(10, 10, 0, 1000.0, 1, 10, 1000.0, 1.0, True, {})


def _latency(busy_cores: float) -> Latency:
    return Latency(
        10, 10, 10, 200.0, 4.0, 9.0, 12.0, machine_busy_cores=busy_cores, cpu_s={"server": 0.01}
    )


def _figures(ours: float, relay: float) -> Figures:
    return Figures(
        settings={},
        regionbus_throughput=_throughput(),
        regionbus_latency=_latency(ours),
        raw_throughput=_throughput(),
        raw_fanout=_throughput(),
        raw_relay_latency=_latency(relay),
        targets=Targets(),
    )


def test_the_busy_cores_of_the_latency_phases_are_a_row_beside_the_relays() -> None:
    rows = [r for r in summary_rows(_figures(1.62, 0.71)) if "busy cores" in r.figure]
    assert len(rows) == 1
    row = rows[0]
    assert (row.regionbus, row.baseline, row.higher_is_better) == (1.62, 0.71, False)
    assert row.figure.endswith(f"(of {os.cpu_count()})")


def test_no_busy_cores_row_when_either_phase_could_not_read_them() -> None:
    for ours, relay in ((math.nan, 0.7), (1.6, math.nan)):
        assert not [r for r in summary_rows(_figures(ours, relay)) if "busy cores" in r.figure]


def test_the_cpu_per_put_table_ends_with_the_busy_cores() -> None:
    out = io.StringIO()
    print_cpu_per_put(_figures(1.62, math.nan), Console(file=out, width=120))
    line = next(ln for ln in out.getvalue().splitlines() if "busy cores" in ln)
    assert "1.62" in line and "-" in line
