"""``bench.fleet``'s fan-out phase on a tiny scale, on the session's Kafka and Redis: durable
clients sharing ``ALL_KEYS`` registered in two steps and left away, the cache server's CPU
per put (and without puts) read at each step, and the first of them coming back to replay
every put. Times are not asserted (benchmarks are not timed tests); that each figure is
there and the replay complete are."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from bench.fleet import markdown_table
from bench.fleet_fanout import fanout_phase
from bench.fleet_run import Run
from tests.integration.bench_session import TINY_FLEET, session_stack

_OPS = 150

_TINY = replace(TINY_FLEET, phases=("fanout",), fanout_subscribers=(1, 3), fanout_ops=_OPS)


def test_the_fanout_phase_reads_the_server_cpu_per_put_at_each_count_and_routes_to_those_away(
    kafka_bootstrap_servers: str, redis_url: str, tmp_path: Path
) -> None:
    # Kafka is the session's, not the run's: the broker's CPU is not read.
    run = Run(session_stack(kafka_bootstrap_servers, redis_url), tmp_path, Console(quiet=True))

    fanout_phase(run, _TINY)

    server = [f for f in run.figures if f.figure.startswith("server CPU per put,")]
    assert [f.figure for f in server] == [
        "server CPU per put, 1 subscriber sharing ALL_KEYS (µs)",
        "server CPU per put, 3 subscribers sharing ALL_KEYS (µs)",
    ]
    assert all(f.value > 0 for f in server)
    first, second = server
    assert first.met is None and math.isnan(first.baseline), "the first step is the baseline"
    assert second.baseline == first.value and second.met is not None
    kafka = [f for f in run.figures if f.figure.startswith("Kafka broker CPU")]
    assert len(kafka) == 2 and all(math.isnan(f.value) for f in kafka)
    idle = [f for f in run.figures if f.figure.startswith("server CPU without puts")]
    assert [f.figure for f in idle] == [
        "server CPU without puts, 1 subscriber registered (ms per s)",
        "server CPU without puts, 3 subscribers registered (ms per s)",
    ]
    assert all(f.value >= 0 for f in idle)
    above = [f for f in run.figures if f.figure.startswith("server CPU per put above that")]
    assert len(above) == 2 and all(not math.isnan(f.value) for f in above)
    assert all(a.value <= s.value for a, s in zip(above, server, strict=True))
    (replay,) = [f for f in run.figures if "replayed before its marker" in f.figure]
    assert replay.value == 2 * _OPS and replay.met is True
    assert "| fanout | server CPU per put, 3 subscribers" in markdown_table(run.figures)
