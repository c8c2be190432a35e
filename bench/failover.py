"""Failover benchmark: a primary killed under steady load, and 3 servers vs 1.

``python -m bench.failover`` measures, on one Kafka and Redis (the local stack unless
``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL`` name others):

1. **failover**: ``--servers`` cache server processes (``--redundancy`` secondaries per
   bucket, leases of ``--lease-ttl-ms``) started one after the other; a tracking
   subscriber (``ALL_KEYS``, its own process) records which put arrived, in which bucket,
   when it was sent and when it arrived; this process paces ``put_async`` of distinct keys
   at ``--rate`` for ``--seconds``, and ``--kill-after-s`` into it SIGKILLs the server that
   is primary of most buckets. Figures: per orphaned bucket, the time from the kill to the
   first event delivered of a put sent after the kill (and to the new lease, from the
   servers' logs); the longest silence at the listener; events re-sent (dropped by the
   subscriber's message tracking, and recognised by EventID on the servers); duplicates
   that reached the listener and acknowledged puts never delivered (both must be 0);
2. **baseline** (same run): the put → listener latency before the kill, beside a raw
   two-hop relay at the same rate (``bench.raw.raw_relay_latency``);
3. **throughput**: ``--ops`` pipelined puts through 1 server, then through ``--servers``
   (fresh namespaces), beside raw produce → consume (``bench.raw.raw_throughput``).

Machines are noisy: compare the ratios, not the absolute figures (``bench/README.md``).
The phases are ``bench.failover_phases``, their cluster ``bench.cluster``, the figures and
their table ``bench.failover_figures``; this module runs them in turn.
"""

from __future__ import annotations

import gc
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
from bench.cluster import fresh_services
from bench.core import run_or_exit
from bench.failover_figures import Figures, summary_rows
from bench.failover_phases import FailoverOptions, cluster_throughput, failover_phase
from bench.options import idle_timeout_option, json_option, value_bytes_option
from bench.raw import raw_relay_latency, raw_throughput
from bench.summary import emit
from regionbus.broker.config import ServerSettings
from regionbus.runtime.redis_connect import connect_redis_url

log = logging.getLogger("regionbus.bench")

_TABLE_WIDTH = 120
_POSITIVE = click.IntRange(min=1)


# --- the run ---------------------------------------------------------------------------


def _load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def run(options: FailoverOptions, console: Console) -> Figures:
    """Start the stack (unless given by env); run every phase.

    Raises:
        BenchError: a child process or server failed or did not answer in time.
        StackError: Kafka or Redis could not be started.
    """
    load_start = _load_average()
    with ExitStack() as stack:
        local, work_dir = progress.embedded_stack(stack, "failover", console, announce=False)
        redis_client = connect_redis_url(local.redis_url)
        stack.callback(redis_client.close)
        console.print(
            f"kafka {local.kafka_bootstrap_servers} ({local.kafka_source}), "
            f"redis {local.redis_url} ({local.redis_source}), logs in {work_dir}, "
            f"load {load_start}",
            style="dim",
        )
        progress.phase(
            console,
            f"(1) failover: {options.servers} servers, {options.rate} puts/s for "
            f"{options.seconds} s, kill after {options.kill_after_s} s ...",
        )
        failover = failover_phase(fresh_services(local), options, redis_client, work_dir)
        gc.collect()  # closed clients' librdkafka handles go before the next phase
        progress.phase(
            console, f"(2) raw relay: {options.rate} msgs/s for {options.relay_seconds} s ..."
        )
        relay = raw_relay_latency(fresh_services(local), options.core())
        one = cluster = None
        raw_per_s = math.nan
        if not options.skip_throughput:
            progress.phase(
                console,
                f"(3) throughput: {options.ops:,} puts, 1 then {options.servers} "
                "servers, then raw ...",
            )
            one = cluster_throughput(fresh_services(local), options, 1, redis_client, work_dir)
            gc.collect()
            cluster = cluster_throughput(
                fresh_services(local), options, options.servers, redis_client, work_dir
            )
            gc.collect()
            raw_per_s = raw_throughput(
                fresh_services(local), options.core(), 1, "tp"
            ).delivered_per_s
        settings = {
            **asdict(options),
            "kafka_source": local.kafka_source,
            "redis_source": local.redis_source,
            "load_average": f"{load_start} → {_load_average()}",
        }
    return Figures(settings, failover, relay, one, cluster, raw_per_s).with_ratios()


@click.command()
@click.option("--rate", default=2_000, type=_POSITIVE, show_default=True, help="Puts per second.")
@click.option(
    "--seconds",
    default=20.0,
    show_default=True,
    help="Length of the paced failover phase.",
)
@click.option(
    "--kill-after-s",
    default=6.0,
    show_default=True,
    help="Seconds into the paced phase when the busiest primary is killed.",
)
@click.option(
    "--servers",
    default=3,
    type=click.IntRange(min=2),
    show_default=True,
    help="Cache servers in the cluster.",
)
@click.option(
    "--redundancy",
    default=1,
    type=click.IntRange(min=0),
    show_default=True,
    help="REGIONBUS_SUBSCRIPTION_REDUNDANCY: secondaries per bucket.",
)
@click.option(
    "--lease-ttl-ms",
    default=5_000,
    type=click.IntRange(min=200),
    show_default=True,
    help="REGIONBUS_LEASE_TTL_MS of every server (the server default).",
)
@click.option(
    "--ops",
    default=50_000,
    type=_POSITIVE,
    show_default=True,
    help="Puts in each throughput phase.",
)
@click.option(
    "--window",
    default=5_000,
    type=_POSITIVE,
    show_default=True,
    help="Most put_async in flight.",
)
@click.option(
    "--key-space",
    default=10_000,
    type=_POSITIVE,
    show_default=True,
    help="Distinct keys in the throughput phases.",
)
@value_bytes_option
@click.option(
    "--fetch-wait-ms",
    "fetch_wait_max_ms",
    default=ServerSettings.model_fields["fetch_wait_max_ms"].default,
    show_default=True,
    help="fetch.wait.max.ms of every consumer: clients, servers and raw (the servers' "
    "default: a takeover's first fetch waits at most this long).",
)
@click.option(
    "--linger-ms",
    default=ServerSettings.model_fields["linger_ms"].default,
    show_default=True,
    help="linger.ms of every producer (the servers' default).",
)
@click.option(
    "--warmup-seconds",
    default=1.0,
    show_default=True,
    help="Latency of puts sent in the first seconds is not counted.",
)
@click.option(
    "--relay-seconds",
    default=8.0,
    show_default=True,
    help="Length of the raw relay baseline.",
)
@idle_timeout_option
@click.option("--skip-throughput", is_flag=True, help="Only the failover phase and its baseline.")
@json_option
@click.option("-v", "--verbose", is_flag=True, help="Log phases and child pids.")
def main(as_json: bool, verbose: bool, **values: Any) -> None:
    """Measure failover under steady load, and 3 servers vs 1, against raw Kafka."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if verbose:
        log.setLevel(logging.INFO)
    options = FailoverOptions(**values)
    if options.kill_after_s >= options.seconds:
        raise click.BadParameter("must be less than --seconds", param_hint="--kill-after-s")
    console = Console(width=None if sys.stdout.isatty() else _TABLE_WIDTH)
    figures = run_or_exit(lambda: run(options, console), console)
    figures.print_table(console)
    emit(summary_rows(figures))
    if as_json:
        print(figures.as_json(), flush=True)
    if not figures.correct:
        sys.exit(2)


__all__ = ["FailoverOptions", "Figures", "failover_phase", "main", "run"]


if __name__ == "__main__":
    main()
