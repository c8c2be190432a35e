"""Figures of a benchmark run, how they are derived from raw timings, and how they print.

Throughput is counted over wall time from the first send to the last acknowledgement (ops)
or to the last delivery (events); latency is receive time minus the send time carried in
the value, on one machine's wall clock.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000

_CPU_PROCESSES = ("writer", "server", "readers", "kafka", "redis")


@dataclass(frozen=True, slots=True)
class Throughput:
    """Messages sent, acknowledged and delivered in a throughput phase.

    Attributes:
        sent: Messages (operations) sent.
        acked: Of those, acknowledged (regionbus: a successful reply; raw: flushed).
        errors: Sends that failed.
        acked_per_s: ``acked`` / seconds from the first send to the last acknowledgement.
        readers: How many readers each should get every message.
        delivered: Messages received, summed over the readers.
        delivered_per_s: ``delivered`` / seconds from the first send to the last delivery.
        per_reader_per_s: The same for one reader: ``delivered_per_s / readers``.
        complete: Every reader got every acknowledged message.
        cpu_s: CPU seconds each process used in the phase (``writer``, ``server``,
            ``readers``, ``kafka``, ``redis``; only those measured).
    """

    sent: int
    acked: int
    errors: int
    acked_per_s: float
    readers: int
    delivered: int
    delivered_per_s: float
    per_reader_per_s: float
    complete: bool
    cpu_s: dict[str, float]

    def cpu_us_per_op(self, process: str) -> float:
        """CPU microseconds ``process`` used per acknowledged message; NaN if unmeasured."""
        used = self.cpu_s.get(process)
        return used * 1e6 / self.acked if used is not None and self.acked else math.nan


@dataclass(frozen=True, slots=True)
class Latency:
    """Send-to-receive latency of a paced phase, warm-up excluded.

    Attributes:
        sent: Messages sent (warm-up included).
        received: Messages received (warm-up included).
        measured: Latencies counted (sent after the warm-up).
        achieved_rate_per_s: Messages sent per second of the phase.
        p50_ms: Median, in milliseconds.
        p99_ms: 99th percentile, in milliseconds.
        max_ms: Largest, in milliseconds.
        readers_cpu_s: CPU seconds the reader processes used, from ready to done (NaN
            when not reported).
        machine_busy_cores: Cores of the whole machine busy on average while the writer
            sent (`bench.cpu.MachineCpu`; NaN when not measured).
        cpu_s: CPU seconds each process of the run used from the first send to the last
            delivery (``writer``, ``server`` or ``relay``, ``kafka``, ``redis``; only those
            measured), for the CPU per message beside ``readers_cpu_s``.
    """

    sent: int
    received: int
    measured: int
    achieved_rate_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    readers_cpu_s: float = math.nan
    machine_busy_cores: float = math.nan
    cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def readers_cpu_us_per_message(self) -> float:
        """Reader CPU per message received, in µs (NaN when none was received)."""
        return self.readers_cpu_s / self.received * 1e6 if self.received else math.nan

    def cpu_us_per_message(self, process: str) -> float:
        """CPU microseconds ``process`` used per message sent (``readers``: per message
        received); NaN if unmeasured."""
        if process == "readers":
            return self.readers_cpu_us_per_message
        used = self.cpu_s.get(process)
        return used * 1e6 / self.sent if used is not None and self.sent else math.nan


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of ascending values; NaN when there are none.

    Args:
        sorted_values: Values in ascending order.
        fraction: 0.5 for the median, 0.99 for p99.
    """
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def throughput(
    *,
    sent: int,
    acked: int,
    errors: int,
    start_ns: int,
    last_ack_ns: int,
    readers: dict[str, Any],
    cpu_s: dict[str, float],
) -> Throughput:
    """Throughput figures from a writer's timings and a reader child's result.

    Args:
        sent: Messages sent.
        acked: Messages acknowledged.
        errors: Failed sends.
        start_ns: Wall-clock time of the first send (``time.time_ns()``).
        last_ack_ns: Wall-clock time of the last acknowledgement.
        readers: The reader child's result (``counts``, ``last_ns``, ``cpu_s``).
        cpu_s: CPU seconds of the other processes in the phase, by name.
    """
    counts: list[int] = readers["counts"]
    delivered = sum(counts)
    last_delivery_ns = max(readers["last_ns"], default=start_ns)
    acked_s = max(last_ack_ns - start_ns, 1) / NS_PER_S
    delivered_s = max(last_delivery_ns - start_ns, 1) / NS_PER_S
    delivered_per_s = delivered / delivered_s if delivered else 0.0
    return Throughput(
        sent=sent,
        acked=acked,
        errors=errors,
        acked_per_s=acked / acked_s,
        readers=len(counts),
        delivered=delivered,
        delivered_per_s=delivered_per_s,
        per_reader_per_s=delivered_per_s / max(len(counts), 1),
        complete=all(c >= acked for c in counts),
        cpu_s={**cpu_s, "readers": float(readers["cpu_s"])},
    )


def latency(
    *,
    sent: int,
    start_ns: int,
    end_ns: int,
    warmup_s: float,
    readers: dict[str, Any],
    machine_busy_cores: float = math.nan,
    cpu_s: dict[str, float] | None = None,
) -> Latency:
    """Latency figures from a paced writer's timings and a reader child's result.

    Args:
        sent: Messages sent.
        start_ns: Wall-clock time of the first send.
        end_ns: Wall-clock time of the last send.
        warmup_s: Messages sent in the first ``warmup_s`` seconds are not counted.
        readers: The reader child's result (``sent_ns``, ``received_ns``, ``counts``, and
            ``cpu_s`` if known).
        machine_busy_cores: The machine's busy cores while the writer sent, if measured.
        cpu_s: CPU seconds of the run's processes over the phase (`Latency.cpu_s`).
    """
    cutoff_ns = start_ns + int(warmup_s * NS_PER_S)
    values = sorted(
        (received - sent_at) / NS_PER_MS
        for sent_at, received in zip(readers["sent_ns"], readers["received_ns"], strict=True)
        if sent_at >= cutoff_ns
    )
    return Latency(
        sent=sent,
        received=sum(readers["counts"]),
        measured=len(values),
        achieved_rate_per_s=sent / max((end_ns - start_ns) / NS_PER_S, 1e-9),
        p50_ms=percentile(values, 0.50),
        p99_ms=percentile(values, 0.99),
        max_ms=values[-1] if values else math.nan,
        readers_cpu_s=float(readers.get("cpu_s", math.nan)),
        machine_busy_cores=machine_busy_cores,
        cpu_s=dict(cpu_s or {}),
    )


@dataclass(frozen=True, slots=True)
class Targets:
    """The performance targets the core benchmark checks, on the embedded stack.

    Attributes:
        min_ops_per_s: Operations applied per second with the subscribers attached.
        max_p99_ratio: Listener p99 at most this multiple of the raw relay's p99.
    """

    min_ops_per_s: float = 5_000.0
    max_p99_ratio: float = 1.5


@dataclass(frozen=True, slots=True)
class Figures:
    """Everything one run measured.

    Attributes:
        settings: The run's options and where its Kafka and Redis came from.
        regionbus_throughput: Phase (a): puts through one server to the subscribers.
        regionbus_latency: Phase (b): put to remote listener, paced.
        raw_throughput: Phase (c1): produce to one ``assign()`` consumer.
        raw_fanout: Phase (c1): produce to as many consumers as subscribers.
        raw_relay_latency: Phase (c2): producer, topic, relay process, topic, consumer.
        targets: The targets checked.
    """

    settings: dict[str, Any]
    regionbus_throughput: Throughput
    regionbus_latency: Latency
    raw_throughput: Throughput
    raw_fanout: Throughput
    raw_relay_latency: Latency
    targets: Targets

    @property
    def ops_ratio(self) -> float:
        """regionbus ops applied/s ÷ raw produce→consume msgs/s."""
        return _ratio(self.regionbus_throughput.acked_per_s, self.raw_throughput.delivered_per_s)

    @property
    def events_ratio(self) -> float:
        """regionbus events delivered/s ÷ raw fan-out deliveries/s (same reader count)."""
        return _ratio(self.regionbus_throughput.delivered_per_s, self.raw_fanout.delivered_per_s)

    @property
    def p50_ratio(self) -> float:
        """regionbus listener p50 ÷ raw relay p50."""
        return _ratio(self.regionbus_latency.p50_ms, self.raw_relay_latency.p50_ms)

    @property
    def p99_ratio(self) -> float:
        """regionbus listener p99 ÷ raw relay p99."""
        return _ratio(self.regionbus_latency.p99_ms, self.raw_relay_latency.p99_ms)

    @property
    def ops_target_met(self) -> bool:
        """At least ``min_ops_per_s`` ops/s, every event delivered to every subscriber."""
        tp = self.regionbus_throughput
        return tp.acked_per_s >= self.targets.min_ops_per_s and tp.complete and not tp.errors

    @property
    def latency_target_met(self) -> bool:
        """Listener p99 within ``max_p99_ratio`` times the relay's p99."""
        return self.p99_ratio <= self.targets.max_p99_ratio

    def as_json(self) -> str:
        """One line of JSON: every figure, the ratios and the verdicts."""
        data = asdict(self)
        data.update(
            ops_ratio=self.ops_ratio,
            events_ratio=self.events_ratio,
            p50_ratio=self.p50_ratio,
            p99_ratio=self.p99_ratio,
            ops_target_met=self.ops_target_met,
            latency_target_met=self.latency_target_met,
        )
        return json.dumps(data, allow_nan=True, separators=(",", ":"))

    def print_table(self, console: Console) -> None:
        """Print the figures, the raw baselines, the ratios and the verdicts."""
        s = self.settings
        rb_tp, raw_tp, fan = self.regionbus_throughput, self.raw_throughput, self.raw_fanout
        rb_lat, relay = self.regionbus_latency, self.raw_relay_latency
        table = Table(
            title=(
                f"regionbus core benchmark: fetch.wait.max.ms={s['fetch_wait_max_ms']}, "
                f"linger.ms={s['linger_ms']}, {s['value_bytes']} B values, "
                f"kafka {s['kafka_source']}, redis {s['redis_source']}"
            )
        )
        for column in ("figure", "regionbus", "raw Kafka baseline", "ratio", "target", "met"):
            table.add_column(column, justify="left" if column == "figure" else "right")
        table.add_row(
            f"(a) ops applied/s ({rb_tp.readers} subscribers)",
            _rate(rb_tp.acked_per_s),
            f"{_rate(raw_tp.delivered_per_s)} produce→consume",
            _x(self.ops_ratio),
            f"≥ {_rate(self.targets.min_ops_per_s)}",
            _verdict(self.ops_target_met),
        )
        table.add_row(
            "(a) events delivered/s (all subscribers)",
            _rate(rb_tp.delivered_per_s),
            f"{_rate(fan.delivered_per_s)} to {fan.readers} consumers",
            _x(self.events_ratio),
            "",
            "",
        )
        table.add_row(
            "(a) per subscriber events/s",
            _rate(rb_tp.per_reader_per_s),
            _rate(fan.per_reader_per_s),
            _x(_ratio(rb_tp.per_reader_per_s, fan.per_reader_per_s)),
            "",
            "",
        )
        table.add_row(
            "(a) puts acked/s vs raw produce acks/s",
            _rate(rb_tp.acked_per_s),
            f"{_rate(raw_tp.acked_per_s)} produce acks",
            _x(_ratio(rb_tp.acked_per_s, raw_tp.acked_per_s)),
            "",
            "",
        )
        table.add_row(
            "(a) delivered / expected",
            f"{rb_tp.delivered:,} / {rb_tp.acked * rb_tp.readers:,}",
            f"{fan.delivered:,} / {fan.acked * fan.readers:,}",
            "",
            "all",
            _verdict(rb_tp.complete and not rb_tp.errors),
        )
        rate_text = f"at {rb_lat.achieved_rate_per_s:,.0f}/s vs {relay.achieved_rate_per_s:,.0f}/s"
        table.add_row(
            f"(b) put→listener p50 ms ({rate_text})",
            _ms(rb_lat.p50_ms),
            f"{_ms(relay.p50_ms)} two-hop relay",
            _x(self.p50_ratio),
            "",
            "",
        )
        table.add_row(
            "(b) put→listener p99 ms",
            _ms(rb_lat.p99_ms),
            _ms(relay.p99_ms),
            _x(self.p99_ratio),
            f"≤ {self.targets.max_p99_ratio}x",
            _verdict(self.latency_target_met),
        )
        table.add_row(
            "(b) put→listener max ms",
            _ms(rb_lat.max_ms),
            _ms(relay.max_ms),
            _x(_ratio(rb_lat.max_ms, relay.max_ms)),
            "",
            "",
        )
        table.add_row(
            "(b) received / sent",
            f"{rb_lat.received:,} / {rb_lat.sent:,}",
            f"{relay.received:,} / {relay.sent:,}",
            "",
            "",
            "",
        )
        console.print(table)
        console.print(self._cpu_table())

    def _cpu_table(self) -> Table:
        rb, raw = self.regionbus_throughput, self.raw_fanout
        cores = os.cpu_count() or 1
        table = Table(
            title="(a) CPU µs per operation, by process",
            caption=(
                f"{cores} cores at {rb.acked_per_s:,.0f} ops/s allow "
                f"{cores * 1e6 / max(rb.acked_per_s, 1):,.0f} µs per operation"
            ),
        )
        for column in ("process", "regionbus", f"raw fan-out ({raw.readers} consumers)"):
            table.add_column(column, justify="left" if column == "process" else "right")
        names = [n for n in _CPU_PROCESSES if n in rb.cpu_s or n in raw.cpu_s]
        for name in names:
            table.add_row(name, _us(rb.cpu_us_per_op(name)), _us(raw.cpu_us_per_op(name)))
        table.add_row(
            "total",
            _us(sum(rb.cpu_us_per_op(n) for n in names if n in rb.cpu_s)),
            _us(sum(raw.cpu_us_per_op(n) for n in names if n in raw.cpu_s)),
        )
        return table


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def _rate(value: float) -> str:
    return f"{value:,.0f}"


def _us(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def _ms(value: float) -> str:
    return f"{value:,.1f}"


def _x(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}x"


def _verdict(ok: bool) -> str:
    return "[green]yes[/green]" if ok else "[red]NO[/red]"
