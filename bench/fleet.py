"""Fleet benchmark: thousands of clients, crashed clients, slow clients and huge requests.

``python -m bench.fleet`` measures, on one Kafka and Redis (the local stack unless
``REGIONBUS_KAFKA_BOOTSTRAP_SERVERS`` / ``REGIONBUS_REDIS_URL`` name others), one phase per
goal of the fleet issue, each beside a baseline measured in the same run:

1. **fleet**: ``--durable-clients`` durable clients register durable interest in three
   keys each and go away, ``--live-subscribers`` subscribers hold ``ALL_KEYS``, and a
   writer puts ``--rate`` puts per second for ``--seconds`` (half to the keys of the
   ``--sampled`` durable clients, half spread over the others). Measured: Kafka partitions
   added per registered client, the server's RSS, the live subscribers' put → listener
   p99 (beside raw Kafka's own fan-out: one producer at the same rate, as many consumers
   each reading every message, as many per process), the machine's busy cores while each
   of the two sent (how much of the machine the shape itself takes), and whether each
   sampled durable client, coming back, gets its whole backlog once, in order, before its
   marker.
2. **cleanup**: ``--cleanup-clients`` clients (half durable) killed with SIGKILL; seconds
   until no record, Redis key, consumer group or partition of theirs is left, beside their
   silence window and durable timeout.
3. **connect**: the median time to construct a ``ClientCache`` over the fleet's first
   ``--connects`` durable clients, beside a raw Kafka client's start (a consumer and a
   producer made, one message through).
4. **fanout**: the cache server's CPU per put as ``--fanout-subscribers`` subscribers
   (1 to 1,000) share ``ALL_KEYS``, each step beside the first (:mod:`bench.fleet_fanout`):
   the subscribers are durable clients away, which the server routes to as to connected
   ones, because 1,000 live caches do not fit on the benchmark machine. ``bench.scaling``
   measures the same with live subscribers, up to what fits.
5. **requests**: a bystander's put p99 and worst (another client, in a process of its
   own, as another application's) while a client registers
   ``MAX_KEYS_PER_REGISTRATION`` keys and puts ``MAX_BULK_ENTRIES`` entries at once,
   beside its p99 alone; and how fast requests over the limits are refused.
6. **stalled**: ``--stalled-subscribers`` subscribers, a tenth of them stalled (SIGSTOP):
   the others' p99 and the writer's throughput, beside a run with none stalled.
7. **idle**: ``--idle-caches`` connected client caches that receive nothing: the CPU of
   their processes and of the Kafka broker per cache, beside a raw consumer per client
   (what bounds how many caches a machine holds; see :mod:`bench.fleet_idle`).
8. **abuse**: a hostile or careless client's attacks at full size (a LIKE CQ compiling to a
   huge program, 200 long LIKE CQs then values of up to 400 KB, a 68-year durable timeout,
   keys over many calls), each beside a bystander's puts (:mod:`bench.fleet_abuse`).
9. **storms**: ``--storm-clients`` clients registering ``ALL_KEYS`` at once over
   ``--storm-entries`` entries, then ``--storm-connects`` connects at once, each beside a
   bystander's puts (:mod:`bench.fleet_storms`).

Before the phases, an untimed warm-up (raw Kafka's fan-out at ``--rate`` for
``--seconds``) lets the broker compile its code (the JVM's JIT), so that no phase, and
no baseline, is measured on a cold broker.

It prints a table (``--markdown`` writes it for ``bench/RESULTS.md``) with the load
average before each phase, and hands ``bench.all`` its rows (:mod:`bench.summary`).
Machines are noisy: compare the ratios, not the absolute figures (``bench/README.md``).
"""

from __future__ import annotations

import json
import logging
import math
import sys
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from bench import progress
from bench.core import run_or_exit
from bench.fleet_abuse import abuse_phase
from bench.fleet_fanout import fanout_phase
from bench.fleet_idle import idle_phase
from bench.fleet_load_phases import requests_phase, stalled_phase
from bench.fleet_phases import cleanup_phase, fleet_phase, warm_up
from bench.fleet_run import (
    PHASES,
    TABLE_WIDTH,
    Figure,
    FleetOptions,
    Run,
    verdict,
)
from bench.fleet_storms import storms_phase
from bench.options import counts, fetch_wait_option, linger_option
from bench.summary import SummaryRow, emit

# --- the run ----------------------------------------------------------------------------


def run(options: FleetOptions, console: Console) -> list[Figure]:
    """Start the stack (unless given by env) and run the chosen phases.

    Raises:
        BenchError: a server or child process failed or did not answer in time.
        StackError: Kafka or Redis could not be started.
    """
    with ExitStack() as stack:
        local, work_dir = progress.embedded_stack(stack, "fleet", console)
        state = Run(local, work_dir, console)
        warm_up(state, options)
        phases = {
            "fleet": fleet_phase,
            "cleanup": cleanup_phase,
            "requests": requests_phase,
            "stalled": stalled_phase,
            "idle": idle_phase,
            "fanout": fanout_phase,
            "abuse": abuse_phase,
            "storms": storms_phase,
        }
        for name in options.phases:
            phases[name](state, options)
        return state.figures


def markdown_table(figures: list[Figure]) -> str:
    """The figures as a Markdown table (for ``bench/RESULTS.md``)."""
    lines = [
        "| phase | figure | regionbus | baseline | baseline is | goal | met | load before |",
        "|---|---|---:|---:|---|---|---|---|",
    ]
    for f in figures:
        baseline = "" if math.isnan(f.baseline) else f"{f.baseline:,.2f}"
        met = {"met": "yes", "NOT met": "**no**"}.get(verdict(f.met), "-")
        lines.append(
            f"| {f.phase} | {f.figure} | {f.value:,.2f} | {baseline} | {f.baseline_name} | "
            f"{f.goal} | {met} | {f.load} |"
        )
    return "\n".join(lines) + "\n"


def summary_rows(figures: list[Figure]) -> list[SummaryRow]:
    """The rows ``bench.all`` collects: each figure with a baseline."""
    return [
        SummaryRow("fleet", f.figure, f.value, f.baseline, f.baseline_name, f.higher_is_better)
        for f in figures
        if not math.isnan(f.baseline)
    ]


def _phases(text: str) -> tuple[str, ...]:
    chosen = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = sorted(set(chosen) - set(PHASES))
    if unknown or not chosen:
        raise click.BadParameter(f"phases are {', '.join(PHASES)}; not {unknown}")
    return chosen


@click.command()
@click.option(
    "--phases",
    default=",".join(PHASES),
    show_default=True,
    callback=lambda _c, _p, v: _phases(v),
    help="Which phases to run.",
)
@click.option(
    "--durable-clients",
    default=9_900,
    show_default=True,
    type=click.IntRange(1),
    help="Durable clients registered and away.",
)
@click.option(
    "--registering-processes",
    default=2,
    show_default=True,
    type=click.IntRange(1),
    help="Processes registering the durable clients.",
)
@click.option(
    "--live-subscribers",
    default=100,
    show_default=True,
    type=click.IntRange(1),
    help="Subscribers with ALL_KEYS interest during the fleet phase.",
)
@click.option(
    "--sampled",
    default=100,
    show_default=True,
    type=click.IntRange(1),
    help="Durable clients that come back and check their backlog.",
)
@click.option(
    "--rate",
    default=200,
    show_default=True,
    type=click.IntRange(1),
    help="Puts per second of the fleet phase.",
)
@click.option("--seconds", default=20.0, show_default=True, help="Length of the fleet phase.")
@click.option(
    "--connects",
    default=200,
    show_default=True,
    type=click.IntRange(1),
    help="Connects the connect median is taken over (the first durable clients').",
)
@click.option(
    "--cleanup-clients",
    default=200,
    show_default=True,
    type=click.IntRange(2),
    help="Clients killed with SIGKILL (half durable).",
)
@click.option(
    "--stalled-subscribers",
    default=100,
    show_default=True,
    type=click.IntRange(10),
    help="Subscribers of the stalled phase (a tenth stalled).",
)
@click.option(
    "--stalled-rate",
    default=100,
    show_default=True,
    type=click.IntRange(1),
    help="Puts per second of the stalled phase.",
)
@click.option(
    "--stalled-seconds", default=15.0, show_default=True, help="Length of each stalled run."
)
@click.option(
    "--idle-caches",
    default=200,
    show_default=True,
    type=click.IntRange(1),
    help="Connected client caches of the idle phase (and raw consumers beside them).",
)
@click.option(
    "--fanout-subscribers",
    default="1,10,100,1000",
    show_default=True,
    callback=lambda _c, _p, v: counts(v),
    help="Subscriber counts of the fan-out phase (durable clients sharing ALL_KEYS, away).",
)
@click.option(
    "--fanout-ops",
    default=20_000,
    show_default=True,
    type=click.IntRange(1),
    help="Puts at each count of the fan-out phase.",
)
@click.option(
    "--storm-clients",
    default=200,
    show_default=True,
    type=click.IntRange(1),
    help="Clients of the storms phase registering ALL_KEYS at once.",
)
@click.option(
    "--storm-entries",
    default=100_000,
    show_default=True,
    type=click.IntRange(1),
    help="Entries of the region the storm registers in.",
)
@click.option(
    "--storm-connects",
    default=1_000,
    show_default=True,
    type=click.IntRange(1),
    help="Connects at once of the storms phase.",
)
@fetch_wait_option()
@linger_option()
@click.option(
    "--markdown",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the table as Markdown here (for bench/RESULTS.md).",
)
@click.option("--json", "as_json", is_flag=True, help="Also print the figures as JSON.")
def main(markdown: Path | None, as_json: bool, **values: Any) -> None:
    """Measure a fleet of clients: registered, crashed, connecting, asking too much, stalled."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    options = FleetOptions(**values)
    console = Console(width=None if sys.stdout.isatty() else TABLE_WIDTH)
    figures = run_or_exit(lambda: run(options, console), console)
    table = markdown_table(figures)
    console.print(table)
    if markdown is not None:
        markdown.write_text(table, encoding="utf-8")
        console.print(f"markdown written to {markdown}")
    emit(summary_rows(figures))
    if as_json:
        print(json.dumps({**asdict(options), "figures": [asdict(f) for f in figures]}))


if __name__ == "__main__":
    main()
