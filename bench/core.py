"""The core benchmark: one cache server, many subscribers, against raw Kafka in the same run.

``python -m bench.core`` measures, on one Kafka and Redis (the local stack unless
``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL`` name others):

(a) operations applied per second and events delivered per second through one cache
    server with ``--subscribers`` ``ALL_KEYS`` subscribers (in their own process);
(b) put → remote listener latency at ``--rate`` puts per second;
(c) raw confluent-kafka baselines with the same message sizes and client settings:
    produce → consume throughput (one consumer, and as many as subscribers), a
    two-hop relay (producer → topic → relay process → topic → consumer) for latency,
    and a bare fan-out relay (the 16-partition operations topic copied by one process
    to one topic per subscriber, each read by its own consumer: the server's hot path
    without decoding or Redis) for (a);
(d) phases (b) and (a) again with the store on a Redis Cluster of 3 masters and 3
    replicas, beside one Redis: ops/s and CPU per operation (on 2 cores a cost, not a
    speed-up), and (e) with ``WAIT 1`` after every batch: the latency of waiting for a
    replica (``bench.redis_cluster``; ``--no-redis-cluster`` skips both);
(g) ``get_all`` of ``--get-all-keys`` keys and (q) a one-shot OQL query over
    ``--read-entries`` entries, one call at a time, each beside raw Redis reading the same
    entries (``bench.reads``; ``--no-reads`` skips both; Apache Geode's ``getAll`` and
    query are ``bench.peers.geode``'s);

then prints every figure and the ratios regionbus ÷ raw (see ``bench/README.md``). Before
any timed phase the fan-out relay runs once untimed, so that every phase finds the broker's
JVM already compiled (its JIT otherwise burns seconds of CPU in the first phase).
Machines are noisy: compare the ratios, not the absolute figures.

The raw baselines are ``bench.raw``, the writers ``bench.load``, what every phase is given
``bench.services``; this module runs the regionbus phases and the whole run.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import secrets
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from types import FrameType
from typing import Any, Final, TypeVar

import click
from rich.console import Console
from rich.table import Table

from bench import progress
from bench.options import (
    fetch_wait_option,
    idle_timeout_option,
    json_option,
    linger_option,
    value_bytes_option,
)
from bench.phases import regionbus_latency, regionbus_throughput
from bench.raw import raw_fanout_relay, raw_relay_latency, raw_throughput
from bench.reads import print_reads, run_reads
from bench.reads_figures import QUERY_REGION, ReadFigures, ReadOptions
from bench.reads_figures import summary_rows as read_rows
from bench.redis_cluster import (
    ClusterFigures,
    cluster_rows,
    print_cluster,
    run_on_redis_cluster,
)
from bench.report import Figures, Latency, Targets, Throughput
from bench.server import BenchError, one_server_stack
from bench.services import REGION, BenchOptions, Services
from bench.summary import SummaryRow, emit
from bench.tracing import TracingFigures, print_tracing, tracing_overhead, tracing_rows
from regionbus.clients import BytesSerializer, ClientCache, ClientSettings, RegionShortcut

log = logging.getLogger("regionbus.bench")

_TABLE_WIDTH = 120
_Figures = TypeVar("_Figures")
_POSITIVE = click.IntRange(min=1)
_AT_LEAST_8 = click.IntRange(min=8)  # the send time takes 8 bytes


# --- the run ---------------------------------------------------------------------------


def run_or_exit(run: Callable[[], _Figures], console: Console) -> _Figures:
    """Run a benchmark and return its figures; on Ctrl-C or SIGTERM (exit 130) or a
    :class:`BenchError` (exit 1) say why and exit, everything started having stopped."""
    try:
        with sigterm_as_interrupt(), progress.heartbeat(console):
            return run()
    except KeyboardInterrupt:
        console.print("interrupted: everything stopped", style="red")
        sys.exit(130)
    except BenchError as exc:
        console.print(f"benchmark failed: {exc}", style="red")
        sys.exit(1)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Let SIGTERM unwind like Ctrl-C, so every child and the stack are stopped."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _latency_and_regionbus_phases(
    services: Services, options: BenchOptions, console: Console
) -> tuple[Latency, Latency, Throughput]:
    """Phases (b), (c2) and (a), with one writer client for both regionbus phases: a
    ``PROXY`` region, which keeps no local copy of what it writes, as Apache Geode's writer
    in ``bench.peers.geode`` and the raw producers beside it keep none."""
    writer_cache = ClientCache(
        ClientSettings(**services.client_settings(options, subscription_enabled=False))
    )
    try:
        writer = writer_cache.create_region(
            REGION, RegionShortcut.PROXY, serializer=BytesSerializer()
        )
        # The broker's first run of a workload costs it far more CPU per message than the
        # next (measured at 200 lone puts/s, three runs of (b) in a row on one broker: its
        # CPU per put 6,222, then 2,443, then 1,788 µs; p99 96, 10.5, 8.3 ms): the JIT
        # and first writes of the paths this workload takes, which the raw fan-out relay's
        # warm-up does not take. Both latency phases run once untimed first, so each is
        # measured on a broker that has run it.
        progress.phase(
            console,
            f"(w) warm-up, untimed: (b) and (c2) once each, {options.rate}/s for "
            f"{options.latency_seconds} s ...",
        )
        regionbus_latency(services, options, writer)
        raw_relay_latency(services, options, label="relay-warmup")
        progress.phase(
            console, f"(b) regionbus: {options.rate} puts/s for {options.latency_seconds} s ..."
        )
        rb_latency = regionbus_latency(services, options, writer)
        progress.phase(
            console, f"(c2) raw relay: {options.rate} msgs/s for {options.latency_seconds} s ..."
        )
        relay_latency = raw_relay_latency(services, options)
        progress.phase(
            console, f"(a) regionbus: {options.ops:,} puts, {options.subscribers} subscribers ..."
        )
        rb_throughput = regionbus_throughput(services, options, writer)
    finally:
        writer_cache.close()
    return rb_latency, relay_latency, rb_throughput


def run(
    options: BenchOptions,
    console: Console,
    redis_cluster: bool = True,
    reads: ReadOptions | None = None,
    tracing: bool = True,
) -> tuple[Figures, Throughput, ClusterFigures | None, ReadFigures | None, TracingFigures | None]:
    """Start the stack (unless given by env) and one cache server; run every phase.

    Args:
        options: The load.
        console: Where progress goes.
        redis_cluster: Also run phases (b) and (a) with the store on a Redis Cluster,
            without and with ``WAIT`` (:mod:`bench.redis_cluster`).
        reads: The sizes of phases (g) and (q) (:mod:`bench.reads`); None skips them.
        tracing: Also run phase (a) with tracing off and on (phase (t), :mod:`bench.tracing`).

    Returns:
        The figures, the fan-out relay's (phase (c3)), the Redis Cluster's, the read
        phases' and the tracing phase's (each None when not run).

    Raises:
        BenchError: a child process failed or did not answer in time.
        StackError: Kafka or Redis could not be started.
    """
    namespace = f"bench.{secrets.token_hex(3)}"
    with ExitStack() as stack:
        local, services = one_server_stack(
            stack, "core", namespace, options, console, (REGION, QUERY_REGION)
        )
        # A fresh broker spends seconds of CPU compiling its own code (the JVM's JIT) in
        # whichever phase comes first, which on 2 cores was most of the "kafka" CPU of
        # phase (a) while the raw phases, run later, found it warm: every phase now starts
        # on a warm broker.
        progress.phase(
            console, f"(w) warm-up, untimed: the raw fan-out relay of {options.ops:,} messages ..."
        )
        raw_fanout_relay(services, options, options.subscribers, label="warmup")
        rb_latency, relay_latency, rb_throughput = _latency_and_regionbus_phases(
            services, options, console
        )
        # The closed writer's librdkafka handles go only when collected; before the stack
        # stops, or they log failed reconnects.
        gc.collect()
        progress.phase(
            console,
            f"(c1) raw: {options.ops:,} messages, 1 and {options.subscribers} consumers ...",
        )
        raw_one = raw_throughput(services, options, 1, "tp1")
        raw_fan = raw_throughput(services, options, options.subscribers, "fanout")
        console.print(
            f"(c3) raw fan-out relay: {options.ops:,} messages to {options.subscribers} topics ..."
        )
        fanout_relay = raw_fanout_relay(services, options, options.subscribers)
        read_figures = None
        if reads is not None:
            progress.phase(
                console,
                f"(g) get_all of {reads.keys_per_call} keys x {reads.calls:,}, (q) an OQL "
                f"query over {reads.entries:,} entries x {reads.query_runs}, and raw Redis ...",
            )
            read_figures = run_reads(services, options, reads)
        log_dir = progress.current_log_dir()
        traced = tracing_overhead(local, options, console, log_dir) if tracing else None
        on_cluster = (
            run_on_redis_cluster(local, options, console, log_dir) if redis_cluster else None
        )
        settings = {
            **asdict(options),
            "kafka_source": local.kafka_source,
            "redis_source": local.redis_source,
            "namespace": namespace,
        }
    figures = Figures(
        settings=settings,
        regionbus_throughput=rb_throughput,
        regionbus_latency=rb_latency,
        raw_throughput=raw_one,
        raw_fanout=raw_fan,
        raw_relay_latency=relay_latency,
        targets=Targets(),
    )
    return figures, fanout_relay, on_cluster, read_figures, traced


FANOUT_RELAY_TARGET = 0.5
"""Ops applied per second with the subscribers attached, at least this fraction of the bare
fan-out relay's messages relayed per second (phase (c3))."""


def print_fanout_relay(figures: Figures, relay: Throughput, console: Console) -> None:
    """Print phase (a) beside the bare fan-out relay (c3): rates, ratios, CPU per message."""
    tp = figures.regionbus_throughput
    ratio = tp.acked_per_s / relay.acked_per_s if relay.acked_per_s else math.nan
    table = Table(title=f"(a) beside a bare fan-out relay to {relay.readers} topics (c3)")
    for column in ("figure", "regionbus", "fan-out relay", "ratio", "target", "met"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    table.add_row(
        "ops applied/s vs messages relayed/s",
        f"{tp.acked_per_s:,.0f}",
        f"{relay.acked_per_s:,.0f}",
        f"{ratio:.2f}x",
        f"≥ {FANOUT_RELAY_TARGET}x",
        "yes" if ratio >= FANOUT_RELAY_TARGET else "NO",
    )
    table.add_row(
        "events delivered/s (all readers)",
        f"{tp.delivered_per_s:,.0f}",
        f"{relay.delivered_per_s:,.0f}",
        f"{tp.delivered_per_s / relay.delivered_per_s:.2f}x" if relay.delivered_per_s else "n/a",
        "",
        "",
    )
    table.add_row("delivered / expected", f"{tp.delivered:,}", f"{relay.delivered:,}", "", "", "")
    for process in ("server", "relay", "kafka", "readers"):
        ours, theirs = tp.cpu_us_per_op(process), relay.cpu_us_per_op(process)
        if not (math.isnan(ours) and math.isnan(theirs)):
            table.add_row(f"CPU µs per op: {process}", _us(ours), _us(theirs), "", "", "")
    console.print(table)


CPU_PER_PUT_PROCESSES: Final = ("writer", "server", "relay", "readers", "kafka", "redis")
"""The processes of phases (b) and (c2) whose CPU per put is printed (``readers``: the
subscriber, or the relay's sink)."""


def cpu_per_put(latency: Latency) -> dict[str, float]:
    """``{process: CPU µs per put}`` of a paced phase, with ``total`` (NaN-free sum)."""
    shares = {p: latency.cpu_us_per_message(p) for p in CPU_PER_PUT_PROCESSES}
    shares = {p: v for p, v in shares.items() if not math.isnan(v)}
    return {**shares, "total": sum(shares.values())}


def print_cpu_per_put(figures: Figures, console: Console) -> None:
    """Print the CPU per lone put of phase (b) beside the two-hop relay's (c2), per process."""
    ours, theirs = cpu_per_put(figures.regionbus_latency), cpu_per_put(figures.raw_relay_latency)
    rate = figures.regionbus_latency.achieved_rate_per_s
    table = Table(title=f"CPU µs per put at {rate:,.0f}/s, 1 subscriber: (b) beside (c2)")
    for column in ("process", "regionbus", "two-hop relay"):
        table.add_column(column, justify="left" if column == "process" else "right")
    for process in (*CPU_PER_PUT_PROCESSES, "total"):
        if process in ours or process in theirs:
            table.add_row(
                process, _us(ours.get(process, math.nan)), _us(theirs.get(process, math.nan))
            )
    # The whole machine, every process: near the core count, a put waits for a core, and
    # the latencies measure that wait as much as the path.
    table.add_row(
        f"machine's busy cores (of {os.cpu_count()})",
        _cores(figures.regionbus_latency.machine_busy_cores),
        _cores(figures.raw_relay_latency.machine_busy_cores),
    )
    console.print(table)


def _us(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def _cores(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def summary_rows(figures: Figures, fanout_relay: Throughput | None = None) -> list[SummaryRow]:
    """The headline figures of a run for ``bench.all``'s table (with the fan-out relay's
    row when given)."""
    tp, raw, fan = figures.regionbus_throughput, figures.raw_throughput, figures.raw_fanout
    latency, relay = figures.regionbus_latency, figures.raw_relay_latency
    rows = [
        SummaryRow(
            "core", "ops applied/s", tp.acked_per_s, raw.delivered_per_s, "produce→consume msg/s"
        ),
        SummaryRow(
            "core",
            f"events delivered/s ({tp.readers} subscribers)",
            tp.delivered_per_s,
            fan.delivered_per_s,
            f"produce→{fan.readers} consumers msg/s",
        ),
        SummaryRow(
            "core",
            "put→listener latency p50 (ms)",
            latency.p50_ms,
            relay.p50_ms,
            "two-hop relay p50",
            higher_is_better=False,
        ),
        SummaryRow(
            "core",
            "put→listener latency p99 (ms)",
            latency.p99_ms,
            relay.p99_ms,
            "two-hop relay p99",
            higher_is_better=False,
        ),
    ]
    ours, theirs = cpu_per_put(latency), cpu_per_put(relay)
    if ours["total"] and theirs["total"]:
        rows.append(
            SummaryRow(
                "core",
                f"CPU µs per put at {latency.achieved_rate_per_s:,.0f}/s, 1 subscriber",
                ours["total"],
                theirs["total"],
                "two-hop relay, its processes",
                higher_is_better=False,
            )
        )
    if not math.isnan(latency.machine_busy_cores) and not math.isnan(relay.machine_busy_cores):
        rows.append(
            SummaryRow(
                "core",
                f"machine's busy cores during the latency puts (of {os.cpu_count()})",
                latency.machine_busy_cores,
                relay.machine_busy_cores,
                "the same during the two-hop relay",
                higher_is_better=False,
            )
        )
    if fanout_relay is not None:
        rows.insert(
            1,
            SummaryRow(
                "core",
                f"ops applied/s ({tp.readers} subscribers)",
                tp.acked_per_s,
                fanout_relay.acked_per_s,
                f"fan-out relay to {fanout_relay.readers} topics msg/s",
            ),
        )
    return rows


@click.command()
@click.option(
    "--ops",
    default=50_000,
    type=_POSITIVE,
    show_default=True,
    help="Puts in the throughput phase (a).",
)
@click.option(
    "--subscribers",
    default=10,
    type=_POSITIVE,
    show_default=True,
    help="Subscribers in phase (a).",
)
@click.option(
    "--rate",
    default=1_000,
    type=_POSITIVE,
    show_default=True,
    help="Puts per second in phase (b).",
)
@click.option("--latency-seconds", default=20.0, show_default=True, help="Length of (b) and (c2).")
@value_bytes_option
@fetch_wait_option(
    help_text="fetch.wait.max.ms of every consumer: clients, server and raw (the clients' default)."
)
@linger_option()
@click.option(
    "--writer",
    type=click.Choice(["async", "put-all"]),
    default="async",
    show_default=True,
    help="Phase (a) writer: put_async with a bounded window, or put_all chunks.",
)
@click.option(
    "--window",
    default=5_000,
    type=_POSITIVE,
    show_default=True,
    help="Most put_async in flight.",
)
@click.option(
    "--chunk",
    default=1_000,
    type=_POSITIVE,
    show_default=True,
    help="Entries per put_all call.",
)
@click.option(
    "--key-space",
    default=10_000,
    type=_POSITIVE,
    show_default=True,
    help="Distinct keys in phase (a).",
)
@click.option("--warmup-seconds", default=1.0, show_default=True, help="Latency not counted.")
@idle_timeout_option
@json_option
@click.option(
    "--redis-cluster/--no-redis-cluster",
    default=True,
    show_default=True,
    help="Also run (b) and (a) with the store on a Redis Cluster (3 masters, 3 replicas), "
    "without and with WAIT 1.",
)
@click.option(
    "--reads/--no-reads",
    default=True,
    show_default=True,
    help="Run (g) get_all and (q) a one-shot OQL query beside raw Redis.",
)
@click.option(
    "--read-entries",
    default=10_000,
    type=_POSITIVE,
    show_default=True,
    help="Entries pre-filled for (g) and for (q).",
)
@click.option(
    "--get-all-keys", default=100, type=_POSITIVE, show_default=True, help="Keys per get_all."
)
@click.option(
    "--get-all-calls", default=500, type=_POSITIVE, show_default=True, help="Timed get_all calls."
)
@click.option(
    "--query-runs", default=20, type=_POSITIVE, show_default=True, help="Timed runs of (q)."
)
@click.option(
    "--tracing/--no-tracing",
    default=True,
    show_default=True,
    help="Also run (a) with tracing off and on at 1 % sampling, in alternating rounds: the "
    "overhead of traces (needs the otel extra).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log phases and child pids (for profilers).")
def main(
    as_json: bool,
    verbose: bool,
    redis_cluster: bool,
    reads: bool,
    tracing: bool,
    read_entries: int,
    get_all_keys: int,
    get_all_calls: int,
    query_runs: int,
    **values: Any,
) -> None:
    """Measure regionbus throughput and latency against raw Kafka, in one run."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if verbose:
        log.setLevel(logging.INFO)
    options = BenchOptions(**values)
    if options.writer == "put-all" and options.chunk > options.key_space:
        raise click.BadParameter(
            "at most --key-space (the keys of a chunk must differ)", param_hint="--chunk"
        )
    if get_all_keys > read_entries:
        raise click.BadParameter(
            "at most --read-entries (the keys of a call differ)", param_hint="--get-all-keys"
        )
    read_options = (
        ReadOptions(read_entries, get_all_keys, get_all_calls, query_runs, options.value_bytes)
        if reads
        else None
    )
    console = Console(width=None if sys.stdout.isatty() else _TABLE_WIDTH)
    figures, fanout_relay, on_cluster, read_figures, traced = run_or_exit(
        lambda: run(options, console, redis_cluster, read_options, tracing), console
    )
    figures.print_table(console)
    print_fanout_relay(figures, fanout_relay, console)
    print_cpu_per_put(figures, console)
    rows = summary_rows(figures, fanout_relay)
    if on_cluster is not None:
        single = figures.regionbus_throughput
        print_cluster(single, figures.regionbus_latency, on_cluster, console)
        rows += cluster_rows(single, figures.regionbus_latency, on_cluster)
    if read_figures is not None:
        print_reads(read_figures, console)
        rows += read_rows(read_figures)
    if traced is not None:
        print_tracing(traced, console)
        rows += tracing_rows(traced)
    emit(rows)
    if as_json:
        data = {**json.loads(figures.as_json()), "raw_fanout_relay": asdict(fanout_relay)}
        if on_cluster is not None:
            data["redis_cluster"] = asdict(on_cluster)
        if read_figures is not None:
            data["reads"] = asdict(read_figures)
        if traced is not None:
            data["tracing"] = {
                **asdict(traced),
                "overhead": traced.overhead,
                "cpu_overhead": traced.cpu_overhead,
            }
        print(json.dumps(data), flush=True)


if __name__ == "__main__":
    main()
