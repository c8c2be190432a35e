"""bench.core's phase (t): the tracing overhead is read from the medians of its rounds."""

from __future__ import annotations

import pytest

from bench.report import Throughput
from bench.tracing import TracingFigures, tracing_rows


def _round(ops_per_s: float, server_cpu_s: float) -> Throughput:
    return Throughput(
        sent=1000,
        acked=1000,
        errors=0,
        acked_per_s=ops_per_s,
        readers=10,
        delivered=10_000,
        delivered_per_s=ops_per_s * 10,
        per_reader_per_s=ops_per_s,
        complete=True,
        cpu_s={"writer": 0.1, "server": server_cpu_s, "readers": 0.3},
    )


def test_the_overheads_compare_the_medians_of_the_rounds() -> None:
    figures = TracingFigures(
        off=[_round(900, 0.2), _round(1000, 0.2), _round(500, 0.4)],
        on=[_round(950, 0.22), _round(800, 0.22), _round(100, 0.9)],
    )
    assert figures.ops_per_s(False) == 900
    assert figures.ops_per_s(True) == 800
    assert figures.overhead == pytest.approx(1 - 800 / 900)
    assert figures.cpu_us(False, "server") == pytest.approx(200)
    assert figures.cpu_us(True, "all") == pytest.approx(620)
    assert figures.cpu_overhead == pytest.approx(620 / 600 - 1)
    ops, cpu = tracing_rows(figures)
    assert (ops.regionbus, ops.baseline, ops.higher_is_better) == (800, 900, True)
    assert cpu.regionbus == pytest.approx(620)
    assert cpu.higher_is_better is False
