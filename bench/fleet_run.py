"""What the phases of ``bench.fleet`` share: the options, the figures, the run, and the
servers, clients and Kafka readings every phase uses."""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.scaling_figures import process_sizes
from bench.server import ServerProcess
from bench.services import REGION, BenchOptions, Services
from bench.workers import Child, run_subscribers, stamped_value
from regionbus.clients import BytesSerializer, ClientCache, ClientSettings, Region
from regionbus.devstack import LocalStack
from regionbus.schemas.kafka_clients import kafka_admin

TABLE_WIDTH = 140
PHASES = ("fleet", "cleanup", "requests", "stalled", "idle", "fanout", "abuse", "storms")
SUBSCRIBERS_PER_PROCESS = 10
CLEANUP_SILENCE_MS = 3_000
CLEANUP_DURABLE_TIMEOUT_S = 8
CLEANUP_REAPER_S = 1.0
CLEANUP_MARGIN_S = 2 * CLEANUP_REAPER_S + CLEANUP_SILENCE_MS / 4000 + 1
"""The stated margin: a liveness check and two reaper intervals, plus a second."""


@dataclass(frozen=True, slots=True)
class FleetOptions:
    """The options of one run (see ``python -m bench.fleet --help``)."""

    phases: tuple[str, ...]
    durable_clients: int
    registering_processes: int
    live_subscribers: int
    sampled: int
    rate: int
    seconds: float
    connects: int
    cleanup_clients: int
    stalled_subscribers: int
    stalled_rate: int
    stalled_seconds: float
    idle_caches: int
    fetch_wait_max_ms: int
    linger_ms: int
    fanout_subscribers: tuple[int, ...] = (1, 10, 100, 1_000)
    fanout_ops: int = 20_000
    storm_clients: int = 200
    storm_entries: int = 100_000
    storm_connects: int = 1_000

    def bench_options(self, subscribers: int) -> BenchOptions:
        """The ``bench.core`` options the raw baselines take."""
        return BenchOptions(
            ops=1,
            subscribers=subscribers,
            rate=self.rate,
            latency_seconds=self.seconds,
            value_bytes=24,
            fetch_wait_max_ms=self.fetch_wait_max_ms,
            linger_ms=self.linger_ms,
            writer="async",
            window=1,
            chunk=1,
            key_space=1,
            warmup_seconds=1.0,
            idle_timeout_s=30.0,
        )


@dataclass
class Figure:
    """One line of the table: a figure, its goal, its baseline, the load before it."""

    phase: str
    figure: str
    value: float
    goal: str
    met: bool | None
    baseline: float = math.nan
    baseline_name: str = ""
    load: str = ""
    higher_is_better: bool = False


@dataclass
class Run:
    """Where the run is, and what it measured."""

    local: LocalStack
    work_dir: Path
    console: Console
    figures: list[Figure] = field(default_factory=list)

    def add(self, figure: Figure) -> None:
        self.figures.append(figure)
        self.console.print(
            f"  {figure.figure}: {figure.value:,.2f}"
            + (
                f" (baseline {figure.baseline:,.2f} {figure.baseline_name})"
                if not math.isnan(figure.baseline)
                else ""
            )
            + f"  goal {figure.goal}: {verdict(figure.met)}"
        )


def verdict(met: bool | None) -> str:
    return "-" if met is None else ("met" if met else "NOT met")


def load_now() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def client_settings(run_services: Services, options: FleetOptions, **more: Any) -> dict[str, Any]:
    return run_services.client_settings(options.bench_options(1), **more)


@contextmanager
def fleet_server(
    run: Run,
    options: FleetOptions,
    name: str,
    env: dict[str, str] | None = None,
    regions: tuple[str, ...] = (REGION,),
) -> Iterator[tuple[Services, ServerProcess]]:
    namespace = f"fleet.{secrets.token_hex(3)}.{name}"
    with ServerProcess(
        namespace=namespace,
        kafka_bootstrap_servers=run.local.kafka_bootstrap_servers,
        redis_url=run.local.redis_url,
        regions=regions,
        fetch_wait_max_ms=100,
        linger_ms=options.linger_ms,
        log_path=run.work_dir / f"server-{name}.log",
        env=env,
    ) as server:
        yield (
            Services(
                namespace,
                run.local.kafka_bootstrap_servers,
                run.local.redis_url,
                {"server": server.pid},
            ),
            server,
        )


def subscriber_children(
    stack: ExitStack, settings: dict[str, Any], count: int, label: str, *, record_latency: bool
) -> list[Child]:
    """``count`` subscribers with ``ALL_KEYS`` interest, ``SUBSCRIBERS_PER_PROCESS`` to a
    child process, entered on ``stack`` and ready.

    Raises:
        BenchError: a child exited or was not ready in time.
    """
    children = [
        stack.enter_context(
            Child(
                run_subscribers,
                f"fleet-{label}-{i}",
                settings=settings,
                region=REGION,
                clients=size,
                record_latency=record_latency,
                idle_timeout_s=30.0,
            )
        )
        for i, size in enumerate(process_sizes(count, SUBSCRIBERS_PER_PROCESS))
    ]
    for child in children:
        child.wait_ready(60 + 10 * SUBSCRIBERS_PER_PROCESS)
    return children


def rss_mb(pid: int | None) -> tuple[float, float]:
    """Resident and peak resident memory of a process, in MiB."""
    if pid is None:
        return math.nan, math.nan
    fields = dict(
        line.split(":", 1)
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def namespace_partitions(services: Services) -> int:
    admin = kafka_admin(services.kafka_config)
    topics = admin.list_topics(timeout=10).topics
    return sum(
        len(meta.partitions) for name, meta in topics.items() if name.startswith(services.namespace)
    )


def consumer_groups(services: Services) -> set[str]:
    admin = kafka_admin(services.kafka_config)
    return {g.group_id for g in admin.list_consumer_groups(request_timeout=10).result(15).valid}


def writer_client(services: Services, options: FleetOptions) -> tuple[ClientCache, Region]:
    cache = ClientCache(
        ClientSettings(**client_settings(services, options, subscription_enabled=False))
    )
    return cache, cache.create_region(REGION, serializer=BytesSerializer())


def indexed_value(index: int) -> bytes:
    """A value stamped with its send time, then the put's index."""
    return stamped_value(8) + index.to_bytes(8, "big")
