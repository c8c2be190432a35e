"""The regionbus phases of ``bench.core``, run on whatever store a run gives them: (a)
throughput with every subscriber receiving every event, (b) paced put → listener latency.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from bench.cpu import CpuMeter, MachineCpu
from bench.load import Acks, paced_puts, write_async, write_put_all
from bench.report import Latency, Throughput, latency, throughput
from bench.services import REGION, RESULT_TIMEOUT_S, BenchOptions, Services
from bench.workers import Child, run_subscribers
from regionbus.clients import Region


def regionbus_latency(services: Services, options: BenchOptions, writer: Region) -> Latency:
    """Phase (b): paced ``put_async`` to one remote client's listener, with the CPU of each
    process and the machine's busy cores while the writer sent (``machine_busy_cores``:
    near ``os.cpu_count()``, the latencies include waits for a core)."""
    with Child(
        run_subscribers,
        "rb-latency-subscriber",
        settings=services.client_settings(options),
        region=REGION,
        clients=1,
        record_latency=True,
        idle_timeout_s=options.idle_timeout_s,
    ) as subscriber:
        subscriber.wait_ready()
        cpu = CpuMeter({"writer": os.getpid(), **services.pids})
        machine = MachineCpu()
        cpu.start()
        machine.start()
        sent, acknowledged, first_ns, last_ns = paced_puts(
            writer, options.rate, options.latency_seconds, options.value_bytes
        )
        busy_cores = machine.stop()
        subscriber.expect(acknowledged)
        result = subscriber.wait_result(RESULT_TIMEOUT_S)
        cpu.stop()
    return latency(
        sent=sent,
        start_ns=first_ns,
        end_ns=last_ns,
        warmup_s=options.warmup_seconds,
        readers=result,
        machine_busy_cores=busy_cores,
        cpu_s=cpu.used_s,
    )


def _write(region: Region, options: BenchOptions) -> tuple[int, Acks]:
    """The throughput phase's puts, as ``--writer`` says."""
    if options.writer == "async":
        return write_async(
            region,
            ops=options.ops,
            window=options.window,
            key_space=options.key_space,
            value_bytes=options.value_bytes,
        )
    return write_put_all(
        region,
        ops=options.ops,
        chunk=options.chunk,
        key_space=options.key_space,
        value_bytes=options.value_bytes,
    )


def regionbus_throughput(
    services: Services,
    options: BenchOptions,
    writer: Region,
    subscriber_settings: Mapping[str, Any] | None = None,
) -> Throughput:
    """Phase (a): pipelined puts with every subscriber receiving every event;
    ``subscriber_settings`` overrides the subscribers' ``ClientSettings`` fields."""
    with Child(
        run_subscribers,
        "rb-subscribers",
        settings=services.client_settings(options, **(subscriber_settings or {})),
        region=REGION,
        clients=options.subscribers,
        record_latency=False,
        idle_timeout_s=options.idle_timeout_s,
    ) as subscribers:
        subscribers.wait_ready(timeout_s=60.0 + 10.0 * options.subscribers)
        cpu = CpuMeter({"writer": os.getpid(), **services.pids})
        cpu.start()
        start_ns, acks = _write(writer, options)
        subscribers.expect(acks.acked)
        result = subscribers.wait_result(RESULT_TIMEOUT_S)
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


__all__ = ["regionbus_latency", "regionbus_throughput"]
