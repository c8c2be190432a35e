"""The Apache Geode peer harness runs, at a tiny size: a server, a subscriber, writers,
getAll and a one-shot OQL query, and two servers with redundancy 1 whose primary is
SIGKILLed; every figure comes back."""

from __future__ import annotations

import math
from pathlib import Path

from bench.peers.geode import run_harness
from bench.peers.geode_figures import CORE_VS_GEODE, summary_rows
from bench.reads_figures import selected_rows

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
    "reads": "true",
    "read_entries": 200,
    "get_all_keys": 10,
    "get_all_calls": 20,
    "query_runs": 3,
}


def test_the_geode_harness_measures_subscriptions_and_a_failover(tmp_path: Path) -> None:
    figures = run_harness(TINY, tmp_path, timeout_s=300)

    assert figures.version.startswith("1.15")
    assert figures.acked == 500 and figures.complete
    assert figures.subscribers == 2 and figures.writer_threads == 4
    assert figures.puts_per_s > 0 and figures.events_per_s > 0
    assert figures.latency_samples > 0
    assert 0 < figures.p50_ms <= figures.p99_ms <= figures.max_ms
    # getAll found every key of every timed call; each query run selected what bench.core's
    # query selects over the same documents (a tenth).
    reads = figures.reads
    assert reads is not None and (reads.entries, reads.keys_per_call) == (200, 10)
    assert (reads.get_all.calls, reads.get_all.items) == (20, 20 * 10)
    assert (reads.query.calls, reads.query.items) == (3, 3 * selected_rows(200))
    for series in (reads.get_all, reads.query):
        assert series.per_s > 0 and 0 < series.p50_ms <= series.p99_ms
    read_rows = [r for r in summary_rows(figures) if r.regionbus_of and "entries" in r.figure]
    assert [r.regionbus_of for r in read_rows] == [("core", r.figure) for r in read_rows]
    assert {r.benchmark for r in read_rows} == {CORE_VS_GEODE} and len(read_rows) == 3
    failover = figures.failover
    assert failover is not None
    assert failover.sent == 300 and failover.acked + failover.put_errors == 300
    # Puts sent after the kill reach the listener through the promoted secondary.
    assert not math.isnan(failover.kill_to_first_event_after_kill_ms)
    assert failover.kill_to_first_event_after_kill_ms > 0
    # The members ran in the work folder and logged there, not where the test runs.
    assert (tmp_path / "failover-server-1.log").exists()
    assert not list(Path.cwd().glob("locator*view.dat"))
