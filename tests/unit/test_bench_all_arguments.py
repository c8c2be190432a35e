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
