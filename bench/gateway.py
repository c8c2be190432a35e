"""The gateway benchmark: one serial gateway sender between two Kafka brokers, against a
raw consume → produce mirror between the same brokers, in the same run.

``python -m bench.gateway`` starts site A on the local stack (embedded Kafka and
``redis-server`` unless ``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL`` name others) and site B
on a second embedded Kafka (same Redis, another namespace); a cache server per site, a
gateway sender on A and a gateway receiver on B, each a child process. It measures:

(a) replication lag at ``--rate`` puts per second for ``--seconds``: put on A (value
    stamped with the send time) → A's server → queue → sender → B's receiver → B's
    server → a subscriber on B (ALL_KEYS); p50 / p99 / max after ``--warmup-seconds``
    (30 s: the brokers are started for the run, and their JIT compilers take much of
    the machine for the first tens of seconds); measured twice, with the sender's
    default batching (Geode's: ``batch_size`` or ``batch_time_interval_ms``) and with
    ``send_when_idle`` (a batch goes once none awaits an ack), each on servers, sender
    and receiver of its own;
(b) events per second through the sender: ``--events`` pipelined puts on A, from the
    first put until the subscriber on B has seen the last one; beside it, the puts acked
    per second by A's server (the pace events enter the queue, which bounds the rest);
    then the sender alone: ``--events`` puts queued on A while the sender is stopped, and
    a new sender drains them (first to last arrival on B), so A's puts do not bound it;
(c) the raw baseline: a child process consuming a topic on A (``assign()``) and producing
    every message as is to a topic on B, with the same producer / consumer settings;
    the same paced rate for lag (producer on A → mirror → consumer on B) and the same
    message count and size for throughput;
(d) the peers, unless ``--no-mm2`` / ``--no-geode``: MirrorMaker 2 between the same two
    brokers, measured as (c) (``bench.peers.mirror_maker``), and two Apache Geode 1.15.1
    sites joined by a serial and then a parallel gateway sender with Geode's defaults, the
    same event counts, sizes and rate (``bench.peers.geode_wan``).

It prints every figure and regionbus ÷ raw, ÷ MirrorMaker 2 and ÷ Geode's serial sender.
Machines are noisy: compare the ratios.
"""

from __future__ import annotations

import logging
import math
import os
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from bench import progress
from bench.gateway_pair import SitePair, put_all, two_brokers
from bench.gateway_raw import (
    LINGER_MS,
    Arrivals,
    GatewayBenchOptions,
    PhaseResult,
    lag_result,
    pace,
    raw_mirror,
    wait_count,
)
from bench.summary import SummaryRow, emit
from bench.workers import stamped_value

log = logging.getLogger("regionbus.bench.gateway")


# --- regionbus -----------------------------------------------------------------------


def regionbus_gateway(
    a_kafka: str,
    b_kafka: str,
    redis_url: str,
    options: GatewayBenchOptions,
    log_dir: Path,
    *,
    send_when_idle: bool = False,
    lag_only: bool = False,
) -> tuple[PhaseResult, str]:
    """Lag and throughput through one serial gateway sender from site A to site B.

    Args:
        a_kafka: Site A's bootstrap servers.
        b_kafka: Site B's bootstrap servers.
        redis_url: The Redis both sites use (each in a namespace of its own).
        options: Sizes, rate and the sender's batching.
        log_dir: Where the children's logs go.
        send_when_idle: The sender's ``send_when_idle`` (default off, Geode's batching):
            on, a batch goes as soon as no batch awaits an ack.
        lag_only: Measure the lag phase only (no throughput and drain phases).

    Returns:
        The figures (throughput fields left at their defaults when ``lag_only``), and
        the log directory.

    Raises:
        click.ClickException: Not every event arrived on site B in time.
    """
    result = PhaseResult()
    sites = SitePair(a_kafka, b_kafka, redis_url, options, log_dir)
    with ExitStack() as stack:
        stack.callback(sites.stop)
        sites.start_servers(env={"REGIONBUS_LINGER_MS": str(LINGER_MS)})
        receiver = sites.start_receiver()
        sender_env = {"REGIONBUS_GATEWAY_SENDER_SEND_WHEN_IDLE": str(send_when_idle).lower()}
        sender = sites.start_sender(env=sender_env)
        receiver.wait_ready("running")
        sender.wait_ready("running")
        arrivals = Arrivals()
        sites.reader(stack, arrivals)
        region_a = sites.writer(stack)
        region_a.put("warmup", stamped_value(options.value_bytes))
        wait_count(arrivals, 1, idle_timeout_s=120)

        arrivals.reset(time.time_ns() + int(options.warmup_seconds * 1e9))
        futures = []
        for index in pace(options.rate, options.seconds):
            futures.append(
                region_a.put_async(f"lag-{index % 1000}", stamped_value(options.value_bytes))
            )
        for future in futures:
            future.result(60)
        wait_count(arrivals, len(futures))
        lag = lag_result(arrivals)
        result.lag_p50_ms, result.lag_p99_ms = lag.lag_p50_ms, lag.lag_p99_ms
        result.lag_max_ms, result.lag_samples = lag.lag_max_ms, lag.lag_samples
        if lag_only:
            return result, str(log_dir)

        arrivals.reset(0)
        start_ns = time.time_ns()
        result.source_events_per_s = put_all(region_a, "tp", options)
        wait_count(arrivals, options.events)
        result.events_per_s = options.events / ((arrivals.last_ns - start_ns) / 1e9)

        # The sender alone: a backlog queued while it is stopped, then drained.
        sender.stop()
        put_all(region_a, "drain", options)
        arrivals.reset(0)
        sites.start_sender("sender-drain", env=sender_env)
        wait_count(arrivals, options.events, idle_timeout_s=120)
        drained_s = (arrivals.last_ns - arrivals.first_ns) / 1e9
        result.drain_events_per_s = (options.events - 1) / drained_s if drained_s else 0.0
    return result, str(log_dir)


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def report(
    rb: PhaseResult,
    raw: PhaseResult,
    options: GatewayBenchOptions,
    console: Console,
    mm2: PhaseResult | None = None,
    rb_idle: PhaseResult | None = None,
) -> None:
    """Print the figures side by side, with regionbus ÷ raw, and ÷ MirrorMaker 2 when it
    ran (``mm2`` None: ``--no-mm2``, its columns are left out and a line says so).
    ``rb_idle``: the lag of a second regionbus run with the sender's ``send_when_idle``
    (None: its rows are left out)."""
    table = Table(
        title=(
            f"gateway: one serial sender (batch {options.batch_size} / "
            f"{options.batch_time_interval_ms} ms, fetch.wait.max.ms {options.fetch_wait_ms}) "
            "vs raw consume→produce mirror, two brokers"
        )
    )
    columns = ["figure", "regionbus", "raw mirror", "regionbus ÷ raw"]
    if mm2 is not None:
        columns += ["MirrorMaker 2", "regionbus ÷ MM2"]
    for column in columns:
        table.add_column(column, justify="right" if column != "figure" else "left")

    def row(name: str, a: float, b: float, c: float, figure: str) -> None:
        cells = [name, figure.format(a), figure.format(b), _ratio(a, b)]
        if mm2 is not None:
            cells += [figure.format(c), _ratio(a, c)]
        table.add_row(*cells)

    peer = mm2 if mm2 is not None else PhaseResult()
    row("events/s", rb.events_per_s, raw.events_per_s, peer.events_per_s, "{:,.0f}")
    if not math.isnan(rb.drain_events_per_s):
        # The sender alone: a backlog queued on site A while no sender ran, drained to B.
        row(
            "events/s drained from a backlog",
            rb.drain_events_per_s,
            raw.events_per_s,
            peer.events_per_s,
            "{:,.0f}",
        )
    for name in ("p50", "p99", "max"):
        a, b, c = (getattr(x, f"lag_{name}_ms") for x in (rb, raw, peer))
        row(f"lag {name} at {options.rate}/s (ms)", a, b, c, "{:.1f}")
    if rb_idle is not None:
        for name in ("p50", "p99", "max"):
            a, b, c = (getattr(x, f"lag_{name}_ms") for x in (rb_idle, raw, peer))
            row(f"lag {name} at {options.rate}/s, send_when_idle (ms)", a, b, c, "{:.1f}")
    # What bounds events/s: site A's server applying the puts, before any gateway work.
    source = ["puts acked/s on site A", f"{rb.source_events_per_s:,.0f}", "", ""]
    table.add_row(*source, *(["", ""] if mm2 is not None else []))
    samples = ["lag samples", str(rb.lag_samples), str(raw.lag_samples), ""]
    if mm2 is not None:
        samples += [str(peer.lag_samples), ""]
    table.add_row(*samples)
    console.print(table)
    if mm2 is None:
        console.print("MirrorMaker 2 was not run (--no-mm2).")


@click.command()
@click.option("--events", default=GatewayBenchOptions.events, show_default=True)
@click.option("--rate", default=GatewayBenchOptions.rate, show_default=True)
@click.option("--seconds", default=GatewayBenchOptions.seconds, show_default=True)
@click.option("--warmup-seconds", default=GatewayBenchOptions.warmup_seconds, show_default=True)
@click.option("--value-bytes", default=GatewayBenchOptions.value_bytes, show_default=True)
@click.option("--batch-size", default=GatewayBenchOptions.batch_size, show_default=True)
@click.option(
    "--batch-time-interval-ms",
    default=GatewayBenchOptions.batch_time_interval_ms,
    show_default=True,
)
@click.option("--fetch-wait-ms", default=GatewayBenchOptions.fetch_wait_ms, show_default=True)
@click.option(
    "--mm2/--no-mm2",
    default=True,
    show_default=True,
    help="Also run MirrorMaker 2 between the same brokers (bench.peers.mirror_maker).",
)
@click.option(
    "--geode/--no-geode",
    default=True,
    show_default=True,
    help="Also run two Apache Geode sites joined by a serial and by a parallel gateway sender "
    "(bench.peers.geode_wan).",
)
@click.option("-v", "--verbose", is_flag=True)
def main(verbose: bool, mm2: bool, geode: bool, **values: Any) -> None:
    """Benchmark one serial gateway sender against a raw mirror, MirrorMaker 2 and Apache
    Geode's WAN gateway."""
    # bench.peers.mirror_maker measures with this module's helpers: imported here, not above.
    from bench.peers.geode_wan import geode_wan, geode_wan_rows, print_geode_wan
    from bench.peers.mirror_maker import mirror_maker_2, mirror_maker_rows

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    options = GatewayBenchOptions(**values)
    if options.warmup_seconds >= options.seconds:
        raise click.UsageError(
            f"--warmup-seconds ({options.warmup_seconds}) must be below --seconds "
            f"({options.seconds}): the lag is measured after the warm-up"
        )
    console = Console()
    log_dir = progress.log_dir("gateway", console)
    with two_brokers(console) as (stack, b_kafka):
        a_kafka = stack.kafka_bootstrap_servers
        console.print(f"site A Kafka {a_kafka}, site B Kafka {b_kafka}, Redis {stack.redis_url}")
        sizes = f"{options.rate}/s for {options.seconds} s, then {options.events:,} events"
        progress.phase(console, f"raw mirror: {sizes} ...")
        raw = raw_mirror(a_kafka, b_kafka, options)
        progress.phase(console, f"regionbus gateway sender: {sizes} ...")
        console.print(f"load average before regionbus: {_load()}")
        rb, _ = regionbus_gateway(a_kafka, b_kafka, stack.redis_url, options, log_dir)
        console.print(f"load average after regionbus: {_load()}")
        progress.phase(console, f"regionbus gateway sender, send_when_idle: {options.rate}/s ...")
        idle_logs = log_dir / "send-when-idle"
        idle_logs.mkdir(exist_ok=True)
        rb_idle, _ = regionbus_gateway(
            a_kafka,
            b_kafka,
            stack.redis_url,
            options,
            idle_logs,
            send_when_idle=True,
            lag_only=True,
        )
        if mm2:
            progress.phase(console, f"MirrorMaker 2: {sizes} ...")
        peer = mirror_maker_2(a_kafka, b_kafka, options, log_dir) if mm2 else None
    geode_sites: dict[str, PhaseResult] = {}
    if geode:
        # Geode needs neither Kafka nor Redis: its sites run after the stack is down.
        progress.phase(console, f"Apache Geode WAN, serial then parallel sender: {sizes} ...")
        geode_sites = geode_wan(options, log_dir / "geode")
    report(rb, raw, options, console, peer, rb_idle)
    if geode_sites:
        print_geode_wan(geode_sites, options, console)
    else:
        console.print("Apache Geode's WAN was not run (--no-geode).")
    emit(
        [
            SummaryRow(
                "gateway",
                "events/s through one serial sender",
                rb.events_per_s,
                raw.events_per_s,
                "raw consume→produce mirror",
            ),
            SummaryRow(
                "gateway",
                "events/s drained from a backlog by one serial sender",
                rb.drain_events_per_s,
                raw.events_per_s,
                "raw consume→produce mirror",
            ),
            SummaryRow(
                "gateway",
                f"replication lag p99 at {options.rate}/s (ms)",
                rb.lag_p99_ms,
                raw.lag_p99_ms,
                "raw mirror lag p99",
                higher_is_better=False,
            ),
            SummaryRow(
                "gateway",
                f"replication lag p99 at {options.rate}/s, send_when_idle (ms)",
                rb_idle.lag_p99_ms,
                raw.lag_p99_ms,
                "raw mirror lag p99",
                higher_is_better=False,
            ),
            *mirror_maker_rows(rb, peer, options),
            *geode_wan_rows(rb, geode_sites, options),
        ]
    )


if __name__ == "__main__":
    main()
