"""bench.gateway_shards' curve table and its refusal of bad shard counts."""

from __future__ import annotations

from click.testing import CliRunner
from rich.console import Console

from bench.gateway_shards import ShardPoint, main, print_points


def test_the_curve_prints_each_count_against_one_shard_with_the_busy_cores() -> None:
    console = Console(width=200, record=True)
    print_points([ShardPoint(1, 4000.0, 1.7, 2, 1.2), ShardPoint(2, 5000.0, 1.95, 2, 3.4)], console)
    text = console.export_text()
    assert "4,000" in text and "5,000" in text
    assert "1.25x" in text
    assert "1.95 of 2" in text


def test_shard_counts_that_are_not_positive_numbers_are_refused_before_anything_starts() -> None:
    for bad in ("0,2", "one", ""):
        result = CliRunner().invoke(main, ["--shards", bad])
        assert result.exit_code == 2, bad
        assert "--shards" in result.output
