"""``bench.fleet``'s fleet phase on a tiny scale, on the session's Kafka and Redis: durable
clients registered and away, live subscribers in a process of their own, a paced writer,
raw Kafka's fan-out beside it, and the sampled durable clients coming back. Times are not
asserted (benchmarks are not timed tests); that each figure is there, and those with a
verdict of their own are met, is."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from bench.fleet import markdown_table
from bench.fleet_phases import fleet_phase
from bench.fleet_run import Run
from tests.integration.bench_session import TINY_FLEET, session_stack

_TINY = replace(
    TINY_FLEET,
    phases=("fleet",),
    durable_clients=4,
    live_subscribers=2,
    sampled=2,
    rate=20,
    seconds=3.0,
    connects=2,
)


def test_the_fleet_phase_gives_every_figure_with_the_machines_busy_cores_beside_raw_kafkas(
    kafka_bootstrap_servers: str, redis_url: str, tmp_path: Path
) -> None:
    run = Run(session_stack(kafka_bootstrap_servers, redis_url), tmp_path, Console(quiet=True))

    fleet_phase(run, _TINY)

    figures = {f.figure: f for f in run.figures}
    cores = os.cpu_count() or 1
    busy = figures[f"machine's busy cores during the puts (of {cores})"]
    # Both readings were taken while something was sent: the writer and its readers ran.
    assert 0 < busy.value <= cores + 0.05
    assert 0 < busy.baseline <= cores + 0.05
    assert busy.met is None
    p99 = figures["live subscribers' put→listener p99 at 20/s (ms)"]
    assert p99.value > 0 and p99.baseline > 0
    # A fixed few topics of the namespace, not one per client (the 0.1 goal is per 10,000).
    assert figures["Kafka partitions added per registered client (6)"].value < 1
    (replays,) = [f for f in run.figures if f.figure.startswith("sampled durable clients")]
    assert replays.value == 2 and replays.met is True
    assert not math.isnan(figures["connect, median of 2 (ms)"].value)
    assert f"| fleet | machine's busy cores during the puts (of {cores})" in markdown_table(
        run.figures
    )
