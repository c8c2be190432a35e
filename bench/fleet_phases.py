"""``bench.fleet``'s phases of a fleet of clients: the fleet registered and away with its
connects (goals 1 and 3), and crashed clients' cleanup (goal 2)."""

from __future__ import annotations

import logging
import math
import os
import secrets
import signal
import time
from concurrent.futures import Future
from contextlib import ExitStack
from typing import Any

import redis
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from bench import progress
from bench.cpu import MachineCpu
from bench.fleet_run import (
    CLEANUP_DURABLE_TIMEOUT_S,
    CLEANUP_MARGIN_S,
    CLEANUP_REAPER_S,
    CLEANUP_SILENCE_MS,
    SUBSCRIBERS_PER_PROCESS,
    Figure,
    FleetOptions,
    Run,
    client_settings,
    consumer_groups,
    fleet_server,
    indexed_value,
    load_now,
    namespace_partitions,
    rss_mb,
    subscriber_children,
    writer_client,
)
from bench.fleet_workers import (
    durable_keys,
    reconnect_durable,
    run_durable_registrations,
    run_killable_clients,
)
from bench.load import paced
from bench.raw import raw_fanout_latency
from bench.report import latency, percentile
from bench.scaling_figures import process_sizes
from bench.server import BenchError
from bench.services import REGION, RESULT_TIMEOUT_S, Services
from bench.workers import Child
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.naming import RedisKeys, Topics

log = logging.getLogger("regionbus.bench")

# --- before any phase ------------------------------------------------------------------------


def warm_up(run: Run, options: FleetOptions) -> None:
    """Untimed: raw Kafka's fan-out at the run's rate for ``options.seconds``, so that every
    phase meets a warm broker.

    A fresh broker spends its first tens of seconds compiling its own code (the JVM's JIT).
    Without this, the fleet phase, which comes first, met a cold broker and its raw
    baseline, measured after it, a warm one: with 10 subscribers the live p99 was 149 ms on
    the fresh broker and 34 ms on a warm one, raw Kafka's 7 ms either way.

    Raises:
        BenchError: the topic cannot be created, or a reader failed or did not answer.
    """
    services = Services(
        f"fleet.{secrets.token_hex(3)}.warmup",
        run.local.kafka_bootstrap_servers,
        run.local.redis_url,
        {},
    )
    consumers = min(options.live_subscribers, SUBSCRIBERS_PER_PROCESS)
    progress.phase(
        run.console,
        f"(w) warm-up, untimed: raw fan-out to {consumers} consumers, "
        f"{options.rate}/s for {options.seconds:g} s (load {load_now()}) ...",
    )
    raw_fanout_latency(
        services,
        options.bench_options(consumers),
        consumers,
        SUBSCRIBERS_PER_PROCESS,
        label="warmup",
    )


# --- 1 and 3: the fleet, and its connects ---------------------------------------------------


def fleet_phase(run: Run, options: FleetOptions) -> None:
    """Goals 1 and 3 (see the module's description)."""
    with fleet_server(run, options, "fleet") as (services, server):
        settings = client_settings(services, options)
        before = namespace_partitions(services)
        base_rss, _ = rss_mb(server.pid)
        progress.phase(
            run.console,
            f"1: {options.durable_clients:,} durable clients register "
            f"and go away (load {load_now()}) ...",
        )
        connect_s = register_durables(services, options)
        connect = sorted(connect_s[: options.connects])
        raw = _raw_connects(services, min(options.connects, 50))
        load = load_now()
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
            f"{options.rate} puts/s for {options.seconds} s (load {load_now()}) ...",
        )
        sampled = _sampled(options)
        with ExitStack() as stack:
            children = subscriber_children(
                stack, settings, options.live_subscribers, "live", record_latency=True
            )
            writer_cache, writer = writer_client(services, options)
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
                futures.append(writer.put_async(key, indexed_value(i)))

            load = load_now()
            machine = MachineCpu()
            machine.start()
            sent, first_ns, last_ns = paced(send, options.rate, options.seconds, 16)
            busy_cores = machine.stop()
            failed = sum(1 for f in futures if f.exception(120) is not None)
            for child in children:
                child.expect(sent - failed)
            results = [child.wait_result(RESULT_TIMEOUT_S) for child in children]
        merged = {
            "counts": [c for r in results for c in r["counts"]],
            "sent_ns": [s for r in results for s in r["sent_ns"]],
            "received_ns": [s for r in results for s in r["received_ns"]],
            "cpu_s": sum(float(r["cpu_s"]) for r in results),
        }
        live = latency(
            sent=sent,
            start_ns=first_ns,
            end_ns=last_ns,
            warmup_s=1.0,
            readers=merged,
            machine_busy_cores=busy_cores,
        )
        after = namespace_partitions(services)
        rss, peak = rss_mb(server.pid)
        raw_fanout = raw_fanout_latency(
            services,
            options.bench_options(options.live_subscribers),
            options.live_subscribers,
            SUBSCRIBERS_PER_PROCESS,
        )
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
                raw_fanout.p99_ms,
                f"raw Kafka: 1 producer → {options.live_subscribers} consumers p99",
                load,
            )
        )
        run.add(
            Figure(
                "fleet",
                f"live subscribers' put→listener p50 at {options.rate}/s (ms)",
                live.p50_ms,
                "-",
                None,
                raw_fanout.p50_ms,
                f"raw Kafka: 1 producer → {options.live_subscribers} consumers p50",
                load,
            )
        )
        run.add(
            Figure(
                "fleet",
                "live subscribers' CPU per event delivered, in their processes (µs)",
                live.readers_cpu_us_per_message,
                "-",
                None,
                raw_fanout.readers_cpu_us_per_message,
                "raw Kafka consumers' CPU per message",
                load,
            )
        )
        run.add(
            Figure(
                "fleet",
                f"machine's busy cores during the puts (of {os.cpu_count()})",
                live.machine_busy_cores,
                "-",
                None,
                raw_fanout.machine_busy_cores,
                "the same during raw Kafka's fan-out",
                load,
            )
        )
        progress.phase(
            run.console, f"1: {len(sampled)} durable clients come back (load {load_now()}) ..."
        )
        load = load_now()
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


def register_durables(
    services: Services,
    options: FleetOptions,
    *,
    first: int = 0,
    count: int | None = None,
    all_keys: bool = False,
) -> list[float]:
    """Register durable clients ``first`` .. ``first + count - 1`` (default: the fleet's
    ``--durable-clients``) and leave them away, spread over ``--registering-processes``
    children (:func:`register_durable_clients`).

    Returns:
        Each client's construction time, in seconds.

    Raises:
        BenchError: a child failed or did not answer in time.
    """
    return register_durable_clients(
        client_settings(services, options),
        processes=options.registering_processes,
        first=first,
        count=options.durable_clients if count is None else count,
        all_keys=all_keys,
    )


def register_durable_clients(
    settings: dict[str, Any], *, processes: int, first: int, count: int, all_keys: bool
) -> list[float]:
    """Register durable clients ``first`` .. ``first + count - 1`` of ``settings``
    (``ClientSettings`` fields) and leave them away, spread over at most ``processes``
    children (:func:`bench.fleet_workers.run_durable_registrations`): each registers
    ``ALL_KEYS`` with ``all_keys``, else keys of its own.

    Returns:
        Each client's construction time, in seconds.

    Raises:
        BenchError: a child failed or did not answer in time.
    """
    counts = process_sizes(count, -(-count // processes))
    connect_s: list[float] = []
    with ExitStack() as stack:
        children = []
        for i, size in enumerate(counts):
            children.append(
                stack.enter_context(
                    Child(
                        run_durable_registrations,
                        f"fleet-register-{i}",
                        settings=settings,
                        region=REGION,
                        first=first,
                        count=size,
                        all_keys=all_keys,
                    )
                )
            )
            first += size
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
        "REGIONBUS_MAXIMUM_TIME_BETWEEN_PINGS_MS": str(CLEANUP_SILENCE_MS),
        "REGIONBUS_DURABLE_CLIENT_REAPER_INTERVAL_S": str(CLEANUP_REAPER_S),
    }
    with fleet_server(run, options, "cleanup", env) as (services, _server_process):
        settings = client_settings(services, options)
        before = namespace_partitions(services)
        half = options.cleanup_clients // 2
        progress.phase(
            run.console,
            f"2: {options.cleanup_clients} clients, then SIGKILL (load {load_now()}) ...",
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
                durable_client_timeout_s=CLEANUP_DURABLE_TIMEOUT_S,
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
            added = namespace_partitions(services) - before
        finally:
            load = load_now()
            for child in fleets.values():
                if child.pid is not None:
                    os.kill(child.pid, signal.SIGKILL)
        killed = time.monotonic()
        client = redis.Redis.from_url(services.redis_url)
        gone_s: dict[str, float] = {}
        deadline = killed + CLEANUP_SILENCE_MS / 1000 + CLEANUP_DURABLE_TIMEOUT_S + 120
        while len(gone_s) < 2 and time.monotonic() < deadline:
            left = _left(services, client)
            for kind, kind_ids in ids.items():
                if kind not in gone_s and not kind_ids & left:
                    gone_s[kind] = time.monotonic() - killed
            time.sleep(0.2)
        for child in fleets.values():
            child.stop()
        plain_limit = CLEANUP_SILENCE_MS / 1000 + CLEANUP_MARGIN_S
        durable_limit = CLEANUP_DURABLE_TIMEOUT_S + CLEANUP_MARGIN_S
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
                CLEANUP_SILENCE_MS / 1000,
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
                CLEANUP_DURABLE_TIMEOUT_S,
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
    for group in consumer_groups(services):
        client_id = topics.client_of_group(group)
        if client_id is not None:
            left.add(client_id)
    return left
