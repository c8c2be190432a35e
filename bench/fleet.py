"""Fleet benchmark: thousands of clients, crashed clients, slow clients and huge requests.

``python -m bench.fleet`` measures, on one Kafka and Redis (the local stack unless
``REGIONBUS_KAFKA_BOOTSTRAP_SERVERS`` / ``REGIONBUS_REDIS_URL`` name others), one phase per
goal of the fleet issue, each beside a baseline measured in the same run:

1. **fleet**: ``--durable-clients`` durable clients register durable interest in three
   keys each and go away, ``--live-subscribers`` subscribers hold ``ALL_KEYS``, and a
   writer puts ``--rate`` puts per second for ``--seconds`` (half to the keys of the
   ``--sampled`` durable clients, half spread over the others). Measured: Kafka partitions
   added per registered client, the server's RSS, the live subscribers' put → listener
   p99 (beside the raw two-hop relay's), and whether each sampled durable client, coming
   back, gets its whole backlog once, in order, before its marker.
2. **cleanup**: ``--cleanup-clients`` clients (half durable) killed with SIGKILL; seconds
   until no record, Redis key, consumer group or partition of theirs is left, beside their
   silence window and durable timeout.
3. **connect**: the median time to construct a ``ClientCache`` over the fleet's first
   ``--connects`` durable clients, beside a raw Kafka client's start (a consumer and a
   producer made, one message through).
5. **requests**: a bystander's put p99 and worst while another client registers
   ``MAX_KEYS_PER_REGISTRATION`` keys and puts ``MAX_BULK_ENTRIES`` entries at once,
   beside its p99 alone; and how fast requests over the limits are refused.
6. **stalled**: ``--stalled-subscribers`` subscribers, a tenth of them stalled (SIGSTOP):
   the others' p99 and the writer's throughput, beside a run with none stalled.

Goal 4 (fan-out flat in the subscribers sharing an interest) is ``bench.scaling``'s.

It prints a table (``--markdown`` writes it for ``bench/RESULTS.md``) with the load
average before each phase, and hands ``bench.all`` its rows (:mod:`bench.summary`).
Machines are noisy: compare the ratios, not the absolute figures (``bench/README.md``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import redis
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic
from rich.console import Console

from bench import progress
from bench.core import run_or_exit
from bench.fleet_workers import (
    durable_keys,
    reconnect_durable,
    run_durable_registrations,
    run_killable_clients,
)
from bench.load import paced
from bench.options import fetch_wait_option, linger_option
from bench.raw import raw_relay_latency
from bench.report import NS_PER_S, latency, percentile
from bench.server import BenchError, ServerProcess
from bench.services import REGION, RESULT_TIMEOUT_S, BenchOptions, Services
from bench.summary import SummaryRow, emit
from bench.workers import Child, run_subscribers, stamped_value
from regionbus.clients import BytesSerializer, ClientCache, ClientSettings, Region
from regionbus.devstack import LocalStack
from regionbus.schemas.errors import BulkOperationError, RequestLimitError
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.limits import MAX_BULK_ENTRIES, MAX_KEYS_PER_REGISTRATION
from regionbus.schemas.naming import RedisKeys, Topics

log = logging.getLogger("regionbus.bench")

_TABLE_WIDTH = 140
_PHASES = ("fleet", "cleanup", "requests", "stalled")
_SUBSCRIBERS_PER_PROCESS = 10
_CLEANUP_SILENCE_MS = 3_000
_CLEANUP_DURABLE_TIMEOUT_S = 8
_CLEANUP_REAPER_S = 1.0
_CLEANUP_MARGIN_S = 2 * _CLEANUP_REAPER_S + _CLEANUP_SILENCE_MS / 4000 + 1
"""The stated margin: a liveness check and two reaper intervals, plus a second."""


@dataclass(frozen=True, slots=True)
class FleetOptions:
    """The options of one run (see ``python -m bench.fleet --help``)."""

    phases: tuple[str, ...]
    durable_clients: int
    registering_processes: int
    live_subscribers: int
    sampled: int
    rate: int
    seconds: float
    connects: int
    cleanup_clients: int
    stalled_subscribers: int
    stalled_rate: int
    stalled_seconds: float
    fetch_wait_max_ms: int
    linger_ms: int

    def bench_options(self, subscribers: int) -> BenchOptions:
        """The ``bench.core`` options the raw baselines take."""
        return BenchOptions(
            ops=1,
            subscribers=subscribers,
            rate=self.rate,
            latency_seconds=self.seconds,
            value_bytes=24,
            fetch_wait_max_ms=self.fetch_wait_max_ms,
            linger_ms=self.linger_ms,
            writer="async",
            window=1,
            chunk=1,
            key_space=1,
            warmup_seconds=1.0,
            idle_timeout_s=30.0,
        )


@dataclass
class Figure:
    """One line of the table: a figure, its goal, its baseline, the load before it."""

    phase: str
    figure: str
    value: float
    goal: str
    met: bool | None
    baseline: float = math.nan
    baseline_name: str = ""
    load: str = ""
    higher_is_better: bool = False


@dataclass
class Run:
    """Where the run is, and what it measured."""

    local: LocalStack
    work_dir: Path
    console: Console
    figures: list[Figure] = field(default_factory=list)

    def add(self, figure: Figure) -> None:
        self.figures.append(figure)
        self.console.print(
            f"  {figure.figure}: {figure.value:,.2f}"
            + (
                f" (baseline {figure.baseline:,.2f} {figure.baseline_name})"
                if not math.isnan(figure.baseline)
                else ""
            )
            + f"  goal {figure.goal}: {_verdict(figure.met)}"
        )


def _verdict(met: bool | None) -> str:
    return "-" if met is None else ("met" if met else "NOT met")


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _settings(run_services: Services, options: FleetOptions, **more: Any) -> dict[str, Any]:
    return run_services.client_settings(options.bench_options(1), **more)


@contextmanager
def _server(
    run: Run, options: FleetOptions, name: str, env: dict[str, str] | None = None
) -> Iterator[tuple[Services, ServerProcess]]:
    namespace = f"fleet.{secrets.token_hex(3)}.{name}"
    with ServerProcess(
        namespace=namespace,
        kafka_bootstrap_servers=run.local.kafka_bootstrap_servers,
        redis_url=run.local.redis_url,
        regions=(REGION,),
        fetch_wait_max_ms=100,
        linger_ms=options.linger_ms,
        log_path=run.work_dir / f"server-{name}.log",
        env=env,
    ) as server:
        yield (
            Services(
                namespace,
                run.local.kafka_bootstrap_servers,
                run.local.redis_url,
                {"server": server.pid},
            ),
            server,
        )


def _rss_mb(pid: int | None) -> tuple[float, float]:
    """Resident and peak resident memory of a process, in MiB."""
    if pid is None:
        return math.nan, math.nan
    fields = dict(
        line.split(":", 1)
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _partitions(services: Services) -> int:
    admin = kafka_admin(services.kafka_config)
    topics = admin.list_topics(timeout=10).topics
    return sum(
        len(meta.partitions) for name, meta in topics.items() if name.startswith(services.namespace)
    )


def _groups(services: Services) -> set[str]:
    admin = kafka_admin(services.kafka_config)
    return {g.group_id for g in admin.list_consumer_groups(request_timeout=10).result(15).valid}


def _writer(services: Services, options: FleetOptions) -> tuple[ClientCache, Region]:
    cache = ClientCache(ClientSettings(**_settings(services, options, subscription_enabled=False)))
    return cache, cache.create_region(REGION, serializer=BytesSerializer())


def _indexed_value(index: int) -> bytes:
    """A value stamped with its send time, then the put's index."""
    return stamped_value(8) + index.to_bytes(8, "big")


# --- 1 and 3: the fleet, and its connects ---------------------------------------------------


def fleet_phase(run: Run, options: FleetOptions) -> None:
    """Goals 1 and 3 (see the module's description)."""
    with _server(run, options, "fleet") as (services, server):
        settings = _settings(services, options)
        before = _partitions(services)
        base_rss, _ = _rss_mb(server.pid)
        progress.phase(
            run.console,
            f"1: {options.durable_clients:,} durable clients register "
            f"and go away (load {_load()}) ...",
        )
        connect_s = _register_durables(services, options)
        connect = sorted(connect_s[: options.connects])
        raw = _raw_connects(services, min(options.connects, 50))
        load = _load()
        run.add(
            Figure(
                "connect",
                f"connect, median of {len(connect)} (ms)",
                percentile(connect, 0.5) * 1000,
                "<= 50 ms",
                percentile(connect, 0.5) <= 0.05,
                percentile(raw, 0.5) * 1000,
                "raw Kafka client start",
                load,
            )
        )
        progress.phase(
            run.console,
            f"1: {options.live_subscribers} live subscribers, "
            f"{options.rate} puts/s for {options.seconds} s (load {_load()}) ...",
        )
        sampled = _sampled(options)
        with ExitStack() as stack:
            children = [
                stack.enter_context(
                    Child(
                        run_subscribers,
                        f"fleet-live-{i}",
                        settings=settings,
                        region=REGION,
                        clients=size,
                        record_latency=True,
                        idle_timeout_s=30.0,
                    )
                )
                for i, size in enumerate(_sizes(options.live_subscribers, _SUBSCRIBERS_PER_PROCESS))
            ]
            for child in children:
                child.wait_ready(60 + 10 * _SUBSCRIBERS_PER_PROCESS)
            writer_cache, writer = _writer(services, options)
            stack.callback(writer_cache.close)
            sent_keys: dict[str, list[int]] = {}
            futures: list[Future[None]] = []

            def send(i: int, _value: bytes) -> None:
                if i % 2 == 0:
                    index = sampled[(i // 2) % len(sampled)]
                else:
                    index = (i * 7919) % options.durable_clients
                key = durable_keys(index)[i % 3]
                sent_keys.setdefault(key, []).append(i)
                futures.append(writer.put_async(key, _indexed_value(i)))

            load = _load()
            sent, first_ns, last_ns = paced(send, options.rate, options.seconds, 16)
            failed = sum(1 for f in futures if f.exception(120) is not None)
            for child in children:
                child.expect(sent - failed)
            results = [child.wait_result(RESULT_TIMEOUT_S) for child in children]
        merged = {
            "counts": [c for r in results for c in r["counts"]],
            "sent_ns": [s for r in results for s in r["sent_ns"]],
            "received_ns": [s for r in results for s in r["received_ns"]],
        }
        live = latency(sent=sent, start_ns=first_ns, end_ns=last_ns, warmup_s=1.0, readers=merged)
        after = _partitions(services)
        rss, peak = _rss_mb(server.pid)
        relay = raw_relay_latency(services, options.bench_options(1))
        registered = options.durable_clients + options.live_subscribers
        run.add(
            Figure(
                "fleet",
                f"Kafka partitions added per registered client ({registered:,})",
                (after - before) / registered,
                "<= 0.1",
                (after - before) / registered <= 0.1,
                2.0,
                "two topics per client before",
                load,
            )
        )
        run.add(
            Figure(
                "fleet",
                "server RSS (MiB)",
                rss,
                "<= 1024",
                rss <= 1024,
                base_rss,
                "server RSS before the fleet",
                load,
            )
        )
        run.add(
            Figure(
                "fleet",
                "peak server RSS (MiB)",
                peak,
                "<= 1024",
                peak <= 1024,
                base_rss,
                "server RSS before the fleet",
                load,
            )
        )
        run.add(
            Figure(
                "fleet",
                f"live subscribers' put→listener p99 at {options.rate}/s (ms)",
                live.p99_ms,
                "<= 100",
                live.p99_ms <= 100,
                relay.p99_ms,
                "raw two-hop relay p99",
                load,
            )
        )
        progress.phase(
            run.console, f"1: {len(sampled)} durable clients come back (load {_load()}) ..."
        )
        load = _load()
        ok, replay_s = _check_replays(settings, sampled, sent_keys)
        run.add(
            Figure(
                "fleet",
                f"sampled durable clients with their whole backlog, once, in "
                f"order, before the marker (of {len(sampled)})",
                ok,
                f"= {len(sampled)}",
                ok == len(sampled),
                load=load,
                higher_is_better=True,
            )
        )
        run.add(
            Figure(
                "fleet",
                "reconnect + replay, median (s)",
                percentile(sorted(replay_s), 0.5),
                "-",
                None,
                load=load,
            )
        )


def _sampled(options: FleetOptions) -> list[int]:
    step = max(1, options.durable_clients // max(options.sampled, 1))
    return list(range(0, options.durable_clients, step))[: options.sampled]


def _sizes(total: int, per: int) -> list[int]:
    return [min(per, total - start) for start in range(0, total, per)]


def _register_durables(services: Services, options: FleetOptions) -> list[float]:
    settings = _settings(services, options)
    counts = _sizes(
        options.durable_clients, -(-options.durable_clients // options.registering_processes)
    )
    connect_s: list[float] = []
    with ExitStack() as stack:
        children = []
        first = 0
        for i, count in enumerate(counts):
            children.append(
                stack.enter_context(
                    Child(
                        run_durable_registrations,
                        f"fleet-register-{i}",
                        settings=settings,
                        region=REGION,
                        first=first,
                        count=count,
                    )
                )
            )
            first += count
        for child in children:
            child.wait_ready(120)
        for child in children:
            result = child.wait_result(3600)
            connect_s += result["connect_s"]
    return connect_s


def _raw_connects(services: Services, count: int) -> list[float]:
    """A raw Kafka client's start: a consumer assigned at the end of a partition and a
    producer made, one message produced and consumed; seconds each, sorted."""
    topic = f"{services.namespace}.raw.connect"
    admin = kafka_admin(services.kafka_config)
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(20)
    times = []
    for i in range(count):
        began = time.perf_counter()
        consumer = kafka_consumer(
            {**services.kafka_config, "group.id": f"raw-connect-{i}", "fetch.wait.max.ms": 100}
        )
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, end)])
        # Not idempotent: an idempotent producer's first message waits for its producer id.
        producer = kafka_producer({**services.kafka_config, "acks": "all", "linger.ms": 0})
        producer.produce(topic, b"x", partition=0)
        producer.flush(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                break
        else:
            raise BenchError("raw connect: the message did not come back within 30 s")
        times.append(time.perf_counter() - began)
        consumer.close()
    return sorted(times)


def _check_replays(
    settings: dict[str, Any], sampled: list[int], sent_keys: dict[str, list[int]]
) -> tuple[int, list[float]]:
    """How many sampled durable clients heard exactly their keys' puts, each once, in put
    order per key, all before their marker; and each one's reconnect-and-replay time."""
    good = 0
    replay_s = []
    for index in sampled:
        got = reconnect_durable(settings, REGION, index, timeout_s=60)
        replay_s.append(got["replay_s"])
        expected = {k: sent_keys.get(k, []) for k in durable_keys(index)}
        heard: dict[str, list[int]] = {}
        for key, put, replayed in got["events"]:
            heard.setdefault(key, []).append(put if replayed else -1)
        if got["live"] and all(heard.get(k, []) == v for k, v in expected.items()):
            good += 1
        else:
            log.warning("durable client %d: expected %s, heard %s", index, expected, heard)
    return good, replay_s


# --- 2: cleanup ---------------------------------------------------------------------------


def cleanup_phase(run: Run, options: FleetOptions) -> None:
    """Goal 2 (see the module's description)."""
    env = {
        "REGIONBUS_MAXIMUM_TIME_BETWEEN_PINGS_MS": str(_CLEANUP_SILENCE_MS),
        "REGIONBUS_DURABLE_CLIENT_REAPER_INTERVAL_S": str(_CLEANUP_REAPER_S),
    }
    with _server(run, options, "cleanup", env) as (services, _server_process):
        settings = _settings(services, options)
        before = _partitions(services)
        half = options.cleanup_clients // 2
        progress.phase(
            run.console, f"2: {options.cleanup_clients} clients, then SIGKILL (load {_load()}) ..."
        )
        fleets = {
            "plain": Child(
                run_killable_clients,
                "fleet-kill-plain",
                settings=settings,
                region=REGION,
                prefix="kill-p",
                count=half,
                durable_client_timeout_s=None,
            ),
            "durable": Child(
                run_killable_clients,
                "fleet-kill-durable",
                settings=settings,
                region=REGION,
                prefix="kill-d",
                count=options.cleanup_clients - half,
                durable_client_timeout_s=_CLEANUP_DURABLE_TIMEOUT_S,
            ),
        }
        ids = {
            "plain": {f"kill-p-{n}" for n in range(half)},
            "durable": {f"kill-d-{n}" for n in range(options.cleanup_clients - half)},
        }
        for child in fleets.values():
            child.start()
        try:
            for child in fleets.values():
                child.wait_ready(60 + 2 * options.cleanup_clients)
            added = _partitions(services) - before
        finally:
            load = _load()
            for child in fleets.values():
                if child.pid is not None:
                    os.kill(child.pid, signal.SIGKILL)
        killed = time.monotonic()
        client = redis.Redis.from_url(services.redis_url)
        gone_s: dict[str, float] = {}
        deadline = killed + _CLEANUP_SILENCE_MS / 1000 + _CLEANUP_DURABLE_TIMEOUT_S + 120
        while len(gone_s) < 2 and time.monotonic() < deadline:
            left = _left(services, client)
            for kind, kind_ids in ids.items():
                if kind not in gone_s and not kind_ids & left:
                    gone_s[kind] = time.monotonic() - killed
            time.sleep(0.2)
        for child in fleets.values():
            child.stop()
        plain_limit = _CLEANUP_SILENCE_MS / 1000 + _CLEANUP_MARGIN_S
        durable_limit = _CLEANUP_DURABLE_TIMEOUT_S + _CLEANUP_MARGIN_S
        plain = gone_s.get("plain", math.inf)
        durable = gone_s.get("durable", math.inf)
        run.add(
            Figure(
                "cleanup",
                f"Kafka partitions added by {options.cleanup_clients} clients",
                added,
                "0",
                added == 0,
                2 * options.cleanup_clients,
                "two topics per client before",
                load,
            )
        )
        run.add(
            Figure(
                "cleanup",
                "non-durable gone after SIGKILL (s)",
                plain,
                f"<= {plain_limit:.1f}",
                plain <= plain_limit,
                _CLEANUP_SILENCE_MS / 1000,
                "silence window",
                load,
            )
        )
        run.add(
            Figure(
                "cleanup",
                "durable gone after SIGKILL (s)",
                durable,
                f"<= {durable_limit:.1f}",
                durable <= durable_limit,
                _CLEANUP_DURABLE_TIMEOUT_S,
                "durable_client_timeout_s",
                load,
            )
        )


def _left(services: Services, client: redis.Redis) -> set[str]:
    """Client ids of the namespace that still have anything: a record, a Redis key or a
    consumer group."""
    keys = RedisKeys(services.namespace)
    left = {k.decode() for k in client.hkeys(keys.clients)}
    for key in client.scan_iter(match=f"{keys.prefix}interest:*", count=1000):
        left.add(key.decode().rsplit(":", 1)[-1])
    topics = Topics(services.namespace)
    for group in _groups(services):
        client_id = topics.client_of_group(group)
        if client_id is not None:
            left.add(client_id)
    return left


# --- 5: huge requests -----------------------------------------------------------------------


def requests_phase(run: Run, options: FleetOptions) -> None:
    """Goal 5 (see the module's description)."""
    with _server(run, options, "requests") as (services, _server_process):
        writer_cache, bystander = _writer(services, options)
        big_cache = ClientCache(
            ClientSettings(**_settings(services, options, read_timeout_ms=60_000))
        )
        try:
            big = big_cache.create_region(REGION, serializer=BytesSerializer())
            load = _load()
            alone = _bystander(bystander, lambda: time.sleep(5))
            progress.phase(
                run.console,
                f"5: a registration of {MAX_KEYS_PER_REGISTRATION:,} keys (load {_load()}) ...",
            )
            keys = [f"reg-{i}" for i in range(MAX_KEYS_PER_REGISTRATION)]
            during_reg = _bystander(bystander, lambda: big.register_interest(keys))
            progress.phase(
                run.console, f"5: a put_all of {MAX_BULK_ENTRIES:,} entries (load {_load()}) ..."
            )
            entries = {f"bulk-{i}": b"v" * 24 for i in range(MAX_BULK_ENTRIES)}
            during_bulk = _bystander(bystander, lambda: _put_all(big, entries))
            refused_ms = _refusals(big)
        finally:
            big_cache.close()
            writer_cache.close()
        base = percentile(alone[0], 0.99)
        for name, (latencies, took_s) in (
            (f"register_interest of {MAX_KEYS_PER_REGISTRATION:,} keys", during_reg),
            (f"put_all of {MAX_BULK_ENTRIES:,} entries", during_bulk),
        ):
            p99 = percentile(latencies, 0.99)
            run.add(
                Figure(
                    "requests",
                    f"bystander put p99 during a {name} (ms)",
                    p99,
                    "<= 100",
                    p99 <= 100,
                    base,
                    "bystander put p99 alone",
                    load,
                )
            )
            worst = latencies[-1] if latencies else math.nan
            run.add(
                Figure(
                    "requests",
                    "bystander worst put during it (ms)",
                    worst,
                    "<= 1000",
                    worst <= 1000,
                    base,
                    "bystander put p99 alone",
                    load,
                )
            )
            run.add(Figure("requests", f"{name} took (s)", took_s, "-", None, load=load))
        run.add(
            Figure(
                "requests",
                "1,000,000 keys / 300,000 entries refused in (ms)",
                refused_ms,
                "refused before sending",
                refused_ms < 5_000,
                load=load,
            )
        )


def _bystander(region: Region, during: Any) -> tuple[list[float], float]:
    """Sync puts of a bystander, one after the other, while ``during()`` runs; their
    latencies (ms, sorted) and how long ``during`` took (s)."""
    import threading

    latencies: list[float] = []
    stop = threading.Event()

    def put() -> None:
        i = 0
        while not stop.is_set():
            began = time.perf_counter()
            region.put(f"bystander-{i % 64}", stamped_value(24))
            latencies.append((time.perf_counter() - began) * 1000)
            i += 1

    thread = threading.Thread(target=put, daemon=True)
    thread.start()
    began = time.monotonic()
    try:
        during()
    finally:
        took_s = time.monotonic() - began
        stop.set()
        thread.join(60)
    return sorted(latencies), took_s


def _put_all(region: Region, entries: dict[str, bytes]) -> None:
    try:
        region.put_all(entries)
    except BulkOperationError as exc:
        log.warning("put_all: %s", exc)


def _refusals(region: Region) -> float:
    began = time.perf_counter()
    for ask in (
        lambda: region.register_interest([f"k{i}" for i in range(1_000_000)]),
        lambda: region.put_all({f"k{i}": b"v" for i in range(300_000)}),
    ):
        try:
            ask()
        except RequestLimitError:
            continue
        raise BenchError("a request over the limits was not refused")
    return (time.perf_counter() - began) * 1000


# --- 6: stalled subscribers -----------------------------------------------------------------


def stalled_phase(run: Run, options: FleetOptions) -> None:
    """Goal 6 (see the module's description)."""
    with _server(run, options, "stalled") as (services, _server_process):
        settings = _settings(services, options)
        figures = {}
        for stalled in (False, True):
            progress.phase(
                run.console,
                f"6: {options.stalled_subscribers} subscribers, "
                f"{'a tenth' if stalled else 'none'} stalled (load {_load()}) ...",
            )
            figures[stalled] = _stalled_run(services, options, settings, stalled)
        (p99_none, tput_none, load), (p99_some, tput_some, _) = figures[False], figures[True]
        run.add(
            Figure(
                "stalled",
                "others' put→listener p99, a tenth stalled (ms)",
                p99_some,
                "<= 1.1 x none stalled",
                p99_some <= 1.1 * p99_none,
                p99_none,
                "p99 with none stalled",
                load,
            )
        )
        run.add(
            Figure(
                "stalled",
                "writer puts acked/s, a tenth stalled",
                tput_some,
                ">= 0.9 x none stalled",
                tput_some >= 0.9 * tput_none,
                tput_none,
                "puts acked/s with none stalled",
                load,
                higher_is_better=True,
            )
        )


def _stalled_run(
    services: Services, options: FleetOptions, settings: dict[str, Any], stall: bool
) -> tuple[float, float, str]:
    sizes = _sizes(options.stalled_subscribers, _SUBSCRIBERS_PER_PROCESS)
    with ExitStack() as stack:
        children = [
            stack.enter_context(
                Child(
                    run_subscribers,
                    f"fleet-stall-{i}",
                    settings=settings,
                    region=REGION,
                    clients=size,
                    record_latency=True,
                    idle_timeout_s=30.0,
                )
            )
            for i, size in enumerate(sizes)
        ]
        for child in children:
            child.wait_ready(60 + 10 * _SUBSCRIBERS_PER_PROCESS)
        stalled = children[: max(1, len(children) // 10)] if stall else []
        for child in stalled:
            assert child.pid is not None
            os.kill(child.pid, signal.SIGSTOP)
        for child in stalled:
            assert child.pid is not None
            stack.callback(os.kill, child.pid, signal.SIGCONT)
        writer_cache, writer = _writer(services, options)
        stack.callback(writer_cache.close)
        futures: list[Future[None]] = []
        load = _load()
        sent, first_ns, last_ns = paced(
            lambda i, value: futures.append(writer.put_async(f"s-{i}", value)),
            options.stalled_rate,
            options.stalled_seconds,
            24,
        )
        done_ns = 0
        acked = 0
        for future in futures:
            if future.exception(120) is None:
                acked += 1
        done_ns = time.time_ns()
        healthy = [c for c in children if c not in stalled]
        for child in healthy:
            child.expect(acked)
        results = [child.wait_result(RESULT_TIMEOUT_S) for child in healthy]
        for child in stalled:
            assert child.pid is not None
            os.kill(child.pid, signal.SIGCONT)
    merged = {
        "counts": [c for r in results for c in r["counts"]],
        "sent_ns": [s for r in results for s in r["sent_ns"]],
        "received_ns": [s for r in results for s in r["received_ns"]],
    }
    figures = latency(sent=sent, start_ns=first_ns, end_ns=last_ns, warmup_s=1.0, readers=merged)
    return figures.p99_ms, acked / max((done_ns - first_ns) / NS_PER_S, 1e-9), load


# --- the run ----------------------------------------------------------------------------


def run(options: FleetOptions, console: Console) -> list[Figure]:
    """Start the stack (unless given by env) and run the chosen phases.

    Raises:
        BenchError: a server or child process failed or did not answer in time.
        StackError: Kafka or Redis could not be started.
    """
    with ExitStack() as stack:
        work_dir = progress.log_dir("fleet", console)
        local = stack.enter_context(LocalStack(use_docker=False))
        stack.enter_context(progress.keep_stack_logs(local))
        console.print(
            f"kafka {local.kafka_bootstrap_servers} ({local.kafka_source}), redis "
            f"{local.redis_url} ({local.redis_source}), logs in {work_dir}",
            style="dim",
        )
        state = Run(local, work_dir, console)
        phases = {
            "fleet": fleet_phase,
            "cleanup": cleanup_phase,
            "requests": requests_phase,
            "stalled": stalled_phase,
        }
        for name in options.phases:
            phases[name](state, options)
        return state.figures


def markdown_table(figures: list[Figure]) -> str:
    """The figures as a Markdown table (for ``bench/RESULTS.md``)."""
    lines = [
        "| phase | figure | regionbus | baseline | baseline is | goal | met | load before |",
        "|---|---|---:|---:|---|---|---|---|",
    ]
    for f in figures:
        baseline = "" if math.isnan(f.baseline) else f"{f.baseline:,.2f}"
        met = {"met": "yes", "NOT met": "**no**"}.get(_verdict(f.met), "-")
        lines.append(
            f"| {f.phase} | {f.figure} | {f.value:,.2f} | {baseline} | {f.baseline_name} | "
            f"{f.goal} | {met} | {f.load} |"
        )
    return "\n".join(lines) + "\n"


def summary_rows(figures: list[Figure]) -> list[SummaryRow]:
    """The rows ``bench.all`` collects: each figure with a baseline."""
    return [
        SummaryRow("fleet", f.figure, f.value, f.baseline, f.baseline_name, f.higher_is_better)
        for f in figures
        if not math.isnan(f.baseline)
    ]


def _phases(text: str) -> tuple[str, ...]:
    chosen = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = sorted(set(chosen) - set(_PHASES))
    if unknown or not chosen:
        raise click.BadParameter(f"phases are {', '.join(_PHASES)}; not {unknown}")
    return chosen


@click.command()
@click.option(
    "--phases",
    default=",".join(_PHASES),
    show_default=True,
    callback=lambda _c, _p, v: _phases(v),
    help="Which phases to run.",
)
@click.option(
    "--durable-clients",
    default=9_900,
    show_default=True,
    type=click.IntRange(1),
    help="Durable clients registered and away.",
)
@click.option(
    "--registering-processes",
    default=2,
    show_default=True,
    type=click.IntRange(1),
    help="Processes registering the durable clients.",
)
@click.option(
    "--live-subscribers",
    default=100,
    show_default=True,
    type=click.IntRange(1),
    help="Subscribers with ALL_KEYS interest during the fleet phase.",
)
@click.option(
    "--sampled",
    default=100,
    show_default=True,
    type=click.IntRange(1),
    help="Durable clients that come back and check their backlog.",
)
@click.option(
    "--rate",
    default=200,
    show_default=True,
    type=click.IntRange(1),
    help="Puts per second of the fleet phase.",
)
@click.option("--seconds", default=20.0, show_default=True, help="Length of the fleet phase.")
@click.option(
    "--connects",
    default=200,
    show_default=True,
    type=click.IntRange(1),
    help="Connects the connect median is taken over (the first durable clients').",
)
@click.option(
    "--cleanup-clients",
    default=200,
    show_default=True,
    type=click.IntRange(2),
    help="Clients killed with SIGKILL (half durable).",
)
@click.option(
    "--stalled-subscribers",
    default=100,
    show_default=True,
    type=click.IntRange(10),
    help="Subscribers of the stalled phase (a tenth stalled).",
)
@click.option(
    "--stalled-rate",
    default=100,
    show_default=True,
    type=click.IntRange(1),
    help="Puts per second of the stalled phase.",
)
@click.option(
    "--stalled-seconds", default=15.0, show_default=True, help="Length of each stalled run."
)
@fetch_wait_option()
@linger_option()
@click.option(
    "--markdown",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the table as Markdown here (for bench/RESULTS.md).",
)
@click.option("--json", "as_json", is_flag=True, help="Also print the figures as JSON.")
def main(markdown: Path | None, as_json: bool, **values: Any) -> None:
    """Measure a fleet of clients: registered, crashed, connecting, asking too much, stalled."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    options = FleetOptions(**values)
    console = Console(width=None if sys.stdout.isatty() else _TABLE_WIDTH)
    figures = run_or_exit(lambda: run(options, console), console)
    table = markdown_table(figures)
    console.print(table)
    if markdown is not None:
        markdown.write_text(table, encoding="utf-8")
        console.print(f"markdown written to {markdown}")
    emit(summary_rows(figures))
    if as_json:
        print(json.dumps({**asdict(options), "figures": [asdict(f) for f in figures]}))


if __name__ == "__main__":
    main()
