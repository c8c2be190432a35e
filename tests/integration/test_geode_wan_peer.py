"""The Apache Geode WAN peer of bench.gateway runs, at a tiny size: two Geode sites, each a
locator and a server, joined by a serial and then a parallel gateway sender; site B
receives every event of both phases and the figures come back."""

from __future__ import annotations

import math
from pathlib import Path

from bench.gateway_raw import GatewayBenchOptions, PhaseResult
from bench.peers.geode_wan import MODES, geode_wan, geode_wan_rows


def test_two_geode_sites_carry_every_event_through_each_sender_kind(tmp_path: Path) -> None:
    options = GatewayBenchOptions(events=500, rate=100, seconds=2, warmup_seconds=0.5)

    figures = geode_wan(options, tmp_path)

    # geode_wan raises if site B received fewer events than site A put, in either phase.
    assert list(figures) == list(MODES)
    for mode, result in figures.items():
        assert result.events_per_s > 0, mode
        # 2 s at 100/s, the first 0.5 s not counted
        assert 100 <= result.lag_samples <= 160, mode
        assert 0 < result.lag_p50_ms <= result.lag_p99_ms <= result.lag_max_ms, mode
        assert (tmp_path / mode / "site-a.log").exists()
        assert (tmp_path / mode / "site-b.log").exists()
    rb = PhaseResult(events_per_s=1000.0, lag_p99_ms=100.0)
    events, lag = geode_wan_rows(rb, figures, options)
    assert events.baseline == figures["serial"].events_per_s and events.regionbus == 1000.0
    assert lag.baseline == figures["serial"].lag_p99_ms and not lag.higher_is_better
    assert math.isclose(events.ratio, 1000.0 / figures["serial"].events_per_s)
