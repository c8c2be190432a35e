"""Scaling benchmark: how throughput and latency change with subscribers and buckets.

``python -m bench.scaling`` measures, on one Kafka and Redis (the local stack unless
``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL`` name others), at every point of two series:

* subscribers: ``--subscribers`` counts (default 1, 10, 100) with the default 16
  buckets;
* buckets: ``--buckets`` counts (default 1, 16, 64) with ``--fixed-subscribers`` (10);
* registered subscribers: ``--registered-subscribers`` counts (default 1, 10, 100, 1,000)
  of durable clients that register ``ALL_KEYS`` and go away, on a 16-bucket server of
  their own (``bench.fleet_fanout``; off with ``--no-registered``);

(a) operations applied per second and events delivered per second: ``--ops`` pipelined
    ``put_async`` (``bench.load``) with every subscriber holding ``ALL_KEYS`` interest;
(b) put → listener latency p50 / p99 at ``--rate`` puts per second, every subscriber
    recording (so at 100 subscribers the latency of 100 listeners, not of one);
(c) the cache server's CPU microseconds per put during (a), routing to every subscriber
    included (beside Kafka's when this run started it): flat in the subscriber count when
    the subscribers share one registration (one record per partition of the shared queue
    topic, `regionbus.broker.audiences`), where routing client by client grew with it;
(d) for the registered subscribers, the server's CPU per put over ``--registered-ops`` puts
    at each count: a live cache is a process's worth of librdkafka clients, and 1,000 of
    them do not fit on a 2-core machine beside the broker (bench/RESULTS.md), but the
    server routes to a durable client the same whether it is connected or not. Plotted
    beside the live subscribers' and Geode's.

Apache Geode stands beside the subscriber series (``--geode-subscribers``, off with
``--no-geode``): its 1.15.1 cache server's CPU microseconds per put, puts/s and events/s
with that many subscriber client caches holding ``ALL_KEYS`` interest, a JVM each, so
memory bounds the count (``bench.peers.geode_scaling``). It runs after regionbus's points
and their baselines, once the stack has stopped; it is skipped, saying why, when Java or
the Geode jars are missing or a count does not fit in memory.

Subscribers are ``bench.workers.run_subscribers`` children of at most
``--subscribers-per-process`` clients each (100 subscribers: 4 processes of 25; the raw
fan-out baseline's consumers are spread the same way). A bucket
count is a cache server of its own (``REGIONBUS_TOTAL_BUCKETS``) in a namespace of its own;
the subscriber series shares the 16-bucket server. The raw Kafka baselines of the same run
(``bench.raw``, on topics of 16 partitions): produce → 1 consumer msg/s beside ops/s,
produce → N consumers msg/s beside events/s (once per subscriber count), the two-hop relay
beside the latency (once). Raw Kafka has no buckets, so a bucket point is compared with the
same 16-partition baselines. The load average before each point is printed and kept.

It prints the tables (with Geode's, a third: the subscriber series beside Geode), writes
them as Markdown (``--markdown``, for ``bench/RESULTS.md``) and
plots both series (``--plot``, default ``bench/scaling.png``); the figures, table and plot
are ``bench.scaling_figures``. Machines are noisy: compare the shapes and ratios, not the
absolute figures (``bench/README.md``).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from bench import progress
from bench.core import run_or_exit
from bench.cpu import CpuMeter
from bench.fleet_fanout import fanout_steps
from bench.load import paced_puts, write_async
from bench.options import (
    counts,
    fetch_wait_option,
    idle_timeout_option,
    json_option,
    linger_option,
    value_bytes_option,
)
from bench.peers import geode_scaling
from bench.raw import raw_relay_latency, raw_throughput
from bench.report import Latency, Throughput, latency, throughput
from bench.scaling_figures import (
    GeodePoint,
    PointFigures,
    RegisteredPoint,
    markdown_table,
    merge_results,
    plot,
    process_sizes,
    summary_rows,
)
from bench.scaling_tables import print_tables
from bench.server import ServerProcess
from bench.services import REGION, RESULT_TIMEOUT_S, BenchOptions, Services
from bench.summary import emit
from bench.workers import Child, run_subscribers
from regionbus.clients import BytesSerializer, ClientCache, ClientSettings, Region
from regionbus.devstack import LocalStack
from regionbus.schemas.naming import DEFAULT_TOTAL_BUCKETS

log = logging.getLogger("regionbus.bench")

_TABLE_WIDTH = 140
_POSITIVE = click.IntRange(min=1)
_READY_S_PER_CLIENT = 10.0
REGISTERING_PROCESSES = 4
"""Children registering the registered subscribers' durable clients."""


@dataclass(frozen=True, slots=True)
class ScalingOptions:
    """The options of one run (see ``python -m bench.scaling --help``)."""

    subscriber_counts: tuple[int, ...]
    bucket_counts: tuple[int, ...]
    fixed_subscribers: int
    subscribers_per_process: int
    ops: int
    rate: int
    latency_seconds: float
    value_bytes: int
    fetch_wait_max_ms: int
    linger_ms: int
    window: int
    key_space: int
    warmup_seconds: float
    idle_timeout_s: float
    geode: bool = True
    geode_subscriber_counts: tuple[int, ...] = geode_scaling.DEFAULT_COUNTS
    registered: bool = True
    registered_subscriber_counts: tuple[int, ...] = (1, 10, 100, 1_000)
    registered_ops: int = 20_000

    def bench_options(self, subscribers: int) -> BenchOptions:
        """The ``bench.core`` options of one point (what ``bench.raw`` and the writers take)."""
        return BenchOptions(
            ops=self.ops,
            subscribers=subscribers,
            rate=self.rate,
            latency_seconds=self.latency_seconds,
            value_bytes=self.value_bytes,
            fetch_wait_max_ms=self.fetch_wait_max_ms,
            linger_ms=self.linger_ms,
            writer="async",
            window=self.window,
            chunk=self.window,
            key_space=self.key_space,
            warmup_seconds=self.warmup_seconds,
            idle_timeout_s=self.idle_timeout_s,
        )

    def points(self) -> list[tuple[int, int]]:
        """Every ``(subscribers, buckets)`` to measure, once each, by bucket count (one
        server each) then subscriber count."""
        wanted = {(n, DEFAULT_TOTAL_BUCKETS) for n in self.subscriber_counts}
        wanted |= {(self.fixed_subscribers, b) for b in self.bucket_counts}
        return sorted(wanted, key=lambda point: (point[1], point[0]))


# --- the phases ------------------------------------------------------------------------


@contextmanager
def subscriber_group(
    services: Services, options: ScalingOptions, clients: int, *, record_latency: bool
) -> Iterator[list[Child]]:
    """Start ``clients`` subscribers in ``bench.workers.run_subscribers`` children of at
    most ``subscribers_per_process`` each; yields the children once every one is ready.

    A child is started once the one before it is ready: started together, a thousand
    subscribers' processes and connects loaded this 2-core machine to ~200 and their
    connects timed out (an application's clients do not all start in the same second).

    Raises:
        BenchError: a child exited or was not ready in time.
    """
    settings = services.client_settings(options.bench_options(clients))
    with ExitStack() as stack:
        children: list[Child] = []
        for index, size in enumerate(process_sizes(clients, options.subscribers_per_process)):
            child = stack.enter_context(
                Child(
                    run_subscribers,
                    f"scaling-subscribers-{index}",
                    settings=settings,
                    region=REGION,
                    clients=size,
                    record_latency=record_latency,
                    idle_timeout_s=options.idle_timeout_s,
                )
            )
            child.wait_ready(timeout_s=60.0 + _READY_S_PER_CLIENT * size)
            children.append(child)
        yield children


def _results(children: Sequence[Child], expected: int) -> dict[str, Any]:
    for child in children:
        child.expect(expected)
    return merge_results([child.wait_result(RESULT_TIMEOUT_S) for child in children])


def point_latency(
    services: Services, options: ScalingOptions, subscribers: int, writer: Region
) -> Latency:
    """Phase (b) of a point: paced ``put_async`` to ``subscribers`` recording listeners."""
    with subscriber_group(services, options, subscribers, record_latency=True) as children:
        sent, acknowledged, first_ns, last_ns = paced_puts(
            writer, options.rate, options.latency_seconds, options.value_bytes
        )
        result = _results(children, acknowledged)
    return latency(
        sent=sent,
        start_ns=first_ns,
        end_ns=last_ns,
        warmup_s=options.warmup_seconds,
        readers=result,
    )


def point_throughput(
    services: Services, options: ScalingOptions, subscribers: int, writer: Region
) -> Throughput:
    """Phase (a) of a point: pipelined puts, every subscriber receiving every event."""
    with subscriber_group(services, options, subscribers, record_latency=False) as children:
        cpu = CpuMeter({name: services.pids.get(name) for name in ("server", "kafka")})
        cpu.start()
        start_ns, acks = write_async(
            writer,
            ops=options.ops,
            window=options.window,
            key_space=options.key_space,
            value_bytes=options.value_bytes,
        )
        result = _results(children, acks.acked)
        cpu.stop()
    return throughput(
        sent=options.ops,
        acked=acks.acked,
        errors=acks.errors,
        start_ns=start_ns,
        last_ack_ns=acks.last_ns,
        readers=result,
        cpu_s=cpu.used_s,
    )


def measure_point(
    services: Services, options: ScalingOptions, subscribers: int, buckets: int, writer: Region
) -> PointFigures:
    """Both regionbus phases of one point (no baselines: :func:`run` adds those)."""
    load = os.getloadavg()
    rb_latency = point_latency(services, options, subscribers, writer)
    rb_throughput = point_throughput(services, options, subscribers, writer)
    return PointFigures(
        subscribers=subscribers,
        buckets=buckets,
        ops_per_s=rb_throughput.acked_per_s,
        delivered_per_s=rb_throughput.delivered_per_s,
        complete=rb_throughput.complete,
        p50_ms=rb_latency.p50_ms,
        p99_ms=rb_latency.p99_ms,
        server_cpu_us_per_op=rb_throughput.cpu_us_per_op("server"),
        kafka_cpu_us_per_op=rb_throughput.cpu_us_per_op("kafka"),
        load_average=load,
    )


@contextmanager
def bucket_server(
    local: LocalStack, options: ScalingOptions, buckets: int, work_dir: Path, name: str = ""
) -> Iterator[tuple[Services, Region]]:
    """A cache server of ``buckets`` buckets in a namespace of its own (``name`` tells
    two of the same bucket count apart), and a writer."""
    namespace = f"bench.{secrets.token_hex(3)}.b{buckets}{name}"
    with ExitStack() as stack:
        server = stack.enter_context(
            ServerProcess(
                namespace=namespace,
                kafka_bootstrap_servers=local.kafka_bootstrap_servers,
                redis_url=local.redis_url,
                regions=(REGION,),
                fetch_wait_max_ms=options.fetch_wait_max_ms,
                linger_ms=options.linger_ms,
                log_path=work_dir / f"server-{buckets}{name}.log",
                env={"REGIONBUS_TOTAL_BUCKETS": str(buckets)},
            )
        )
        services = Services(
            namespace,
            local.kafka_bootstrap_servers,
            local.redis_url,
            {"server": server.pid, "kafka": local.kafka.pid if local.kafka else None},
        )
        settings = services.client_settings(options.bench_options(1), subscription_enabled=False)
        writer_cache = ClientCache(ClientSettings(**settings))
        stack.callback(writer_cache.close)
        yield services, writer_cache.create_region(REGION, serializer=BytesSerializer())


def run(
    options: ScalingOptions, console: Console
) -> tuple[list[PointFigures], list[RegisteredPoint]]:
    """Start the stack (unless given by env) and a server per bucket count; measure every
    point, then the raw baselines, then the registered subscribers' series.

    Raises:
        BenchError: a server or child process failed or did not answer in time.
        StackError: Kafka or Redis could not be started.
    """
    points: list[PointFigures] = []
    registered: list[RegisteredPoint] = []
    with ExitStack() as stack:
        local, work_dir = progress.embedded_stack(stack, "scaling", console)
        last_services: Services | None = None
        for buckets in sorted({b for _, b in options.points()}):
            with bucket_server(local, options, buckets, work_dir) as (services, writer):
                for subscribers, _ in (p for p in options.points() if p[1] == buckets):
                    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
                    progress.phase(
                        console,
                        f"{subscribers} subscribers, {buckets} buckets (load {load}): "
                        f"{options.rate} puts/s for {options.latency_seconds} s, "
                        f"then {options.ops:,} puts ...",
                    )
                    points.append(measure_point(services, options, subscribers, buckets, writer))
                last_services = services
        assert last_services is not None
        points = raw_baselines(last_services, options, points, console)
        if options.registered:
            registered = registered_points(local, options, work_dir, console)
    return points, registered


def registered_points(
    local: LocalStack, options: ScalingOptions, work_dir: Path, console: Console
) -> list[RegisteredPoint]:
    """The registered subscribers' series, on a 16-bucket server of its own (its durable
    clients would otherwise stay registered beside the live series' subscribers).

    Raises:
        BenchError: the server or a registering child failed or did not answer in time.
    """
    with bucket_server(local, options, DEFAULT_TOTAL_BUCKETS, work_dir, "registered") as (
        services,
        writer,
    ):
        server = services.pids["server"]
        assert isinstance(server, int)
        return list(
            fanout_steps(
                server,
                writer,
                services.client_settings(options.bench_options(1)),
                counts=options.registered_subscriber_counts,
                ops=options.registered_ops,
                processes=REGISTERING_PROCESSES,
                console=console,
                kafka_pid=local.kafka.pid if local.kafka is not None else None,
            )
        )


def raw_baselines(
    services: Services, options: ScalingOptions, points: list[PointFigures], console: Console
) -> list[PointFigures]:
    """``points`` with the raw baselines of this run: the relay and produce → 1 consumer
    once, produce → N consumers once per subscriber count (all on 16 partitions)."""
    progress.phase(console, f"raw: relay at {options.rate} msgs/s, produce → 1 consumer ...")
    relay = raw_relay_latency(services, options.bench_options(1))
    one = raw_throughput(services, options.bench_options(1), 1, "scaling-tp1")
    fanout: dict[int, float] = {1: one.delivered_per_s}
    for subscribers in sorted({p.subscribers for p in points} - {1}):
        progress.phase(console, f"raw: produce → {subscribers} consumers ...")
        fanout[subscribers] = raw_throughput(
            services,
            options.bench_options(subscribers),
            subscribers,
            f"scaling-fan{subscribers}",
            per_process=options.subscribers_per_process,
        ).delivered_per_s
    return [
        replace(
            p,
            raw_ops_per_s=one.delivered_per_s,
            raw_delivered_per_s=fanout[p.subscribers],
            raw_p50_ms=relay.p50_ms,
            raw_p99_ms=relay.p99_ms,
        )
        for p in points
    ]


def geode_points(options: ScalingOptions, console: Console) -> list[GeodePoint]:
    """Apache Geode at every ``--geode-subscribers`` count that fits in memory (none with
    ``--no-geode``), on ``--ops`` puts after as many not counted."""
    if not options.geode:
        console.print("Apache Geode not run (--no-geode)", style="dim")
        return []
    return geode_scaling.measure(
        options.geode_subscriber_counts,
        ops=options.ops,
        value_bytes=options.value_bytes,
        key_space=options.key_space,
        idle_timeout_s=options.idle_timeout_s,
        console=console,
    )


@click.command()
@click.option(
    "--subscribers",
    "subscriber_counts",
    default="1,10,100",
    show_default=True,
    callback=lambda _c, _p, v: counts(v),
    help="Subscriber counts of the subscriber series (16 buckets), live caches each.",
)
@click.option(
    "--buckets",
    "bucket_counts",
    default="1,16,64",
    show_default=True,
    callback=lambda _c, _p, v: counts(v),
    help="Bucket counts of the bucket series (--fixed-subscribers).",
)
@click.option(
    "--fixed-subscribers",
    default=10,
    type=_POSITIVE,
    show_default=True,
    help="Subscribers at every point of the bucket series.",
)
@click.option(
    "--subscribers-per-process",
    default=25,
    type=_POSITIVE,
    show_default=True,
    help="Most subscriber clients in one child process.",
)
@click.option(
    "--ops",
    default=5_000,
    type=_POSITIVE,
    show_default=True,
    help="Puts in every throughput phase.",
)
@click.option(
    "--rate",
    default=100,
    type=_POSITIVE,
    show_default=True,
    help="Puts per second in every latency phase.",
)
@click.option(
    "--latency-seconds", default=5.0, show_default=True, help="Length of every latency phase."
)
@value_bytes_option
@fetch_wait_option()
@linger_option()
@click.option(
    "--window", default=2_000, type=_POSITIVE, show_default=True, help="Most put_async in flight."
)
@click.option(
    "--key-space",
    default=10_000,
    type=_POSITIVE,
    show_default=True,
    help="Distinct keys in the throughput phases.",
)
@click.option("--warmup-seconds", default=1.0, show_default=True, help="Latency not counted.")
@idle_timeout_option
@click.option(
    "--geode/--no-geode",
    default=True,
    show_default=True,
    help="Run Apache Geode beside the subscriber series (skipped, saying why, when Java or "
    "its jars are missing).",
)
@click.option(
    "--geode-subscribers",
    "geode_subscriber_counts",
    default=",".join(str(n) for n in geode_scaling.DEFAULT_COUNTS),
    show_default=True,
    callback=lambda _c, _p, v: counts(v),
    help="Subscriber counts of Apache Geode's points, a JVM each. Memory bounds them: a "
    f"subscriber JVM (-Xmx{geode_scaling.SUBSCRIBER_HEAP}, serial GC, C1 only) was 123 MiB "
    f"resident here, budgeted {geode_scaling.SUBSCRIBER_RSS_BYTES // geode_scaling.MIB} MiB, "
    f"plus {geode_scaling.FIXED_BYTES // geode_scaling.GIB} GiB for the server and writer, "
    f"within {geode_scaling.MEMORY_BUDGET_BYTES // geode_scaling.GIB} GiB (half this shared "
    "machine): 64 fit. A count over that, or over 80% of the memory available at the "
    "time, is skipped and said so.",
)
@click.option(
    "--registered/--no-registered",
    default=True,
    show_default=True,
    help="Measure the server's CPU per put with durable clients registered with ALL_KEYS "
    "and away (the fan-out of counts live caches do not reach on one machine).",
)
@click.option(
    "--registered-subscribers",
    "registered_subscriber_counts",
    default="1,10,100,1000",
    show_default=True,
    callback=lambda _c, _p, v: counts(v),
    help="Durable client counts of the registered series, added in steps.",
)
@click.option(
    "--registered-ops",
    default=20_000,
    type=_POSITIVE,
    show_default=True,
    help="Puts at each registered count (at 60 µs a put, 20,000 are 120 clock ticks of "
    "server CPU).",
)
@click.option(
    "--markdown",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the tables as Markdown here (for bench/RESULTS.md).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("bench/scaling.png"),
    show_default=True,
    help="The PNG of both series.",
)
@json_option
def main(
    as_json: bool, markdown: Path | None, plot_path: Path, **values: Any
) -> None:  # fmt: skip
    """Measure throughput and latency at several subscriber and bucket counts, against raw
    Kafka in the same run."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    options = ScalingOptions(**values)
    console = Console(width=None if sys.stdout.isatty() else _TABLE_WIDTH)
    # One heartbeat and log folder for both: Geode's members log beside regionbus's.
    (points, registered), geode = run_or_exit(
        lambda: (run(options, console), geode_points(options, console)), console
    )
    print_tables(
        points,
        console,
        fixed_subscribers=options.fixed_subscribers,
        ops=options.ops,
        rate=options.rate,
        registered_ops=options.registered_ops,
        geode=geode,
        registered=registered,
    )
    table = markdown_table(points, options.fixed_subscribers, geode, registered)
    if markdown is not None:
        markdown.write_text(table, encoding="utf-8")
        console.print(f"markdown written to {markdown}")
    written = plot(points, options.fixed_subscribers, plot_path, geode, registered)
    console.print(f"plot written to {written}")
    emit(summary_rows(points, geode, registered))
    if as_json:
        print(
            json.dumps(
                {
                    **asdict(options),
                    "points": [asdict(p) for p in points],
                    "geode_points": [asdict(g) for g in geode],
                    "registered_points": [asdict(r) for r in registered],
                }
            )
        )


if __name__ == "__main__":
    main()
