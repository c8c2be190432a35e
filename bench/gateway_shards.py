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

import json
import logging
import os
import secrets
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from bench import progress
from bench.cpu import MachineCpu
from bench.gateway import REGION, ArrivalListener, Child, put_all, remote_kafka, stop_all
from bench.gateway_raw import Arrivals, GatewayBenchOptions, wait_count
from bench.summary import SummaryRow, emit
from regionbus.clients import BytesSerializer, ClientCache, ClientSettings
from regionbus.devstack import LocalStack

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
    tag = secrets.token_hex(3)
    ns_a, ns_b = f"bench.gws.{tag}.a", f"bench.gws.{tag}.b"
    common = {"REGIONBUS_FETCH_WAIT_MAX_MS": str(options.fetch_wait_ms)}
    log_dir.mkdir(parents=True, exist_ok=True)
    children: list[Child] = []
    with ExitStack() as stack:
        stack.callback(stop_all, children)

        def child(name: str, args: list[str], env: dict[str, str]) -> Child:
            started = Child(name, args, {**common, **env}, log_dir)
            children.append(started)
            return started

        site = ["--redis", redis_url, "--region", REGION]
        server_a = child(
            "server-a",
            ["serve", "--namespace", ns_a, "--kafka", a_kafka, *site],
            {
                "REGIONBUS_DISTRIBUTED_SYSTEM_ID": "1",
                "REGIONBUS_GATEWAY_SENDERS": json.dumps(
                    {"to-b": {"remote_distributed_system_id": 2, "parallel": True}}
                ),
                "REGIONBUS_REGION_GATEWAY_SENDERS": json.dumps({REGION: ["to-b"]}),
            },
        )
        server_b = child(
            "server-b",
            ["serve", "--namespace", ns_b, "--kafka", b_kafka, *site],
            {"REGIONBUS_DISTRIBUTED_SYSTEM_ID": "2"},
        )
        server_a.wait_ready("serving namespace")
        server_b.wait_ready("serving namespace")
        receivers = [
            child(
                f"receiver-{index}",
                [
                    "gateway",
                    "receiver",
                    "--namespace",
                    ns_b,
                    "--kafka",
                    b_kafka,
                    "--redis",
                    redis_url,
                    "--site-id",
                    "2",
                    "--receiver-id",
                    f"rx{index}",
                ],
                {"REGIONBUS_GATEWAY_RECEIVER_FETCH_WAIT_MAX_MS": str(options.fetch_wait_ms)},
            )
            for index in range(shards)
        ]
        for receiver in receivers:
            receiver.wait_ready("running")

        arrivals = Arrivals()
        reader = stack.enter_context(
            ClientCache(
                ClientSettings(
                    namespace=ns_b,
                    kafka_bootstrap_servers=b_kafka,
                    fetch_wait_max_ms=options.fetch_wait_ms,
                )
            )
        )
        region_b = reader.create_region(
            REGION, listeners=[ArrivalListener(arrivals)], serializer=BytesSerializer()
        )
        region_b.register_interest_regex(".*")
        writer = stack.enter_context(
            ClientCache(
                ClientSettings(
                    namespace=ns_a,
                    kafka_bootstrap_servers=a_kafka,
                    fetch_wait_max_ms=options.fetch_wait_ms,
                )
            )
        )
        region_a = writer.create_region(REGION, serializer=BytesSerializer())
        put_all(region_a, "drain", options)

        load = os.getloadavg()[0]
        arrivals.reset(0)
        senders = [
            child(
                f"sender-{index}",
                [
                    "gateway",
                    "sender",
                    "--namespace",
                    ns_a,
                    "--kafka",
                    a_kafka,
                    "--redis",
                    redis_url,
                    "--sender-id",
                    "to-b",
                    "--site-id",
                    "1",
                    "--remote-site-id",
                    "2",
                    "--remote-namespace",
                    ns_b,
                    "--remote-kafka",
                    b_kafka,
                    "--remote-receiver-id",
                    f"rx{index}",
                    "--batch-size",
                    str(options.batch_size),
                    "--batch-time-interval-ms",
                    str(options.batch_time_interval_ms),
                    "--shards",
                    str(shards),
                    "--shard",
                    str(index),
                ],
                {"REGIONBUS_GATEWAY_SENDER_FETCH_WAIT_MAX_MS": str(options.fetch_wait_ms)},
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
    with (
        progress.heartbeat(console),
        LocalStack() as stack,
        progress.keep_stack_logs(stack),
        remote_kafka() as b_kafka,
    ):
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
