"""Apache Geode beside ``bench.scaling``'s subscriber series: its cache server's CPU per put.

``bench.scaling --geode-subscribers 1,10,60`` runs the Geode harness (:mod:`bench.peers.geode`)
once per count: one Geode 1.15.1 cache server, that many subscriber client caches holding
``ALL_KEYS`` interest (a JVM each: a Geode client cache is one per JVM), ``--ops`` puts not
counted (so the server's JIT has compiled its put and fan-out paths), then ``--ops`` counted
puts, with the server's user + system CPU time from the first counted put until every
subscriber had the last. No latency or failover phase.

Memory bounds the count, not CPU: every subscriber is a JVM. With
:data:`SUBSCRIBER_HEAP` and :data:`SUBSCRIBER_JVM_OPTIONS` (serial GC, the C1 compiler only,
a small code cache and thread stacks: a client that only counts events needs no more) one
measured about 123 MiB resident on this machine (1 and 10 subscribers, 10,000 events each;
with the JVM's defaults and ``-Xmx96m`` it was 170 MiB). :func:`counts_that_fit` allows
:data:`SUBSCRIBER_RSS_BYTES` (160 MiB, that with margin) per subscriber plus
:data:`FIXED_BYTES` for the server and the writer (``-Xmx1g`` each) within
:data:`MEMORY_BUDGET_BYTES` (12 GiB, half of this shared 24 GiB machine) and within 80 % of
what the kernel says is available at the time; a count that does not fit is skipped and
said so. (12 GiB - 2 GiB) ÷ 160 MiB = 64, hence :data:`DEFAULT_COUNTS` 1, 10, 60.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from functools import partial
from typing import Final

from rich.console import Console

from bench import progress
from bench.peers.geode import run_harness
from bench.peers.geode_figures import GeodeFigures
from bench.peers.jvm import PeerSetupError, ensure_geode_jars
from bench.scaling_figures import GeodePoint

MIB: Final = 1024 * 1024
GIB: Final = 1024 * MIB

SUBSCRIBER_HEAP: Final = "64m"
"""The ``-Xmx`` of a subscriber JVM: its region holds at most ``--key-space`` entries."""

SUBSCRIBER_JVM_OPTIONS: Final = (
    "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=32m -Xss256k"
)
"""JVM options of a subscriber: the least memory a client that counts events needs. They
change the subscribers only; the server whose CPU is measured keeps the JVM's defaults."""

SUBSCRIBER_RSS_BYTES: Final = 160 * MIB
"""A subscriber JVM's resident size as budgeted: 123 MiB measured, with margin."""

FIXED_BYTES: Final = 2 * GIB
"""The cache server's and the writer's JVMs (``-Xmx1g`` each; 0.35 GiB resident measured
for the server with 10 subscribers)."""

MEMORY_BUDGET_BYTES: Final = 12 * GIB
"""The most all of a Geode point's JVMs may take: half of this shared 24 GiB machine."""

AVAILABLE_SHARE: Final = 0.8
"""The share of the kernel's available memory a point may take (others run beside it)."""

DEFAULT_COUNTS: Final = (1, 10, 60)
"""(12 GiB - 2 GiB) ÷ 160 MiB = 64 subscribers fit; 60 with 1 and 10 below it."""

WRITER_THREADS: Final = 16
"""Threads doing Geode's synchronous puts, as ``bench.peers.geode``'s default."""

_TIMEOUT_S_PER_SUBSCRIBER: Final = 20.0


def point_bytes(subscribers: int) -> int:
    """The memory a Geode point of ``subscribers`` subscribers is budgeted, in bytes."""
    return FIXED_BYTES + subscribers * SUBSCRIBER_RSS_BYTES


def counts_that_fit(
    counts: Sequence[int], available_bytes: int | None, budget_bytes: int = MEMORY_BUDGET_BYTES
) -> tuple[list[int], list[int]]:
    """Split subscriber counts into those whose point fits in memory and those that do not.

    Args:
        counts: Subscriber counts, in the order to run them.
        available_bytes: The kernel's available memory in bytes (``MemAvailable``); None
            when unknown, then only ``budget_bytes`` bounds.
        budget_bytes: The most a point may take, in bytes.

    Returns:
        ``(fit, skipped)``, each in the order of ``counts``.
    """
    limit = budget_bytes
    if available_bytes is not None:
        limit = min(limit, int(available_bytes * AVAILABLE_SHARE))
    fit = [n for n in counts if point_bytes(n) <= limit]
    return fit, [n for n in counts if n not in fit]


def available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; None when unknown (not Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def geode_point(figures: GeodeFigures, load_average: tuple[float, float, float]) -> GeodePoint:
    """The Geode point of one harness run."""
    return GeodePoint(
        subscribers=figures.subscribers,
        version=figures.version,
        ops_per_s=figures.puts_per_s,
        delivered_per_s=figures.events_per_s,
        complete=figures.complete,
        server_cpu_us_per_op=figures.server_cpu_us_per_put,
        subscriber_rss_bytes=figures.subscriber_rss_max_bytes,
        load_average=load_average,
    )


def measure(
    counts: Sequence[int],
    *,
    ops: int,
    value_bytes: int,
    key_space: int,
    idle_timeout_s: float,
    console: Console,
) -> list[GeodePoint]:
    """Run the Geode harness once per subscriber count that fits in memory.

    A missing Java or jars that cannot be resolved skip Geode, a count that does not fit is
    skipped, and a harness run that fails loses its point only: each is printed, none
    raises, so regionbus's figures of the same run are kept.

    Args:
        counts: Subscriber counts (ALL_KEYS interest each).
        ops: Puts not counted, then puts counted.
        value_bytes: Bytes per value.
        key_space: Distinct keys.
        idle_timeout_s: A subscriber gives up after this long without an event, in seconds.
        console: Where progress and skips are printed.

    Returns:
        The points measured, by subscriber count.
    """
    try:
        ensure_geode_jars()
    except PeerSetupError as exc:
        console.print(
            f"Apache Geode skipped: its jars or Java are missing ({exc}); "
            "`bash scripts/bootstrap.sh --peers` resolves them, --no-geode skips this",
            style="yellow",
            highlight=False,
            markup=False,
        )
        return []
    points: list[GeodePoint] = []
    for subscribers in sorted(set(counts)):
        fit, _ = counts_that_fit([subscribers], available_bytes())
        if not fit:
            console.print(
                f"Apache Geode at {subscribers} subscribers skipped: "
                f"{point_bytes(subscribers) / GIB:.1f} GiB budgeted "
                f"({SUBSCRIBER_RSS_BYTES // MIB} MiB per subscriber JVM) is over "
                f"{MEMORY_BUDGET_BYTES / GIB:.0f} GiB or {AVAILABLE_SHARE:.0%} of the memory "
                "available now",
                style="yellow",
                highlight=False,
            )
            continue
        load = os.getloadavg()
        work_dir = progress.current_log_dir() / f"geode-{subscribers}"
        work_dir.mkdir(parents=True, exist_ok=True)
        stderr_path = work_dir / "harness.stderr"
        progress.phase(
            console,
            f"Apache Geode: {subscribers} subscriber JVMs, {ops:,} puts not counted, then "
            f"{ops:,} counted (load {' '.join(f'{x:.1f}' for x in load)}) ...",
            partial(progress.last_line, stderr_path),
        )
        harness_options: dict[str, object] = {
            "ops": ops,
            "warmup_ops": ops,
            "subscribers": subscribers,
            "value_bytes": value_bytes,
            "key_space": key_space,
            "writer_threads": WRITER_THREADS,
            "idle_timeout_s": idle_timeout_s,
            "latency": "false",
            "failover": "false",
            "subscriber_heap": SUBSCRIBER_HEAP,
            "subscriber_jvm_options": SUBSCRIBER_JVM_OPTIONS,
        }
        try:
            figures = run_harness(
                harness_options, work_dir, 600.0 + _TIMEOUT_S_PER_SUBSCRIBER * subscribers
            )
        except (RuntimeError, ValueError) as exc:
            console.print(
                f"Apache Geode at {subscribers} subscribers failed: {exc}",
                style="red",
                highlight=False,
                markup=False,
            )
            continue
        point = geode_point(figures, load)
        rss = (
            "n/a"
            if math.isnan(point.subscriber_rss_bytes)
            else (f"{point.subscriber_rss_bytes / MIB:.0f} MiB")
        )
        console.print(
            f"Apache Geode {point.version}, {subscribers} subscribers: server CPU "
            f"{point.server_cpu_us_per_op:,.0f} µs per put, {point.ops_per_s:,.0f} puts/s, "
            f"{point.delivered_per_s:,.0f} events/s, a subscriber JVM {rss} resident",
            highlight=False,
        )
        points.append(point)
    return points


__all__ = [
    "DEFAULT_COUNTS",
    "FIXED_BYTES",
    "MEMORY_BUDGET_BYTES",
    "SUBSCRIBER_HEAP",
    "SUBSCRIBER_JVM_OPTIONS",
    "SUBSCRIBER_RSS_BYTES",
    "available_bytes",
    "counts_that_fit",
    "geode_point",
    "measure",
    "point_bytes",
]
