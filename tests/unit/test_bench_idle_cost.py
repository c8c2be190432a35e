"""``bench.idle_cost``'s verdict and tables: flat is every point of a series within
``FLAT_FACTOR`` of its first, each series compared with its own first point."""

from __future__ import annotations

import math

from bench.fleet_fanout import FLAT_FACTOR
from bench.idle_cost import IdlePoint, flat, keys_in_bucket_0, markdown, summary_rows
from bench.services import REGION
from regionbus.schemas.naming import bucket_of


def _point(series: str, count: int, lone_us: float, batched_us: float) -> IdlePoint:
    return IdlePoint(series, count, 6.0, lone_us, batched_us, 80.0, (1.0, 1.0, 1.0))


def test_flat_is_every_point_within_the_factor_of_the_first() -> None:
    first = _point("regions", 1, 1_000.0, 100.0)
    within = _point("regions", 1_000, 1_000.0 * FLAT_FACTOR, 90.0)
    beyond = _point("regions", 1_000, 1_000.0 * FLAT_FACTOR + 1, 90.0)
    assert flat([first, within], "lone_us_per_put")
    assert not flat([first, beyond], "lone_us_per_put")
    assert flat([first, beyond], "batched_us_per_put")


def test_each_series_is_its_own_baseline_in_the_table_and_the_summary() -> None:
    points = [
        _point("cqs", 1_000, 1_200.0, 120.0),
        _point("regions", 1, 1_000.0, 100.0),
        _point("cqs", 1, 800.0, 100.0),
        _point("regions", 100, 2_000.0, 100.0),
    ]
    table = markdown(points).splitlines()
    # Header, separator, then regions before CQs, each in count order.
    assert [row.split(" | ")[1] for row in table[2:]] == ["1", "100", "1", "1,000"]
    assert "| 2.00x |" in table[3] and "| 1.50x |" in table[5]
    rows = {r.figure: r for r in summary_rows(points)}
    lone = rows["server CPU µs per lone put (100 regions held)"]
    assert (lone.regionbus, lone.baseline, lone.higher_is_better) == (2_000.0, 1_000.0, False)
    cqs = rows["server CPU µs per put, pipelined (1,000 idle continuous queries)"]
    assert math.isclose(cqs.regionbus / cqs.baseline, 1.2)
    assert len(rows) == 4


def test_the_bucket_series_writes_keys_of_one_bucket_only() -> None:
    """Every other bucket then sees no traffic: the series measures idle buckets."""
    for total in (1, 16, 113):
        keys = keys_in_bucket_0(total, count=50)
        assert len(set(keys)) == 50
        assert {bucket_of(REGION, key, total) for key in keys} == {0}
