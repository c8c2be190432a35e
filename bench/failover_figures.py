"""The figures of a failover run, and how they are shown: a table beside their baselines,
one JSON line, and the headline rows for ``bench.all``.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.report import Latency
from bench.summary import SummaryRow
from regionbus.schemas.naming import DEFAULT_TOTAL_BUCKETS


@dataclass(frozen=True, slots=True)
class BucketFailover:
    """One orphaned bucket.

    Attributes:
        bucket: The bucket.
        new_primary: The server that took it (None if none did before the end).
        takeover_ms: Kill → the new primary's "is now primary" log line, in milliseconds
            (the log's clock has millisecond resolution); NaN when not found.
        resume_ms: Kill → the first listener event of a put sent after the kill, in
            milliseconds; NaN when none arrived.
    """

    bucket: int
    new_primary: str | None
    takeover_ms: float
    resume_ms: float


@dataclass(frozen=True, slots=True)
class FailoverFigures:
    """The failover phase.

    Attributes:
        servers: Servers started.
        victim: Member id of the server killed.
        victim_primaries: Buckets it was primary of (the orphaned buckets).
        sent: Puts sent (paced).
        achieved_rate_per_s: Puts sent per second over the phase.
        acked: Puts answered with success.
        failed: Puts answered with an error or not at all.
        delivered: Distinct puts that reached the listener.
        lost: Acknowledged puts that never reached the listener (must be 0).
        listener_duplicates: Events that reached the listener for a put already seen
            (must be 0).
        duplicates_dropped: Events dropped by the subscriber's message tracking.
        server_duplicates: Operations the surviving servers recognised as already applied
            (by EventID), from their final counters; None when they could not be read.
        buckets: Per orphaned bucket: takeover and resume times.
        longest_silence_ms: Longest time without any listener event, from the kill to the
            last event, in milliseconds.
        before_kill: Put → listener latency of puts sent after the warm-up and delivered
            before the kill.
        after_kill_max_ms: Largest put → listener latency of puts sent after the kill.
    """

    servers: int
    victim: str
    victim_primaries: int
    sent: int
    achieved_rate_per_s: float
    acked: int
    failed: int
    delivered: int
    lost: int
    listener_duplicates: int
    duplicates_dropped: int
    server_duplicates: int | None
    buckets: list[BucketFailover]
    longest_silence_ms: float
    before_kill: Latency
    after_kill_max_ms: float

    @property
    def resume_max_ms(self) -> float:
        """Kill → every orphaned bucket delivering again, in milliseconds."""
        return _nan_max([b.resume_ms for b in self.buckets])

    @property
    def resume_median_ms(self) -> float:
        """Median over the orphaned buckets of kill → first delivery, in milliseconds."""
        return _nan_median([b.resume_ms for b in self.buckets])

    @property
    def takeover_max_ms(self) -> float:
        """Kill → the last orphaned bucket's new lease, in milliseconds."""
        return _nan_max([b.takeover_ms for b in self.buckets])

    @property
    def takeover_median_ms(self) -> float:
        """Median over the orphaned buckets of kill → new lease, in milliseconds."""
        return _nan_median([b.takeover_ms for b in self.buckets])


@dataclass(frozen=True, slots=True)
class ClusterThroughput:
    """Pipelined puts through a cluster of ``servers`` servers, no subscriber.

    Attributes:
        servers: Servers in the cluster.
        sent: Puts sent.
        acked: Puts answered with success.
        errors: Puts answered with an error (or unanswered).
        acked_per_s: ``acked`` ÷ seconds from the first put to the last answer.
    """

    servers: int
    sent: int
    acked: int
    errors: int
    acked_per_s: float


@dataclass(frozen=True, slots=True)
class Figures:
    """Everything one run measured.

    Attributes:
        settings: The run's options, where Kafka and Redis came from, the load average.
        failover: The failover phase.
        raw_relay: Raw two-hop relay latency at the same rate (baseline of the latency).
        one_server: Throughput with one server (None with ``--skip-throughput``).
        cluster: Throughput with ``--servers`` servers.
        raw_throughput_per_s: Raw produce → consume messages per second.
    """

    settings: dict[str, Any]
    failover: FailoverFigures
    raw_relay: Latency
    one_server: ClusterThroughput | None = None
    cluster: ClusterThroughput | None = None
    raw_throughput_per_s: float = math.nan
    ratios: dict[str, float] = field(default_factory=dict)

    def with_ratios(self) -> Figures:
        """A copy with ``ratios`` filled in (regionbus ÷ baseline)."""
        fo, relay = self.failover, self.raw_relay
        lease_bound_ms = self.settings["lease_ttl_ms"] * 1.25
        ratios = {
            "before_kill_p50_vs_relay": _ratio(fo.before_kill.p50_ms, relay.p50_ms),
            "before_kill_p99_vs_relay": _ratio(fo.before_kill.p99_ms, relay.p99_ms),
            "resume_max_vs_lease_bound": _ratio(fo.resume_max_ms, lease_bound_ms),
            "resume_max_vs_relay_p99": _ratio(fo.resume_max_ms, relay.p99_ms),
        }
        if self.one_server is not None and self.cluster is not None:
            ratios.update(
                cluster_vs_one=_ratio(self.cluster.acked_per_s, self.one_server.acked_per_s),
                one_vs_raw=_ratio(self.one_server.acked_per_s, self.raw_throughput_per_s),
                cluster_vs_raw=_ratio(self.cluster.acked_per_s, self.raw_throughput_per_s),
            )
        return Figures(
            self.settings,
            fo,
            relay,
            self.one_server,
            self.cluster,
            self.raw_throughput_per_s,
            ratios,
        )

    @property
    def correct(self) -> bool:
        """No acknowledged put lost, no duplicate at the listener, every bucket resumed."""
        fo = self.failover
        return fo.lost == 0 and fo.listener_duplicates == 0 and not math.isnan(fo.resume_max_ms)

    def as_json(self) -> str:
        """One line of JSON: every figure and ratio."""
        data = asdict(self)
        data["failover"].update(
            resume_max_ms=self.failover.resume_max_ms,
            resume_median_ms=self.failover.resume_median_ms,
            takeover_max_ms=self.failover.takeover_max_ms,
            takeover_median_ms=self.failover.takeover_median_ms,
        )
        data["correct"] = self.correct
        return json.dumps(data, allow_nan=True, separators=(",", ":"))

    def print_table(self, console: Console) -> None:
        """Print the figures beside their baselines, with the ratios."""
        s, fo, relay, r = self.settings, self.failover, self.raw_relay, self.ratios
        table = Table(
            title=(
                f"regionbus failover: {fo.servers} servers, redundancy {s['redundancy']}, "
                f"lease {s['lease_ttl_ms']} ms, {s['value_bytes']} B values, "
                f"kafka {s['kafka_source']}, redis {s['redis_source']}, "
                f"load {s['load_average']}"
            )
        )
        for column in ("figure", "regionbus", "baseline", "ratio", "must be"):
            table.add_column(column, justify="left" if column == "figure" else "right")
        table.add_row(
            f"puts sent (target {s['rate']:,}/s)",
            f"{fo.sent:,} at {fo.achieved_rate_per_s:,.0f}/s",
            f"relay at {relay.achieved_rate_per_s:,.0f}/s",
            "",
            "",
        )
        table.add_row(
            "put→listener p50 ms before the kill",
            _ms(fo.before_kill.p50_ms),
            f"{_ms(relay.p50_ms)} raw two-hop relay",
            _x(r["before_kill_p50_vs_relay"]),
            "",
        )
        table.add_row(
            "put→listener p99 ms before the kill",
            _ms(fo.before_kill.p99_ms),
            _ms(relay.p99_ms),
            _x(r["before_kill_p99_vs_relay"]),
            "",
        )
        table.add_row(
            f"killed {fo.victim}: primary of",
            f"{fo.victim_primaries} of {DEFAULT_TOTAL_BUCKETS} buckets",
            "",
            "",
            "",
        )
        table.add_row(
            "kill → new lease ms (median / max)",
            f"{_ms(fo.takeover_median_ms)} / {_ms(fo.takeover_max_ms)}",
            f"lease TTL {s['lease_ttl_ms']:,}",
            "",
            "",
        )
        table.add_row(
            "kill → first event of a put sent after it, ms (median / max)",
            f"{_ms(fo.resume_median_ms)} / {_ms(fo.resume_max_ms)}",
            f"1.25 x TTL = {s['lease_ttl_ms'] * 1.25:,.0f}",
            _x(r["resume_max_vs_lease_bound"]),
            "",
        )
        table.add_row(
            "  the same max vs the relay's p99",
            "",
            _ms(relay.p99_ms),
            _x(r["resume_max_vs_relay_p99"]),
            "",
        )
        table.add_row(
            "longest listener silence after the kill ms",
            _ms(fo.longest_silence_ms),
            "",
            "",
            "",
        )
        table.add_row(
            "largest put→listener ms, puts sent after the kill",
            _ms(fo.after_kill_max_ms),
            _ms(relay.max_ms),
            _x(_ratio(fo.after_kill_max_ms, relay.max_ms)),
            "",
        )
        table.add_row(
            "events re-sent: dropped by the subscriber's tracking",
            f"{fo.duplicates_dropped:,}",
            "",
            "",
            "",
        )
        table.add_row(
            "  recognised by EventID on the surviving servers",
            "n/a" if fo.server_duplicates is None else f"{fo.server_duplicates:,}",
            "",
            "",
            "",
        )
        table.add_row(
            "duplicates at the listener",
            f"{fo.listener_duplicates:,}",
            "",
            "",
            _zero(fo.listener_duplicates),
        )
        table.add_row(
            "acknowledged puts lost",
            f"{fo.lost:,} of {fo.acked:,}",
            "",
            "",
            _zero(fo.lost),
        )
        table.add_row(
            "puts failed or unanswered",
            f"{fo.failed:,}",
            "",
            "",
            "",
        )
        if self.one_server is not None and self.cluster is not None:
            one, many = self.one_server, self.cluster
            table.add_row(
                f"ops applied/s, 1 server ({one.acked:,} of {one.sent:,})",
                _rate(one.acked_per_s),
                f"{_rate(self.raw_throughput_per_s)} raw produce→consume",
                _x(r["one_vs_raw"]),
                "",
            )
            table.add_row(
                f"ops applied/s, {many.servers} servers ({many.acked:,} of {many.sent:,})",
                _rate(many.acked_per_s),
                _rate(self.raw_throughput_per_s),
                _x(r["cluster_vs_raw"]),
                "",
            )
            table.add_row(
                f"{many.servers} servers ÷ 1 server",
                "",
                "",
                _x(r["cluster_vs_one"]),
                "",
            )
        console.print(table)
        bucket_table = Table(title="orphaned buckets")
        for column in ("bucket", "new primary", "kill → lease ms", "kill → first event ms"):
            bucket_table.add_column(column, justify="right")
        for b in fo.buckets:
            bucket_table.add_row(
                str(b.bucket), b.new_primary or "-", _ms(b.takeover_ms), _ms(b.resume_ms)
            )
        console.print(bucket_table)


def summary_rows(figures: Figures) -> list[SummaryRow]:
    """The headline figures of a run for ``bench.all``'s table."""
    fo, relay = figures.failover, figures.raw_relay
    rows = [
        SummaryRow(
            "failover",
            "put→listener p99 before the kill (ms)",
            fo.before_kill.p99_ms,
            relay.p99_ms,
            "two-hop relay p99",
            higher_is_better=False,
        ),
        SummaryRow(
            "failover",
            "kill → every orphaned bucket delivering (ms)",
            fo.resume_max_ms,
            relay.p99_ms,
            "two-hop relay p99",
            higher_is_better=False,
        ),
        SummaryRow(
            "failover",
            "acknowledged puts lost / listener duplicates",
            float(fo.lost + fo.listener_duplicates),
            math.nan,
            "must be 0",
        ),
    ]
    if figures.cluster is not None:
        rows.append(
            SummaryRow(
                "failover",
                f"puts acked/s through {figures.cluster.servers} servers",
                figures.cluster.acked_per_s,
                figures.raw_throughput_per_s,
                "produce→consume msg/s",
            )
        )
    return rows


# --- helpers ---------------------------------------------------------------------------


def _nan_max(values: list[float]) -> float:
    present = [v for v in values if not math.isnan(v)]
    return max(present) if len(present) == len(values) and present else math.nan


def _nan_median(values: list[float]) -> float:
    present = [v for v in values if not math.isnan(v)]
    return statistics.median(present) if present else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.1f}"


def _rate(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def _x(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}x"


def _zero(value: int) -> str:
    return "[green]0: yes[/green]" if value == 0 else "[red]0: NO[/red]"


__all__ = ["BucketFailover", "ClusterThroughput", "FailoverFigures", "Figures", "summary_rows"]
