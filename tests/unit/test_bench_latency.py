"""``bench.report.latency``: percentiles past the warm-up, and the readers' CPU per message."""

from __future__ import annotations

import math

from bench.report import latency

_MS = 1_000_000


def _readers(**extra: object) -> dict[str, object]:
    # Three messages sent 0, 10 and 20 ms after the start, each received 5 ms later.
    return {
        "counts": [2, 1],
        "sent_ns": [0, 10 * _MS, 20 * _MS],
        "received_ns": [5 * _MS, 15 * _MS, 25 * _MS],
        **extra,
    }


def test_the_readers_cpu_is_divided_by_the_messages_they_received() -> None:
    figures = latency(
        sent=3, start_ns=0, end_ns=20 * _MS, warmup_s=0.0, readers=_readers(cpu_s=0.3)
    )
    assert (figures.received, figures.p50_ms, figures.p99_ms) == (3, 5.0, 5.0)
    assert math.isclose(figures.readers_cpu_s, 0.3)
    assert math.isclose(figures.readers_cpu_us_per_message, 100_000.0)


def test_without_the_readers_cpu_the_figure_is_not_a_number() -> None:
    figures = latency(sent=3, start_ns=0, end_ns=20 * _MS, warmup_s=0.0, readers=_readers())
    assert math.isnan(figures.readers_cpu_us_per_message)
    nothing = latency(
        sent=0,
        start_ns=0,
        end_ns=0,
        warmup_s=0.0,
        readers={"counts": [], "sent_ns": [], "received_ns": [], "cpu_s": 1.0},
    )
    assert math.isnan(nothing.readers_cpu_us_per_message)


def test_the_machines_busy_cores_are_carried_when_measured_and_nan_when_not() -> None:
    measured = latency(
        sent=3,
        start_ns=0,
        end_ns=20 * _MS,
        warmup_s=0.0,
        readers=_readers(),
        machine_busy_cores=1.75,
    )
    assert measured.machine_busy_cores == 1.75
    unmeasured = latency(sent=3, start_ns=0, end_ns=20 * _MS, warmup_s=0.0, readers=_readers())
    assert math.isnan(unmeasured.machine_busy_cores)
