"""Failover benchmark (issue 4): a primary killed under steady load, and 3 servers vs 1.

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
   two-hop relay at the same rate (``bench.core.raw_relay_latency``);
3. **throughput**: ``--ops`` pipelined puts through 1 server, then through ``--servers``
   (fresh namespaces), beside raw produce → consume (``bench.core.raw_throughput``).

Machines are noisy: compare the ratios, not the absolute figures (``bench/README.md``).
"""

from __future__ import annotations

import gc
import json
import logging
import math
import re
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import redis
from rich.console import Console
from rich.table import Table

from bench.core import (
    BenchOptions,
    Services,
    paced,
    raw_relay_latency,
    raw_throughput,
    run_or_exit,
    write_async,
)
from bench.report import NS_PER_MS, NS_PER_S, Latency, percentile
from bench.server import BenchError, ServerProcess
from bench.summary import SummaryRow, emit
from bench.workers import Child, run_tracking_subscriber
from broker.config import ServerSettings
from broker.status import ClusterStatus, cluster_status
from clients import BytesSerializer, ClientCache, ClientSettings
from devstack import LocalStack
from schemas.naming import DEFAULT_TOTAL_BUCKETS

log = logging.getLogger("regionbus.bench")

REGION = "bench"
# Puts to an orphaned bucket wait for its new primary: longer than any lease of interest.
_WRITER_READ_TIMEOUT_MS = 60_000
_ACK_TIMEOUT_S = 90.0
_RESULT_TIMEOUT_S = 120.0
_SETTLE_TIMEOUT_S = 90.0
_SETTLE_POLL_S = 0.2
_TABLE_WIDTH = 120
_POSITIVE = click.IntRange(min=1)
_TAKEOVER_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .* is now primary of bucket (\d+) \(epoch (\d+)\)",
    re.MULTILINE,
)
_STOPPED_LINE = re.compile(r"^cache server \S+ stopped: (\{.*\})$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class FailoverOptions:
    """The options of one run (see ``python -m bench.failover --help``)."""

    rate: int
    seconds: float
    kill_after_s: float
    servers: int
    redundancy: int
    lease_ttl_ms: int
    ops: int
    window: int
    key_space: int
    value_bytes: int
    fetch_wait_max_ms: int
    linger_ms: int
    warmup_seconds: float
    relay_seconds: float
    idle_timeout_s: float
    skip_throughput: bool

    def core(self) -> BenchOptions:
        """The same settings as ``bench.core`` options, for its raw baselines."""
        return BenchOptions(
            ops=self.ops,
            subscribers=1,
            rate=self.rate,
            latency_seconds=self.relay_seconds,
            value_bytes=self.value_bytes,
            fetch_wait_max_ms=self.fetch_wait_max_ms,
            linger_ms=self.linger_ms,
            writer="async",
            window=self.window,
            chunk=1,
            key_space=self.key_space,
            warmup_seconds=self.warmup_seconds,
            idle_timeout_s=self.idle_timeout_s,
        )


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


# --- the cluster -----------------------------------------------------------------------


def _settled(status: ClusterStatus, members: set[str], redundancy: int) -> bool:
    """Every bucket has a live primary and its secondaries, primaries balanced."""
    if {m.member_id for m in status.members} != members:
        return False
    if any(b.primary not in members or len(b.secondaries) < redundancy for b in status.buckets):
        return False
    counts = [m.primaries for m in status.members]
    return max(counts) - min(counts) <= 1


def start_cluster(
    stack: ExitStack,
    *,
    services: Services,
    options: FailoverOptions,
    servers: int,
    redis_client: redis.Redis,
    work_dir: Path,
) -> dict[str, ServerProcess]:
    """Start ``servers`` cache servers ``s1``, ``s2``, ... one after the other (so their
    ages differ), each stopped when ``stack`` closes; wait until the buckets are settled.

    Returns:
        The servers by member id.

    Raises:
        BenchError: a server did not start, or the buckets did not settle in 90 s.
    """
    redundancy = min(options.redundancy, servers - 1)
    started: dict[str, ServerProcess] = {}
    for n in range(1, servers + 1):
        member_id = f"s{n}"
        started[member_id] = stack.enter_context(
            ServerProcess(
                namespace=services.namespace,
                kafka_bootstrap_servers=services.kafka_bootstrap_servers,
                redis_url=services.redis_url,
                regions=(REGION,),
                fetch_wait_max_ms=options.fetch_wait_max_ms,
                linger_ms=options.linger_ms,
                log_path=work_dir / f"{services.namespace}-{member_id}.log",
                member_id=member_id,
                env={
                    "REGIONBUS_SUBSCRIPTION_REDUNDANCY": str(redundancy),
                    "REGIONBUS_LEASE_TTL_MS": str(options.lease_ttl_ms),
                },
            )
        )
        log.info("server %s started: pid %s", member_id, started[member_id].pid)
    deadline = time.monotonic() + _SETTLE_TIMEOUT_S
    while not _settled(
        cluster_status(redis_client, services.namespace, DEFAULT_TOTAL_BUCKETS),
        set(started),
        redundancy,
    ):
        if time.monotonic() > deadline:
            raise BenchError(f"the buckets of {services.namespace} did not settle")
        time.sleep(_SETTLE_POLL_S)
    return started


def fresh_services(local: LocalStack) -> Services:
    """The stack's Kafka and Redis under a new namespace (so every phase has fresh topics)."""
    return Services(
        f"bench.{secrets.token_hex(3)}",
        local.kafka_bootstrap_servers,
        local.redis_url,
        {
            "kafka": local.kafka.pid if local.kafka else None,
            "redis": local.redis.pid if local.redis else None,
        },
    )


def _writer_cache(services: Services, options: FailoverOptions) -> ClientCache:
    return ClientCache(
        ClientSettings(
            **services.client_settings(
                options.core(),
                subscription_enabled=False,
                read_timeout_ms=_WRITER_READ_TIMEOUT_MS,
            )
        )
    )


# --- the failover phase ----------------------------------------------------------------


@dataclass
class _Kill:
    """What the killer thread did: the victim, the buckets it held, and when."""

    victim: str = ""
    before: ClusterStatus | None = None
    kill_ns: int = 0
    error: BaseException | None = None


def _kill_busiest(
    servers: dict[str, ServerProcess], redis_client: redis.Redis, namespace: str, kill: _Kill
) -> None:
    try:
        before = cluster_status(redis_client, namespace, DEFAULT_TOTAL_BUCKETS)
        victim = max(before.members, key=lambda m: m.primaries).member_id
        kill.victim, kill.before = victim, before
        kill.kill_ns = time.time_ns()
        servers[victim].kill()
        log.info("killed %s at %d", victim, kill.kill_ns)
    except BaseException as exc:  # re-raised in the writer's thread
        kill.error = exc


def _log_time_ns(stamp: str) -> int:
    """``logging``'s asctime (local time, milliseconds) as ns since the Unix epoch."""
    return int(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp() * NS_PER_S)


def _takeovers(
    logs: dict[str, str], orphaned: dict[int, int], kill_ns: int
) -> dict[int, tuple[str, float]]:
    """Per orphaned bucket (to the epoch it had), who logged taking it first after, and
    how many milliseconds after the kill."""
    found: dict[int, tuple[str, float]] = {}
    for member, text in logs.items():
        for stamp, bucket_text, epoch_text in _TAKEOVER_LINE.findall(text):
            bucket = int(bucket_text)
            if bucket not in orphaned or int(epoch_text) <= orphaned[bucket]:
                continue
            after_ms = (_log_time_ns(stamp) - kill_ns) / NS_PER_MS
            if bucket not in found or after_ms < found[bucket][1]:
                found[bucket] = (member, after_ms)
    return found


def _server_duplicates(logs: dict[str, str]) -> int | None:
    """Sum of the ``duplicates`` counters the servers printed when they stopped."""
    total = 0
    for text in logs.values():
        match = _STOPPED_LINE.search(text)
        if match is None:
            return None
        total += int(json.loads(match.group(1))["duplicates"])
    return total


def _failover_figures(
    *,
    options: FailoverOptions,
    kill: _Kill,
    sent: int,
    first_ns: int,
    last_ns: int,
    answers: list[bool | None],
    result: dict[str, Any],
    logs: dict[str, str],
) -> FailoverFigures:
    assert kill.before is not None
    kill_ns = kill.kill_ns
    orphaned = {b.bucket: b.epoch for b in kill.before.buckets if b.primary == kill.victim}
    arrivals = list(
        zip(
            result["indexes"],
            result["buckets"],
            result["sent_ns"],
            result["received_ns"],
            strict=True,
        )
    )
    takeovers = _takeovers(logs, orphaned, kill_ns)
    buckets = []
    for bucket in sorted(orphaned):
        resumed = [r for _, b, s, r in arrivals if b == bucket and s > kill_ns]
        member, takeover_ms = takeovers.get(bucket, (None, math.nan))
        buckets.append(
            BucketFailover(
                bucket,
                member,
                takeover_ms,
                (min(resumed) - kill_ns) / NS_PER_MS if resumed else math.nan,
            )
        )
    received = sorted(r for *_, r in arrivals if r >= kill_ns)
    silence_ns = max(
        (b - a for a, b in zip([kill_ns, *received], received, strict=False)), default=0
    )
    warm_ns = first_ns + int(options.warmup_seconds * NS_PER_S)
    # Only puts delivered before the kill: those sent just before it that waited for the
    # takeover belong to the failover figures.
    before = sorted((r - s) / NS_PER_MS for *_, s, r in arrivals if warm_ns <= s and r < kill_ns)
    after = [(r - s) / NS_PER_MS for *_, s, r in arrivals if s >= kill_ns]
    acked = {i for i, ok in enumerate(answers) if ok}
    delivered = set(result["indexes"])
    return FailoverFigures(
        servers=options.servers,
        victim=kill.victim,
        victim_primaries=len(orphaned),
        sent=sent,
        achieved_rate_per_s=sent / max((last_ns - first_ns) / NS_PER_S, 1e-9),
        acked=len(acked),
        failed=sent - len(acked),
        delivered=len(delivered),
        lost=len(acked - delivered),
        listener_duplicates=int(result["listener_duplicates"]),
        duplicates_dropped=int(result["duplicates_dropped"]),
        server_duplicates=_server_duplicates(logs),
        buckets=buckets,
        longest_silence_ms=silence_ns / NS_PER_MS,
        before_kill=Latency(
            sent=sent,
            received=len(delivered),
            measured=len(before),
            achieved_rate_per_s=sent / max((last_ns - first_ns) / NS_PER_S, 1e-9),
            p50_ms=percentile(before, 0.50),
            p99_ms=percentile(before, 0.99),
            max_ms=before[-1] if before else math.nan,
        ),
        after_kill_max_ms=max(after, default=math.nan),
    )


def failover_phase(
    services: Services, options: FailoverOptions, redis_client: redis.Redis, work_dir: Path
) -> FailoverFigures:
    """Phase 1: paced puts through a cluster, its busiest primary killed part-way.

    Args:
        services: Kafka, Redis and a namespace of its own.
        options: The run's options.
        redis_client: A connection to that Redis (bucket status).
        work_dir: Where the servers' logs go.

    Raises:
        BenchError: a child process or server failed, or did not answer in time.
    """
    answers: list[bool | None] = [None] * max(1, int(options.rate * options.seconds))
    kill = _Kill()
    with ExitStack() as stack:
        servers = start_cluster(
            stack,
            services=services,
            options=options,
            servers=options.servers,
            redis_client=redis_client,
            work_dir=work_dir,
        )
        subscriber = stack.enter_context(
            Child(
                run_tracking_subscriber,
                "rb-failover-subscriber",
                settings=services.client_settings(options.core(), read_timeout_ms=30_000),
                region=REGION,
                idle_timeout_s=options.idle_timeout_s,
            )
        )
        subscriber.wait_ready()
        cache = _writer_cache(services, options)
        stack.callback(cache.close)
        writer = cache.create_region(REGION, serializer=BytesSerializer())
        lock = threading.Lock()
        answered = threading.Semaphore(0)

        def on_answer(index: int) -> Callable[[Future[None]], None]:
            def done(future: Future[None]) -> None:
                with lock:
                    answers[index] = future.exception() is None
                answered.release()

            return done

        def send(i: int, value: bytes) -> None:
            writer.put_async(f"fo-{i}", value).add_done_callback(on_answer(i))

        killer = threading.Timer(
            options.kill_after_s,
            _kill_busiest,
            args=(servers, redis_client, services.namespace, kill),
        )
        killer.daemon = True
        stack.callback(killer.cancel)
        killer.start()
        sent, first_ns, last_ns = paced(send, options.rate, options.seconds, options.value_bytes)
        killer.join()
        if kill.error is not None:
            raise BenchError(f"could not kill the busiest primary: {kill.error}")
        if kill.before is None:
            raise BenchError("the phase ended before the kill: raise --seconds")
        deadline = time.monotonic() + _ACK_TIMEOUT_S
        for _ in range(sent):
            if not answered.acquire(timeout=max(0.0, deadline - time.monotonic())):
                log.warning("some puts unanswered after %.0f s", _ACK_TIMEOUT_S)
                break
        with lock:
            final = list(answers[:sent])
        subscriber.expect(sum(1 for ok in final if ok))
        result = subscriber.wait_result(_RESULT_TIMEOUT_S)
        survivors = {name: s for name, s in servers.items() if name != kill.victim}
    # The stack stopped the survivors gracefully: their logs end with their counters.
    logs = {name: s.log_text() for name, s in survivors.items()}
    return _failover_figures(
        options=options,
        kill=kill,
        sent=sent,
        first_ns=first_ns,
        last_ns=last_ns,
        answers=final,
        result=result,
        logs=logs,
    )


# --- the throughput phase --------------------------------------------------------------


def cluster_throughput(
    services: Services,
    options: FailoverOptions,
    servers: int,
    redis_client: redis.Redis,
    work_dir: Path,
) -> ClusterThroughput:
    """Phase 3: ``--ops`` pipelined puts (at most ``--window`` in flight) through a new
    cluster of ``servers`` servers in ``services``' namespace (which should be fresh).

    Raises:
        BenchError: a server failed to start or the buckets did not settle.
    """
    with ExitStack() as stack:
        start_cluster(
            stack,
            services=services,
            options=options,
            servers=servers,
            redis_client=redis_client,
            work_dir=work_dir,
        )
        cache = _writer_cache(services, options)
        stack.callback(cache.close)
        writer = cache.create_region(REGION, serializer=BytesSerializer())
        start_ns, acks = write_async(
            writer,
            ops=options.ops,
            window=options.window,
            key_space=options.key_space,
            value_bytes=options.value_bytes,
        )
    return ClusterThroughput(
        servers=servers,
        sent=options.ops,
        acked=acks.acked,
        errors=options.ops - acks.acked,
        acked_per_s=acks.acked / max((acks.last_ns - start_ns) / NS_PER_S, 1e-9),
    )


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
        local = stack.enter_context(LocalStack(use_docker=False))
        work_dir = Path(tempfile.mkdtemp(prefix="regionbus-bench-failover-"))
        redis_client = redis.Redis.from_url(local.redis_url)
        stack.callback(redis_client.close)
        console.print(
            f"kafka {local.kafka_bootstrap_servers} ({local.kafka_source}), "
            f"redis {local.redis_url} ({local.redis_source}), logs in {work_dir}, "
            f"load {load_start}",
            style="dim",
        )
        console.print(
            f"(1) failover: {options.servers} servers, {options.rate} puts/s for "
            f"{options.seconds} s, kill after {options.kill_after_s} s ..."
        )
        failover = failover_phase(fresh_services(local), options, redis_client, work_dir)
        gc.collect()  # closed clients' librdkafka handles go before the next phase
        console.print(f"(2) raw relay: {options.rate} msgs/s for {options.relay_seconds} s ...")
        relay = raw_relay_latency(fresh_services(local), options.core())
        one = cluster = None
        raw_per_s = math.nan
        if not options.skip_throughput:
            console.print(
                f"(3) throughput: {options.ops:,} puts, 1 then {options.servers} "
                "servers, then raw ..."
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
@click.option(
    "--value-bytes",
    default=200,
    type=click.IntRange(min=8),
    show_default=True,
    help="Bytes of every value.",
)
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
@click.option(
    "--idle-timeout-s",
    default=30.0,
    show_default=True,
    help="Readers give up after this long without a message once the writer is done.",
)
@click.option("--skip-throughput", is_flag=True, help="Only the failover phase and its baseline.")
@click.option("--json", "as_json", is_flag=True, help="Also print the figures as one JSON line.")
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


if __name__ == "__main__":
    main()
