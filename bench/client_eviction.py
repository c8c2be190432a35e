"""Client eviction benchmark: a client taking a million entries into an LRU-bounded region.

``python -m bench.client_eviction`` measures, on one Kafka and Redis (the local stack) and
one cache server in a child process:

1. set-up (not timed): a writer puts ``--entries`` entries of ``--value-bytes`` bytes into
   region ``bench`` (``put_all`` chunks);
2. for each of two clients, each in a process of its own: one region bounded by
   ``EvictionAttributes.lru_entry_count(--lru)``, and the **baseline**, the same region
   unbounded. Each registers ``ALL_KEYS`` interest with values, so the servers send it
   every entry, and its process's RSS is sampled every 0.2 s from before the registration
   to after it. Measured: the RSS before, at its peak and after, the entries held, the
   evictions, and how long the registration took.

The bounded client's RSS stays flat (its peak minus its start is the LRU's entries and
what one reply chunk holds), while the baseline's grows with the entries; the ratio is
bounded ÷ unbounded growth. Machines are noisy: compare the ratios, not the absolute
figures (``bench/README.md``).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from contextlib import ExitStack, suppress
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from bench import progress
from bench.core import run_or_exit
from bench.server import ServerProcess
from bench.summary import SummaryRow, emit
from bench.workers import Child, child_signals
from regionbus.clients import (
    ALL_KEYS,
    BytesSerializer,
    ClientCache,
    ClientSettings,
    EvictionAttributes,
)

log = logging.getLogger("regionbus.bench")

REGION = "bench"
_CHUNK = 50_000
_SAMPLE_EVERY_S = 0.2
_READ_TIMEOUT_MS = 600_000


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_registering_client(conn: Connection, *, settings: dict[str, Any], lru: int | None) -> None:
    """Child: a client that registers ``ALL_KEYS`` on a region bounded by ``lru`` entries
    (None: unbounded), sampling its own RSS. Result: ``rss_before``, ``rss_peak``,
    ``rss_after`` (MiB), ``held``, ``evictions`` and ``seconds``."""
    child_signals()
    cache = ClientCache(ClientSettings(**settings))
    try:
        eviction = EvictionAttributes.lru_entry_count(lru) if lru else None
        region = cache.create_region(REGION, serializer=BytesSerializer(), eviction=eviction)
        conn.send(("ready", None))
        peak = before = _rss_mib()
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(_SAMPLE_EVERY_S):
                peak = max(peak, _rss_mib())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        began = time.monotonic()
        region.register_interest(ALL_KEYS)
        seconds = time.monotonic() - began
        done.set()
        sampler.join()
        after = _rss_mib()
        conn.recv()
        conn.send(
            (
                "result",
                {
                    "rss_before": before,
                    "rss_peak": max(peak, after),
                    "rss_after": after,
                    "held": len(region),
                    "evictions": region.evictions,
                    "seconds": seconds,
                },
            )
        )
    finally:
        with suppress(Exception):
            cache.close()


def run(entries: int, lru: int, value_bytes: int, console: Console) -> dict[str, dict[str, Any]]:
    """Start the stack and a server, load the entries, and measure both clients.

    Raises:
        BenchError: the server did not start, or a client did not finish in time.
        StackError: Kafka or Redis could not be started.
    """
    namespace = f"bench.{secrets.token_hex(3)}"
    results: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        local, work_dir = progress.embedded_stack(stack, "client_eviction", console)
        stack.enter_context(
            ServerProcess(
                namespace=namespace,
                kafka_bootstrap_servers=local.kafka_bootstrap_servers,
                redis_url=local.redis_url,
                regions=(REGION,),
                fetch_wait_max_ms=100,
                linger_ms=5,
                log_path=work_dir / "server.log",
            )
        )
        settings: dict[str, Any] = {
            "namespace": namespace,
            "kafka_bootstrap_servers": local.kafka_bootstrap_servers,
            "read_timeout_ms": _READ_TIMEOUT_MS,
        }
        writer = ClientCache(ClientSettings(**settings, subscription_enabled=False))
        try:
            region = writer.create_region(REGION, serializer=BytesSerializer())
            value = b"v" * value_bytes
            for start in range(0, entries, _CHUNK):
                progress.phase(console, f"loading entries {start:,} to {start + _CHUNK:,} ...")
                stop = min(entries, start + _CHUNK)
                region.put_all({f"e{i:07d}": value for i in range(start, stop)})
        finally:
            writer.close()
        for name, bound in (("bounded", lru), ("unbounded", None)):
            progress.phase(console, f"{name} client registers ALL_KEYS over {entries:,} ...")
            with Child(run_registering_client, name, settings=settings, lru=bound) as child:
                child.wait_ready()
                results[name] = child.result(_READ_TIMEOUT_MS / 1000)
            console.print(f"  {name}: {results[name]}")
    return results


@click.command()
@click.option("--entries", default=1_000_000, show_default=True, type=click.IntRange(1))
@click.option("--lru", default=10_000, show_default=True, type=click.IntRange(1))
@click.option("--value-bytes", default=24, show_default=True, type=click.IntRange(1))
def main(entries: int, lru: int, value_bytes: int) -> None:
    """Measure a client's RSS as it takes ENTRIES entries into an LRU of LRU entries."""
    logging.basicConfig(level=logging.WARNING)
    console = Console()
    results = run_or_exit(lambda: run(entries, lru, value_bytes, console), console)
    bounded, unbounded = results["bounded"], results["unbounded"]
    grown = bounded["rss_peak"] - bounded["rss_before"]
    baseline = unbounded["rss_peak"] - unbounded["rss_before"]
    console.print(
        f"RSS growth taking {entries:,} entries: LRU {lru:,}: {grown:.1f} MiB "
        f"(holds {bounded['held']:,}, evicted {bounded['evictions']:,}); unbounded: "
        f"{baseline:.1f} MiB (holds {unbounded['held']:,}); ratio {grown / baseline:.3f}"
    )
    emit(
        [
            SummaryRow(
                "client_eviction",
                f"client RSS growth taking {entries:,} entries, LRU of {lru:,} (MiB)",
                grown,
                baseline,
                "the same client unbounded",
                higher_is_better=False,
            )
        ]
    )


if __name__ == "__main__":
    main()
