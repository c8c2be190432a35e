"""``bench.fleet``'s idle phase: what a connected client cache that receives nothing costs,
beside a raw Kafka consumer per client.

A fleet is mostly idle clients, and a machine of many of them (``bench.scaling``'s 1,000
subscribers) runs out of cores before any event flows. ``--idle-caches`` caches with
``ALL_KEYS`` interest connect (``SUBSCRIBERS_PER_PROCESS`` to a process, as the live
subscribers), settle until their readers have gone idle (``IDLE_AFTER_S``), then their
processes' CPU and the Kafka broker's are read for ``IDLE_SECONDS``. The same number of
raw consumers (one ``assign()`` consumer per client, polling every 100 ms, the same
``fetch.wait.max.ms``, as many to a process) are read the same way. The broker's own idle
CPU, read for as long before either, is taken off both.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Final

from bench import progress
from bench.cpu import CpuMeter
from bench.fleet_run import (
    SUBSCRIBERS_PER_PROCESS,
    Figure,
    FleetOptions,
    Run,
    fleet_server,
    load_now,
    subscriber_children,
)
from bench.raw import raw_idle_readers
from bench.scaling_figures import process_sizes
from regionbus.clients.poll_pace import IDLE_AFTER_S

IDLE_SECONDS: Final = 20.0
"""How long the idle CPU is read, in seconds."""

SETTLE_S: Final = IDLE_AFTER_S + 2.0
"""How long connected readers are left before the reading: a cache's readers poll briskly
for ``IDLE_AFTER_S`` after their last work."""


def idle_phase(run: Run, options: FleetOptions) -> None:
    """Idle cost per client cache (see the module's description)."""
    kafka_pid = run.local.kafka.pid if run.local.kafka is not None else None
    if kafka_pid is None:
        progress.phase(run.console, "idle: skipped, Kafka is not this run's (no broker CPU)")
        return
    count = options.idle_caches
    sizes = process_sizes(count, SUBSCRIBERS_PER_PROCESS)
    with fleet_server(run, options, "idle") as (services, _server):
        progress.phase(
            run.console, f"idle: the broker with the server alone, {IDLE_SECONDS:.0f} s ..."
        )
        broker_alone_s = _cpu_s({"kafka": kafka_pid}, [])["kafka"]
        progress.phase(
            run.console, f"idle: {count} client caches connect, then idle (load {load_now()}) ..."
        )
        settings = services.client_settings(options.bench_options(1))
        load = load_now()
        with ExitStack() as stack:
            children = subscriber_children(stack, settings, count, "idle", record_latency=False)
            caches = _cpu_s({"kafka": kafka_pid}, [c.pid for c in children])
        progress.phase(run.console, f"idle: {count} raw consumers connect, then idle ...")
        with ExitStack() as stack:
            readers = raw_idle_readers(stack, services, options.bench_options(count), sizes)
            raw = _cpu_s({"kafka": kafka_pid}, [c.pid for c in readers])
    run.console.print(
        f"  CPU s over {IDLE_SECONDS:.0f} s: broker alone {broker_alone_s:.2f}; caches "
        f"{caches['clients']:.2f}, broker {caches['kafka']:.2f}; raw consumers "
        f"{raw['clients']:.2f}, broker {raw['kafka']:.2f}"
    )
    per_cache_ms = 1000 / IDLE_SECONDS / count
    run.add(
        Figure(
            "idle",
            f"an idle client cache's CPU in its process, of {count} (ms per s)",
            caches["clients"] * per_cache_ms,
            "-",
            None,
            raw["clients"] * per_cache_ms,
            "an idle raw consumer per client",
            load,
        )
    )
    run.add(
        Figure(
            "idle",
            f"the broker's CPU per idle client cache, of {count} (ms per s)",
            max(caches["kafka"] - broker_alone_s, 0.0) * per_cache_ms,
            "-",
            None,
            max(raw["kafka"] - broker_alone_s, 0.0) * per_cache_ms,
            "an idle raw consumer per client",
            load,
        )
    )


def _cpu_s(services: dict[str, int], clients: list[int | None]) -> dict[str, float]:
    """CPU seconds of ``services`` and of the ``clients`` processes together, over
    ``IDLE_SECONDS`` after ``SETTLE_S`` (the server just started, or clients just
    connected)."""
    time.sleep(SETTLE_S)
    pids: dict[str, int | list[int] | None] = dict(services)
    pids["clients"] = [pid for pid in clients if pid is not None]
    meter = CpuMeter(pids)
    meter.start()
    time.sleep(IDLE_SECONDS)
    used = meter.stop()
    return {name: used.get(name, 0.0) for name in pids}


__all__ = ["IDLE_SECONDS", "SETTLE_S", "idle_phase"]
