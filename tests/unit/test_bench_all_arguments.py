"""``bench.all`` runs each benchmark with argument lists of its own: each must be one the
benchmark's command takes, or the whole run loses that benchmark at its start."""

from __future__ import annotations

import importlib

import click
import pytest

from bench.all import BENCHMARKS, Benchmark


@pytest.mark.parametrize("benchmark", BENCHMARKS, ids=lambda b: b.name)
def test_every_profile_argument_list_parses_with_the_benchmark_s_own_command(
    benchmark: Benchmark,
) -> None:
    command = importlib.import_module(f"bench.{benchmark.name}").main
    assert isinstance(command, click.Command)
    for arguments in (benchmark.quick, benchmark.full):
        # make_context parses and runs the callbacks (counts, phases) but not the command.
        with command.make_context(f"bench.{benchmark.name}", list(arguments)) as context:
            assert context.params


def test_core_and_its_geode_peer_run_the_read_phases_at_the_same_sizes() -> None:
    """Their rows pair by figure name, which names the sizes."""
    by_name = {b.name: b for b in BENCHMARKS}
    sizes = ("reads", "read_entries", "get_all_keys", "get_all_calls", "query_runs")
    params = []
    for name in ("core", "peers.geode"):
        command = importlib.import_module(f"bench.{name}").main
        for arguments in (by_name[name].quick, by_name[name].full):
            with command.make_context(f"bench.{name}", list(arguments)) as context:
                params.append({size: context.params[size] for size in sizes})
    quick_core, full_core, quick_geode, full_geode = params
    assert quick_core == quick_geode and full_core == full_geode
    assert quick_core["reads"] and quick_core["read_entries"] == 10_000


def test_the_durable_replay_benchmark_runs_in_the_quick_profile_and_takes_a_million() -> None:
    """The replay figure is in every ``bench.all`` run, and its size reads as printed."""
    by_name = {b.name: b for b in BENCHMARKS}
    assert "durable_replay" in by_name
    command = importlib.import_module("bench.durable_replay").main
    with command.make_context("bench.durable_replay", list(by_name["durable_replay"].quick)) as c:
        assert c.params["events"] >= 10_000
    for size in ("1,000,000", "1_000_000", "1000000"):
        with command.make_context("bench.durable_replay", ["--events", size]) as context:
            assert context.params["events"] == 1_000_000
    with pytest.raises(click.BadParameter):
        command.make_context("bench.durable_replay", ["--events", "1,00,000"])
