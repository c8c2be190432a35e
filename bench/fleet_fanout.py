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
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

from rich.console import Console

from bench import progress
from bench.cpu import CpuMeter
from bench.fleet_phases import register_durable_clients
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
from bench.scaling_figures import RegisteredPoint
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
    with fleet_server(run, options, "fanout") as (services, server):
        writer_cache, writer = writer_client(services, options)
        try:
            first: RegisteredPoint | None = None
            steps = fanout_steps(
                server.pid,
                writer,
                client_settings(services, options),
                counts=options.fanout_subscribers,
                ops=options.fanout_ops,
                processes=options.registering_processes,
                console=run.console,
                kafka_pid=run.local.kafka.pid if run.local.kafka is not None else None,
            )
            for step in steps:
                first = first or step
                _add_figures(run, step, first)
            _check_routed(run, services, options, len(set(options.fanout_subscribers)))
        finally:
            writer_cache.close()


def fanout_steps(
    server_pid: int | None,
    writer: Region,
    settings: dict[str, Any],
    *,
    counts: Iterable[int],
    ops: int,
    processes: int,
    console: Console,
    kafka_pid: int | None,
) -> Iterator[RegisteredPoint]:
    """Durable clients of ``settings`` (``ClientSettings`` fields) register ``ALL_KEYS``
    and go away, in steps up to each of ``counts``, spread over at most ``processes``
    children; at each step the CPU of the server (process ``server_pid``) is read for
    :data:`IDLE_S` without puts, then over ``ops`` puts of ``writer`` (the broker's too,
    with ``kafka_pid``). Durable clients 0 .. max(counts) - 1 stay registered.

    Raises:
        BenchError: a registering child failed or did not answer.
    """
    # Untimed: the writer's and the server's first puts open connections and load the
    # Redis scripts.
    puts(writer, min(ops, WINDOW))
    registered = 0
    for count in sorted(set(counts)):
        progress.phase(
            console,
            f"{count - registered:,} more durable clients register ALL_KEYS and go away, "
            f"{count:,} in all (load {load_now()}) ...",
        )
        register_durable_clients(
            settings, processes=processes, first=registered, count=count - registered,
            all_keys=True,
        )  # fmt: skip
        registered = count
        load = os.getloadavg()
        progress.phase(
            console,
            f"the server's CPU for {IDLE_S:g} s without puts, then {ops:,} puts to "
            f"{count:,} subscribers (load {load_now()}) ...",
        )
        idle = idle_cpu_per_s(server_pid)
        server_us, kafka_us, above_idle_us = cpu_per_put(server_pid, kafka_pid, writer, ops, idle)
        yield RegisteredPoint(count, server_us, kafka_us, idle * 1e3, above_idle_us, load)


def puts(writer: Region, ops: int, keys: Sequence[str] = ()) -> int:
    """``ops`` pipelined puts (:data:`WINDOW` in flight, :data:`KEY_SPACE` keys, or
    ``keys`` in turn); returns how many were acked."""
    _, acks = write_async(
        writer, ops=ops, window=WINDOW, key_space=KEY_SPACE, value_bytes=VALUE_BYTES, keys=keys
    )
    return acks.acked


def idle_cpu_per_s(server_pid: int | None) -> float:
    """The server's CPU seconds per second over :data:`IDLE_S` without puts."""
    meter = CpuMeter({"server": server_pid})
    began = time.monotonic()
    meter.start()
    time.sleep(IDLE_S)  # a reading over a span of time, not a wait on a condition
    used = meter.stop()
    return used.get("server", math.nan) / (time.monotonic() - began)


def cpu_per_put(
    server_pid: int | None,
    kafka_pid: int | None,
    writer: Region,
    ops: int,
    idle_cpu: float,
    keys: Sequence[str] = (),
) -> tuple[float, float, float]:
    """``ops`` puts (to ``keys`` in turn, when given); the server's and the broker's CPU per
    acked put, and the server's above what it used at ``idle_cpu`` (CPU seconds per
    second) over as long, in µs (the broker's NaN without ``kafka_pid``)."""
    meter = CpuMeter({"server": server_pid, "kafka": kafka_pid})
    began = time.monotonic()
    meter.start()
    acked = puts(writer, ops, keys)
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


def _add_figures(run: Run, step: RegisteredPoint, first: RegisteredPoint) -> None:
    count = step.subscribers
    is_first = step is first
    load = " ".join(f"{x:.1f}" for x in step.load_average)
    run.add(
        Figure(
            "fanout",
            f"server CPU per put, {_subscribers(count)} sharing ALL_KEYS (µs)",
            step.server_cpu_us_per_op,
            "-" if is_first else f"<= {FLAT_FACTOR:g} x at {first.subscribers:,}",
            None
            if is_first
            else step.server_cpu_us_per_op <= FLAT_FACTOR * first.server_cpu_us_per_op,
            math.nan if is_first else first.server_cpu_us_per_op,
            "" if is_first else f"the same at {_subscribers(first.subscribers)}",
            load,
        )
    )
    for figure, value in (
        (f"Kafka broker CPU per put, {_subscribers(count)} sharing ALL_KEYS (µs)",
         step.kafka_cpu_us_per_op),
        (f"server CPU without puts, {_subscribers(count)} registered (ms per s)",
         step.idle_server_ms_per_s),
        (f"server CPU per put above that, {_subscribers(count)} sharing ALL_KEYS (µs)",
         step.above_idle_us_per_op),
    ):  # fmt: skip
        run.add(Figure("fanout", figure, value, "-", None, load=load))


def _subscribers(count: int) -> str:
    return f"{count:,} subscriber" + ("" if count == 1 else "s")


__all__ = [
    "FLAT_FACTOR",
    "IDLE_S",
    "cpu_per_put",
    "fanout_phase",
    "fanout_steps",
    "idle_cpu_per_s",
    "puts",
]
