"""``bench.fleet``'s fan-out phase (goal 4 past what fits as live caches): the cache server's
CPU per put as 1 to 1,000 subscribers share one interest.

``bench.scaling`` measures the same with live subscriber caches, each a process's worth of
librdkafka clients, and 1,000 of them do not fit on a 2-core machine beside the broker
(bench/RESULTS.md). The server does not route by whether a client is connected: a durable
client's events are queued the same while it is away. So here the subscribers are
durable clients that register ``ALL_KEYS`` and go away, added in steps up to each count of
``--fanout-subscribers``; at each step the server's CPU is read over a few seconds
without puts (what its registered clients cost it whatever is put), then a writer puts
``--fanout-ops`` puts and the server's (and the broker's, when this run started it) CPU per
put is read, and the server's above its reading without puts. The baseline of
each step is the first step's figure: flat means the same CPU per put, whatever the number
of subscribers sharing the interest (one record per partition of the shared queue topic,
:mod:`regionbus.broker.audiences`).
"""

from __future__ import annotations

import math
import time
from typing import Final

from bench import progress
from bench.cpu import CpuMeter
from bench.fleet_phases import register_durables
from bench.fleet_run import (
    Figure,
    FleetOptions,
    Run,
    client_settings,
    fleet_server,
    load_now,
    writer_client,
)
from bench.fleet_workers import reconnect_durable
from bench.load import write_async
from bench.server import ServerProcess
from bench.services import REGION, Services
from regionbus.clients import Region

FLAT_FACTOR: Final = 1.5
"""At most this many times the first step's server CPU per put counts as flat: the
machines are noisy (bench/README.md), and routing client by client grew 10x from 1 to
100 subscribers."""

WINDOW: Final = 1_000
"""Most puts in flight."""

KEY_SPACE: Final = 10_000
"""Distinct keys written."""

VALUE_BYTES: Final = 24
"""Bytes of each value (the first 8 are the send time)."""

REPLAY_TIMEOUT_S: Final = 120.0
"""Longest wait for the first subscriber's replay once back."""

IDLE_S: Final = 5.0
"""How long the server's CPU is read without puts at each step: what it spends on its
registered clients whatever is put (liveness, the reaper, queue depths), which the CPU per
put also holds."""


def fanout_phase(run: Run, options: FleetOptions) -> None:
    """Goal 4 with registered subscribers (see the module's description).

    Raises:
        BenchError: the server, a registering child or the writer failed or did not answer.
    """
    counts = sorted(set(options.fanout_subscribers))
    with fleet_server(run, options, "fanout") as (services, server):
        writer_cache, writer = writer_client(services, options)
        try:
            # Untimed: the writer's and the server's first puts open connections and
            # load the Redis scripts.
            _puts(writer, min(options.fanout_ops, WINDOW))
            first: tuple[int, float] | None = None
            registered = 0
            for count in counts:
                progress.phase(
                    run.console,
                    f"4: {count - registered:,} more durable clients register ALL_KEYS "
                    f"and go away, {count:,} in all (load {load_now()}) ...",
                )
                register_durables(
                    services, options, first=registered, count=count - registered, all_keys=True
                )
                registered = count
                load = load_now()
                progress.phase(
                    run.console,
                    f"4: the server's CPU for {IDLE_S:g} s without puts, then "
                    f"{options.fanout_ops:,} puts to {count:,} subscribers (load {load}) ...",
                )
                idle = _idle_cpu(server)
                server_us, kafka_us, above_idle_us = _cpu_per_put(
                    run, services, server, writer, options, idle
                )
                if first is None:
                    first = (count, server_us)
                _add_figures(run, count, server_us, kafka_us, first, load)
                _add_idle_figures(run, count, idle, above_idle_us, load)
            _check_routed(run, services, options, len(counts))
        finally:
            writer_cache.close()


def _puts(writer: Region, ops: int) -> int:
    _, acks = write_async(
        writer, ops=ops, window=WINDOW, key_space=KEY_SPACE, value_bytes=VALUE_BYTES
    )
    return acks.acked


def _idle_cpu(server: ServerProcess) -> float:
    """The server's CPU seconds per second over :data:`IDLE_S` without puts."""
    meter = CpuMeter({"server": server.pid})
    began = time.monotonic()
    meter.start()
    time.sleep(IDLE_S)  # a reading over a span of time, not a wait on a condition
    used = meter.stop()
    return used.get("server", math.nan) / (time.monotonic() - began)


def _cpu_per_put(
    run: Run,
    services: Services,
    server: ServerProcess,
    writer: Region,
    options: FleetOptions,
    idle_cpu: float,
) -> tuple[float, float, float]:
    """``--fanout-ops`` puts; the server's and the broker's CPU per acked put, and the
    server's above what it used at ``idle_cpu`` (CPU seconds per second) over as long, in
    µs (the broker's NaN when this run did not start it)."""
    kafka_pid = run.local.kafka.pid if run.local.kafka is not None else None
    meter = CpuMeter({"server": server.pid, "kafka": kafka_pid})
    began = time.monotonic()
    meter.start()
    acked = _puts(writer, options.fanout_ops)
    used = meter.stop()
    elapsed_s = time.monotonic() - began
    if acked == 0:
        return math.nan, math.nan, math.nan
    server_s = used.get("server", math.nan)
    return (
        server_s / acked * 1e6,
        used.get("kafka", math.nan) / acked * 1e6,
        (server_s - idle_cpu * elapsed_s) / acked * 1e6,
    )


def _check_routed(run: Run, services: Services, options: FleetOptions, steps: int) -> None:
    """The first subscriber, back, replays every put of every step before its marker:
    the CPU read was the server's routing to subscribers away, not the lack of it."""
    load = load_now()
    progress.phase(run.console, f"4: the first subscriber comes back (load {load}) ...")
    expected = options.fanout_ops * steps
    heard = reconnect_durable(client_settings(services, options), REGION, 0, REPLAY_TIMEOUT_S)
    replayed = sum(1 for *_, before_marker in heard["events"] if before_marker)
    run.add(
        Figure(
            "fanout",
            f"events the first subscriber replayed before its marker (of {expected:,} put)",
            replayed,
            f"= {expected:,}",
            replayed == expected,
            load=load,
        )
    )


def _add_figures(
    run: Run,
    count: int,
    server_us: float,
    kafka_us: float,
    first: tuple[int, float],
    load: str,
) -> None:
    first_count, first_us = first
    is_first = count == first_count
    run.add(
        Figure(
            "fanout",
            f"server CPU per put, {_subscribers(count)} sharing ALL_KEYS (µs)",
            server_us,
            "-" if is_first else f"<= {FLAT_FACTOR:g} x at {first_count:,}",
            None if is_first else server_us <= FLAT_FACTOR * first_us,
            math.nan if is_first else first_us,
            "" if is_first else f"the same at {_subscribers(first_count)}",
            load,
        )
    )
    run.add(
        Figure(
            "fanout",
            f"Kafka broker CPU per put, {_subscribers(count)} sharing ALL_KEYS (µs)",
            kafka_us,
            "-",
            None,
            load=load,
        )
    )


def _add_idle_figures(
    run: Run, count: int, idle_cpu: float, above_idle_us: float, load: str
) -> None:
    run.add(
        Figure(
            "fanout",
            f"server CPU without puts, {_subscribers(count)} registered (ms per s)",
            idle_cpu * 1e3,
            "-",
            None,
            load=load,
        )
    )
    run.add(
        Figure(
            "fanout",
            f"server CPU per put above that, {_subscribers(count)} sharing ALL_KEYS (µs)",
            above_idle_us,
            "-",
            None,
            load=load,
        )
    )


def _subscribers(count: int) -> str:
    return f"{count:,} subscriber" + ("" if count == 1 else "s")


__all__ = ["FLAT_FACTOR", "fanout_phase"]
