"""``bench.core``'s phases on a Redis Cluster, beside one Redis in the same run.

The same cache server and load as phases (a) and (b), with the region store on an embedded
Redis Cluster of 3 masters and 3 replicas (append-only files on, as the single Redis of
the stack): (d) without ``WAIT``, then (e) with ``redis_wait_replicas=1``, each with a
server of its own and a namespace of its own, on the run's Kafka. CPU is summed over the
six Redis processes.

On a 2-core machine every process shares the same two cores, so this measures what the
cluster costs per operation (more Redis processes, one Lua call per slot instead of one
per batch, the replicas' work), not the speed-up of spreading the slots over machines.
"""

from __future__ import annotations

import secrets
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import progress
from bench.phases import regionbus_latency, regionbus_throughput
from bench.report import Latency, Throughput
from bench.server import ServerProcess
from bench.services import REGION, BenchOptions, Services
from bench.summary import SummaryRow
from regionbus.broker.store import RegionStore
from regionbus.clients import BytesSerializer, ClientCache, ClientSettings
from regionbus.devstack import EmbeddedRedisCluster, LocalStack
from regionbus.runtime.redis_connect import connect_redis_url
from regionbus.runtime.redis_replication import ReplicaWait
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import OperationKind
from regionbus.schemas.naming import DEFAULT_TOTAL_BUCKETS, bucket_of

STORE_BATCHES = 1_000
"""Batches the store round-trip phase applies, each timed."""

STORE_BATCH_PUTS = 10
"""Puts per batch in the store round-trip phase (a small poll batch)."""


@dataclass(frozen=True, slots=True)
class ClusterFigures:
    """Phases (a) and (b) run again on a Redis Cluster.

    Attributes:
        throughput: (d) phase (a) on the cluster, changes acknowledged without waiting.
        latency: (d) phase (b) on the cluster, without waiting.
        throughput_wait: (e) phase (a) with ``redis_wait_replicas=1``.
        latency_wait: (e) phase (b) with ``redis_wait_replicas=1``.
        apply_ms: (f) one batch applied by the region store (one pipelined round trip),
            p50 and p99 in ms: ``{"one Redis" | "Redis Cluster" | "Redis Cluster + WAIT 1":
            (p50, p99)}``.
    """

    throughput: Throughput
    latency: Latency
    throughput_wait: Throughput
    latency_wait: Latency
    apply_ms: dict[str, tuple[float, float]]


def store_round_trips(stores: dict[str, tuple[str, int]]) -> dict[str, tuple[float, float]]:
    """(f) Apply :data:`STORE_BATCHES` batches of :data:`STORE_BATCH_PUTS` puts over 16
    buckets through the region store, as a server does per poll batch, on each store in
    turn, batch by batch: every store sees the same moments of a noisy machine, so their
    difference is the cost of the store, not of what else ran meanwhile.

    Args:
        stores: ``{label: (Redis URL, redis_wait_replicas)}``.

    Returns:
        ``{label: (p50, p99)}`` of one batch's apply, ms.
    """
    clients = {label: connect_redis_url(url) for label, (url, _) in stores.items()}
    try:
        regions = {}
        for label, client in clients.items():
            store = RegionStore(
                client,
                f"bench.{secrets.token_hex(3)}",
                DEFAULT_TOTAL_BUCKETS,
                ReplicaWait(client, stores[label][1], 1_000),
            )
            store.create_region(REGION)
            regions[label] = store
        took_ms: dict[str, list[float]] = {label: [] for label in stores}
        for n in range(STORE_BATCHES):
            for label, store in regions.items():
                batch = []
                for i in range(STORE_BATCH_PUTS):
                    key = f"k{(n * STORE_BATCH_PUTS + i) % 10_000}"
                    bucket = bucket_of(REGION, key, DEFAULT_TOTAL_BUCKETS)
                    sequence = n * STORE_BATCH_PUTS + i + 1
                    batch.append(
                        store.entry_args(
                            OperationKind.PUT,
                            REGION,
                            key,
                            b"v" * 200,
                            "bytes",
                            EventID("bench", 1, sequence, bucket),
                            bucket,
                            sequence,
                            False,
                        )
                    )
                began = time.perf_counter()
                store.run_batch(batch)
                took_ms[label].append((time.perf_counter() - began) * 1000)
    finally:
        for client in clients.values():
            client.close()
    out = {}
    for label, values in took_ms.items():
        cuts = statistics.quantiles(values, n=100)
        out[label] = (cuts[49], cuts[98])
    return out


def run_on_redis_cluster(
    local: LocalStack, options: BenchOptions, console: Console, work_dir: Path
) -> ClusterFigures:
    """Start a Redis Cluster and run phases (b) and (a) on it, without and with ``WAIT``.

    Raises:
        BenchError: a child process failed or did not answer in time.
        StackError: the Redis Cluster could not be started.
    """
    figures: dict[int, tuple[Latency, Throughput]] = {}
    with EmbeddedRedisCluster() as cluster:
        progress.phase(
            console, f"(f) region store: {STORE_BATCHES:,} batches on each store, interleaved ..."
        )
        apply_ms = store_round_trips(
            {
                "one Redis": (local.redis_url, 0),
                "Redis Cluster": (cluster.url, 0),
                "Redis Cluster + WAIT 1": (cluster.url, 1),
            }
        )
        redis_pids = [node.pid for node in cluster.nodes if node.pid is not None]
        for wait in (0, 1):
            label = "(e) Redis Cluster with WAIT 1" if wait else "(d) Redis Cluster"
            namespace = f"bench.{secrets.token_hex(3)}"
            with ServerProcess(
                namespace=namespace,
                kafka_bootstrap_servers=local.kafka_bootstrap_servers,
                redis_url=cluster.url,
                regions=(REGION,),
                fetch_wait_max_ms=options.fetch_wait_max_ms,
                linger_ms=options.linger_ms,
                log_path=work_dir / f"server-redis-cluster-wait-{wait}.log",
                env={"REGIONBUS_REDIS_WAIT_REPLICAS": str(wait)},
            ) as server:
                services = Services(
                    namespace,
                    local.kafka_bootstrap_servers,
                    cluster.url,
                    {
                        "server": server.pid,
                        "kafka": local.kafka.pid if local.kafka else None,
                        "redis": redis_pids,
                    },
                )
                writer_cache = ClientCache(
                    ClientSettings(**services.client_settings(options, subscription_enabled=False))
                )
                try:
                    writer = writer_cache.create_region(REGION, serializer=BytesSerializer())
                    progress.phase(console, f"{label}: {options.rate} puts/s ...")
                    latency = regionbus_latency(services, options, writer)
                    progress.phase(console, f"{label}: {options.ops:,} puts ...")
                    throughput = regionbus_throughput(services, options, writer)
                finally:
                    writer_cache.close()
            figures[wait] = (latency, throughput)
    return ClusterFigures(
        throughput=figures[0][1],
        latency=figures[0][0],
        throughput_wait=figures[1][1],
        latency_wait=figures[1][0],
        apply_ms=apply_ms,
    )


_PROCESSES = ("server", "redis", "kafka", "readers", "writer")


def print_cluster(
    single: Throughput, single_latency: Latency, cluster: ClusterFigures, console: Console
) -> None:
    """Print the cluster's figures beside one Redis's (same run)."""
    table = Table(
        title="(d) the store on a Redis Cluster (3 masters, 3 replicas) beside one Redis, and "
        "(e) with WAIT 1; on 2 cores this is cost, not speed-up"
    )
    for column in ("figure", "one Redis", "Redis Cluster", "cluster + WAIT 1"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    rows = (single, cluster.throughput, cluster.throughput_wait)
    table.add_row("ops applied/s", *(f"{t.acked_per_s:,.0f}" for t in rows))
    for process in _PROCESSES:
        table.add_row(f"CPU µs per op: {process}", *(_us(t.cpu_us_per_op(process)) for t in rows))
    latencies = (single_latency, cluster.latency, cluster.latency_wait)
    table.add_row("put→listener p50 (ms)", *(f"{lat.p50_ms:.1f}" for lat in latencies))
    table.add_row("put→listener p99 (ms)", *(f"{lat.p99_ms:.1f}" for lat in latencies))
    applies = list(cluster.apply_ms.values())
    table.add_row(
        f"store: batch of {STORE_BATCH_PUTS} puts p50 (ms)", *(f"{a[0]:.2f}" for a in applies)
    )
    table.add_row(
        f"store: batch of {STORE_BATCH_PUTS} puts p99 (ms)", *(f"{a[1]:.2f}" for a in applies)
    )
    console.print(table)


def _us(value: float) -> str:
    return "-" if value != value else f"{value:,.0f}"


def cluster_rows(
    single: Throughput, single_latency: Latency, cluster: ClusterFigures
) -> list[SummaryRow]:
    """``bench.all`` rows: the cluster beside one Redis, and WAIT beside no WAIT."""
    tp, wait = cluster.throughput, cluster.throughput_wait
    return [
        SummaryRow(
            "core",
            "ops applied/s, Redis Cluster",
            tp.acked_per_s,
            single.acked_per_s,
            "one Redis, same run",
        ),
        SummaryRow(
            "core",
            "Redis CPU µs per op, Redis Cluster (6 nodes)",
            tp.cpu_us_per_op("redis"),
            single.cpu_us_per_op("redis"),
            "one Redis, same run",
            higher_is_better=False,
        ),
        SummaryRow(
            "core",
            "server CPU µs per op, Redis Cluster",
            tp.cpu_us_per_op("server"),
            single.cpu_us_per_op("server"),
            "one Redis, same run",
            higher_is_better=False,
        ),
        SummaryRow(
            "core",
            "put→listener p50 with WAIT 1 (ms)",
            cluster.latency_wait.p50_ms,
            cluster.latency.p50_ms,
            "Redis Cluster without WAIT p50",
            higher_is_better=False,
        ),
        SummaryRow(
            "core",
            "put→listener p99 with WAIT 1 (ms)",
            cluster.latency_wait.p99_ms,
            cluster.latency.p99_ms,
            "Redis Cluster without WAIT p99",
            higher_is_better=False,
        ),
        SummaryRow(
            "core",
            "ops applied/s with WAIT 1",
            wait.acked_per_s,
            tp.acked_per_s,
            "Redis Cluster without WAIT",
        ),
        SummaryRow(
            "core",
            f"store batch of {STORE_BATCH_PUTS} puts p50, Redis Cluster (ms)",
            cluster.apply_ms["Redis Cluster"][0],
            cluster.apply_ms["one Redis"][0],
            "one Redis, same run",
            higher_is_better=False,
        ),
        SummaryRow(
            "core",
            f"store batch of {STORE_BATCH_PUTS} puts p50 with WAIT 1 (ms)",
            cluster.apply_ms["Redis Cluster + WAIT 1"][0],
            cluster.apply_ms["Redis Cluster"][0],
            "Redis Cluster without WAIT",
            higher_is_better=False,
        ),
        SummaryRow(
            "core",
            f"store batch of {STORE_BATCH_PUTS} puts p99 with WAIT 1 (ms)",
            cluster.apply_ms["Redis Cluster + WAIT 1"][1],
            cluster.apply_ms["Redis Cluster"][1],
            "Redis Cluster without WAIT",
            higher_is_better=False,
        ),
    ]


__all__ = ["ClusterFigures", "cluster_rows", "print_cluster", "run_on_redis_cluster"]
