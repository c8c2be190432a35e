"""A parallel gateway sender split into shards: events per second drained as the shards
(and the receivers beside them) grow, until the machine is full.

``python -m bench.gateway_shards --shards 1,2,4`` starts site A on the local stack and
site B on a second embedded Kafka (as ``bench.gateway``), a cache server per site, site
A's sender ``to-b`` parallel (a queue partition per bucket). For each shard count k:

- ``--events`` puts are queued on site A while no sender runs (pipelined, 200-byte
  values, keys over every bucket);
- then k sender processes start, shard i of k reading the partitions ``p % k == i``, each
  sending to a receiver of its own on site B (k receivers), and a subscriber on site B
  counts arrivals;
- the figure is the events per second from the moment every sender runs to the last
  arrival (the events that arrived before are left out: a process's start costs a
  core-second or so), with the machine's busy cores over the same span (``/proc/stat``,
  every process), so that the curve shows where the machine, not the sender, is the
  bound.

Each shard count runs on servers and workers of its own, in a namespace of its own, on
the same two brokers, after a drain at the first count that is not counted (the brokers
are started for the run and compile for their first tens of seconds).
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from bench import progress
from bench.cpu import MachineCpu
from bench.gateway_pair import SitePair, put_all, two_brokers
from bench.gateway_raw import Arrivals, GatewayBenchOptions, wait_count
from bench.summary import SummaryRow, emit

log = logging.getLogger("regionbus.bench.gateway_shards")


@dataclass(frozen=True)
class ShardPoint:
    """One shard count's drain.

    Attributes:
        shards: Sender processes (shards), and receivers.
        events_per_s: Events per second on site B, from the moment every sender ran to
            the last arrival.
        busy_cores: The machine's busy cores on average over the drain (of ``cores``).
        cores: The machine's cores.
        load: The 1-minute load average before the drain.
    """

    shards: int
    events_per_s: float
    busy_cores: float
    cores: int
    load: float


def drain_with_shards(
    a_kafka: str,
    b_kafka: str,
    redis_url: str,
    shards: int,
    options: GatewayBenchOptions,
    log_dir: Path,
) -> ShardPoint:
    """Queue ``options.events`` on site A, then drain them with ``shards`` senders (and as
    many receivers) to site B.

    Raises:
        click.ClickException: A worker did not start, or not every event arrived.
    """
    sites = SitePair(a_kafka, b_kafka, redis_url, options, log_dir, prefix="bench.gws")
    with ExitStack() as stack:
        stack.callback(sites.stop)
        sites.start_servers({"parallel": True})
        receivers = [sites.start_receiver(f"rx{index}") for index in range(shards)]
        for receiver in receivers:
            receiver.wait_ready("running")
        arrivals = Arrivals()
        sites.reader(stack, arrivals)
        put_all(sites.writer(stack), "drain", options)

        load = os.getloadavg()[0]
        arrivals.reset(0)
        senders = [
            sites.start_sender(
                f"sender-{index}",
                receiver_id=f"rx{index}",
                more_args=("--shards", str(shards), "--shard", str(index)),
            )
            for index in range(shards)
        ]
        # Counted once every sender runs: a process's start (imports, connections) is a
        # core-second or so, which would otherwise weigh on the counts with more shards.
        for sender in senders:
            sender.wait_ready("running")
        machine = MachineCpu()
        machine.start()
        ready_ns, arrived_at_ready = time.time_ns(), arrivals.count
        wait_count(arrivals, options.events, idle_timeout_s=120)
        busy = machine.stop()
        drained_s = (arrivals.last_ns - ready_ns) / 1e9
    if options.events - arrived_at_ready < options.events // 2:
        raise click.ClickException(
            f"{arrived_at_ready:,} of {options.events:,} events arrived before every sender "
            "ran: too few events to measure the drain"
        )
    events = options.events - arrived_at_ready
    events_per_s = events / drained_s if drained_s > 0 else 0.0
    return ShardPoint(shards, events_per_s, busy, os.cpu_count() or 1, load)


def print_points(points: list[ShardPoint], console: Console) -> None:
    """The curve as a table: events/s, ÷ one shard's, and the machine's busy cores."""
    table = Table(title="parallel gateway sender: events/s drained by shard count")
    for column in ("shards (and receivers)", "events/s", "÷ 1 shard", "busy cores", "load"):
        table.add_column(column, justify="right")
    base = points[0].events_per_s if points else 0.0
    for point in points:
        table.add_row(
            str(point.shards),
            f"{point.events_per_s:,.0f}",
            f"{point.events_per_s / base:.2f}x" if base else "n/a",
            f"{point.busy_cores:.2f} of {point.cores}",
            f"{point.load:.1f}",
        )
    console.print(table)


@click.command()
@click.option("--shards", default="1,2,4", show_default=True, help="Shard counts, in order.")
@click.option("--events", default=20_000, show_default=True, help="Events drained per count.")
@click.option("-v", "--verbose", is_flag=True)
def main(shards: str, events: int, verbose: bool) -> None:
    """Drain a parallel gateway sender's backlog with 1, 2, 4... shards."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    try:
        counts = [int(part) for part in shards.split(",") if part.strip()]
    except ValueError as exc:
        raise click.UsageError(f"--shards: comma-separated counts, not {shards!r}") from exc
    if not counts or min(counts) < 1:
        raise click.UsageError("--shards: counts of at least 1")
    options = GatewayBenchOptions(events=events)
    console = Console()
    log_dir = progress.log_dir("gateway_shards", console)
    points: list[ShardPoint] = []
    with two_brokers(console) as (stack, b_kafka):
        a_kafka = stack.kafka_bootstrap_servers
        progress.phase(console, f"warm-up, not counted: {events:,} events, {counts[0]} shard(s)")
        drain_with_shards(a_kafka, b_kafka, stack.redis_url, counts[0], options, log_dir / "w")
        for count in counts:
            progress.phase(console, f"{events:,} events drained by {count} shard(s) ...")
            started = time.monotonic()
            point = drain_with_shards(
                a_kafka, b_kafka, stack.redis_url, count, options, log_dir / f"k{count}"
            )
            log.info("%d shards: %.1f s", count, time.monotonic() - started)
            points.append(point)
    print_points(points, console)
    base = points[0].events_per_s
    emit(
        [
            SummaryRow(
                "gateway_shards",
                f"events/s drained by a parallel sender in {point.shards} shards",
                point.events_per_s,
                base,
                f"the same with {points[0].shards} shard(s)",
            )
            for point in points[1:]
        ]
    )


if __name__ == "__main__":
    main()
