"""What ``bench.failover`` measures: its options, the failover phase (a primary killed
under paced puts) and the throughput phase (pipelined puts through a cluster).

The failover phase's figures come from the tracking subscriber's record of every put
(which, in which bucket, sent and received when), from the answers of the puts, and from
the servers' logs: when each orphaned bucket was taken ("is now primary of bucket") and
the duplicates each survivor recognised (its counters, printed when it stops).
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import redis

from bench.cluster import start_cluster
from bench.failover_figures import BucketFailover, ClusterThroughput, FailoverFigures
from bench.load import paced, write_async
from bench.report import NS_PER_MS, NS_PER_S, Latency, percentile
from bench.server import BenchError, ServerProcess
from bench.services import REGION, BenchOptions, Services
from bench.workers import Child, run_tracking_subscriber
from regionbus.broker.status import ClusterStatus, cluster_status
from regionbus.clients import BytesSerializer, ClientCache, ClientSettings, Region
from regionbus.schemas.naming import DEFAULT_TOTAL_BUCKETS

log = logging.getLogger("regionbus.bench")

# Puts to an orphaned bucket wait for its new primary: longer than any lease of interest.
_WRITER_READ_TIMEOUT_MS = 60_000
_ACK_TIMEOUT_S = 90.0
_RESULT_TIMEOUT_S = 120.0
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


def _start_cluster(
    stack: ExitStack,
    services: Services,
    options: FailoverOptions,
    servers: int,
    redis_client: redis.Redis,
    work_dir: Path,
) -> dict[str, ServerProcess]:
    """``bench.cluster.start_cluster`` with the run's server settings."""
    return start_cluster(
        stack,
        services=services,
        servers=servers,
        redundancy=options.redundancy,
        lease_ttl_ms=options.lease_ttl_ms,
        fetch_wait_max_ms=options.fetch_wait_max_ms,
        linger_ms=options.linger_ms,
        redis_client=redis_client,
        work_dir=work_dir,
    )


def _writer_region(stack: ExitStack, services: Services, options: FailoverOptions) -> Region:
    """The writer's region, in a cache without a subscription that ``stack`` closes."""
    cache = ClientCache(
        ClientSettings(
            **services.client_settings(
                options.core(),
                subscription_enabled=False,
                read_timeout_ms=_WRITER_READ_TIMEOUT_MS,
            )
        )
    )
    stack.callback(cache.close)
    return cache.create_region(REGION, serializer=BytesSerializer())


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
        servers = _start_cluster(stack, services, options, options.servers, redis_client, work_dir)
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
        writer = _writer_region(stack, services, options)
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
        _start_cluster(stack, services, options, servers, redis_client, work_dir)
        writer = _writer_region(stack, services, options)
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


__all__ = ["FailoverOptions", "cluster_throughput", "failover_phase"]
