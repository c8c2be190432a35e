"""The Apache Geode peer harness runs, at a tiny size: a server, a subscriber, writers, and
two servers with redundancy 1 whose primary is SIGKILLed; every figure comes back."""

from __future__ import annotations

import math
from pathlib import Path

from bench.peers.geode import run_harness

# Tiny: a few hundred puts; a member-timeout of 1 s so the survivor drops the killed
# primary soon (Geode's default is 5 s); generous timeouts for a loaded machine.
TINY = {
    "ops": 500,
    "subscribers": 2,
    "rate": 200,
    "latency_seconds": 1,
    "warmup_seconds": 0.2,
    "writer_threads": 4,
    "failover": "true",
    "failover_rate": 100,
    "failover_seconds": 3,
    "kill_after_s": 1,
    "member_timeout_ms": 1000,
    "idle_timeout_s": 20,
}


def test_the_geode_harness_measures_subscriptions_and_a_failover(tmp_path: Path) -> None:
    figures = run_harness(TINY, tmp_path, timeout_s=300)

    assert figures.version.startswith("1.15")
    assert figures.acked == 500 and figures.complete
    assert figures.subscribers == 2 and figures.writer_threads == 4
    assert figures.puts_per_s > 0 and figures.events_per_s > 0
    assert figures.latency_samples > 0
    assert 0 < figures.p50_ms <= figures.p99_ms <= figures.max_ms
    failover = figures.failover
    assert failover is not None
    assert failover.sent == 300 and failover.acked + failover.put_errors == 300
    # Puts sent after the kill reach the listener through the promoted secondary.
    assert not math.isnan(failover.kill_to_first_event_after_kill_ms)
    assert failover.kill_to_first_event_after_kill_ms > 0
    # The members ran in the work folder and logged there, not where the test runs.
    assert (tmp_path / "failover-server-1.log").exists()
    assert not list(Path.cwd().glob("locator*view.dat"))
