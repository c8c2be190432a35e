"""The raw confluent-kafka baselines: what Kafka alone does with the same messages.

``raw_throughput`` produces to a fresh topic read by a number of consumer processes
(phase (c1) of ``bench.core``); ``raw_relay_latency`` sends paced messages through a
two-hop relay, producer → topic → relay process → topic → consumer (phase (c2)), the
shape of a put that a server turns into a subscriber's event; ``raw_fanout_relay`` reads
the operations topic and copies each message to as many single-partition topics as there
are subscribers, each read by its own consumer (phase (c3)): the shape of the server's hot
path without decoding or Redis.
"""

from __future__ import annotations

import os
import time
import zlib
from contextlib import ExitStack

from confluent_kafka.admin import NewTopic

from bench.cpu import CpuMeter, MachineCpu
from bench.load import paced
from bench.raw_workers import (
    fanout_topic,
    produce,
    raw_producer,
    run_fanout_relay,
    run_raw_consumers,
    run_relay,
)
from bench.report import Latency, Throughput, latency, throughput
from bench.scaling_figures import merge_results, process_sizes
from bench.server import BenchError
from bench.services import ACK_TIMEOUT_S, REGION, RESULT_TIMEOUT_S, BenchOptions, Services
from bench.workers import Child, stamped_value
from regionbus.schemas.kafka_clients import kafka_admin
from regionbus.schemas.naming import DEFAULT_TOTAL_BUCKETS


def _create_topics(services: Services, topics: dict[str, int]) -> None:
    admin = kafka_admin(services.kafka_config)
    for name, future in admin.create_topics(
        [NewTopic(t, partitions, 1) for t, partitions in topics.items()], operation_timeout=15
    ).items():
        try:
            future.result(timeout=20)
        except Exception as exc:
            raise BenchError(f"cannot create topic {name}: {exc}") from exc


def _raw_readers(
    stack: ExitStack,
    services: Services,
    options: BenchOptions,
    topic: str,
    partitions: int,
    sizes: list[int],
    label: str,
    *,
    record_latency: bool = False,
) -> list[Child]:
    """Children of ``run_raw_consumers`` reading the whole ``topic``, ``sizes[i]`` consumers
    in child ``i``, entered on ``stack`` and ready.

    Raises:
        BenchError: a child exited or was not ready in time.
    """
    children = [
        stack.enter_context(
            Child(
                run_raw_consumers,
                f"raw-{label}-{index}",
                kafka_config=services.kafka_config,
                topic=topic,
                partitions=partitions,
                consumers=size,
                fetch_wait_max_ms=options.fetch_wait_max_ms,
                record_latency=record_latency,
                idle_timeout_s=options.idle_timeout_s,
            )
        )
        for index, size in enumerate(sizes)
    ]
    for child in children:
        child.wait_ready()
    return children


def raw_throughput(
    services: Services,
    options: BenchOptions,
    readers: int,
    label: str,
    per_process: int | None = None,
) -> Throughput:
    """Phase (c1): produce ``ops`` messages to a fresh topic read by ``readers`` consumers
    (in children of at most ``per_process`` consumers each; default one child)."""
    topic = f"{services.namespace}.raw.{label}"
    _create_topics(services, {topic: DEFAULT_TOTAL_BUCKETS})
    sizes = process_sizes(readers, per_process) if per_process else [readers]
    with ExitStack() as stack:
        children = _raw_readers(
            stack, services, options, topic, DEFAULT_TOTAL_BUCKETS, sizes, f"consumers-{label}"
        )
        producer = raw_producer(services.kafka_config, options.linger_ms)
        services_pids = {k: v for k, v in services.pids.items() if k != "server"}
        cpu = CpuMeter({"writer": os.getpid(), **services_pids})
        cpu.start()
        start_ns = time.time_ns()
        for i in range(options.ops):
            key = f"tp-{i % options.key_space}"
            value = stamped_value(options.value_bytes)
            produce(producer, topic, value, key.encode(), _partition(key))
        remaining = producer.flush(ACK_TIMEOUT_S)
        acked_ns = time.time_ns()
        for child in children:
            child.expect(options.ops - remaining)
        result = merge_results([child.wait_result(RESULT_TIMEOUT_S) for child in children])
        cpu.stop()
    return throughput(
        sent=options.ops,
        acked=options.ops - remaining,
        errors=remaining,
        start_ns=start_ns,
        last_ack_ns=acked_ns,
        readers=result,
        cpu_s=cpu.used_s,
    )


def raw_relay_latency(services: Services, options: BenchOptions, label: str = "relay") -> Latency:
    """Phase (c2): paced producer → topic → relay process → topic → consumer process, with
    the CPU of each process and the machine's busy cores while the producer sent.

    ``label`` names the run's topics (``{namespace}.raw.{label}-in`` / ``-out``), so the
    relay can run more than once on one broker (the untimed warm-up, then phase (c2)).
    """
    topic_in = f"{services.namespace}.raw.{label}-in"
    topic_out = f"{services.namespace}.raw.{label}-out"
    _create_topics(services, {topic_in: DEFAULT_TOTAL_BUCKETS, topic_out: 1})
    with ExitStack() as stack:
        relay = stack.enter_context(
            Child(
                run_relay,
                "raw-relay",
                kafka_config=services.kafka_config,
                topic_in=topic_in,
                partitions_in=DEFAULT_TOTAL_BUCKETS,
                topic_out=topic_out,
                fetch_wait_max_ms=options.fetch_wait_max_ms,
                linger_ms=options.linger_ms,
            )
        )
        sink = stack.enter_context(
            Child(
                run_raw_consumers,
                "raw-relay-sink",
                kafka_config=services.kafka_config,
                topic=topic_out,
                partitions=1,
                consumers=1,
                fetch_wait_max_ms=options.fetch_wait_max_ms,
                record_latency=True,
                idle_timeout_s=options.idle_timeout_s,
            )
        )
        relay.wait_ready()
        sink.wait_ready()
        producer = raw_producer(services.kafka_config, options.linger_ms)

        def send(i: int, value: bytes) -> None:
            key = f"lat-{i}"
            produce(producer, topic_in, value, key.encode(), _partition(key))

        services_pids = {k: v for k, v in services.pids.items() if k != "server"}
        cpu = CpuMeter({"writer": os.getpid(), "relay": relay.pid, **services_pids})
        machine = MachineCpu()
        cpu.start()
        machine.start()
        sent, first_ns, last_ns = paced(
            send, options.rate, options.latency_seconds, options.value_bytes
        )
        busy_cores = machine.stop()
        remaining = producer.flush(ACK_TIMEOUT_S)
        sink.expect(sent - remaining)
        result = sink.wait_result(RESULT_TIMEOUT_S)
        cpu.stop()
        relay.result(RESULT_TIMEOUT_S)
    return latency(
        sent=sent,
        start_ns=first_ns,
        end_ns=last_ns,
        warmup_s=options.warmup_seconds,
        readers=result,
        machine_busy_cores=busy_cores,
        cpu_s=cpu.used_s,
    )


def raw_fanout_latency(
    services: Services,
    options: BenchOptions,
    consumers: int,
    per_process: int,
    label: str = "fanout-latency",
) -> Latency:
    """The raw Kafka shape of live subscribers' latency: a paced producer at
    ``options.rate`` to a one-partition topic that ``consumers`` consumers read, each every
    message, ``per_process`` of them per child process (as the subscribers it is beside).

    No server hop, nothing decoded: what any fan-out over Kafka pays on this machine at
    this rate (a fetch per consumer per message), the baseline of a many-subscriber
    latency. The machine's busy cores while the producer sent are in the result
    (``machine_busy_cores``): how close this shape alone comes to using every core.

    Raises:
        BenchError: the topic cannot be created, or a child failed or did not answer.
    """
    topic = f"{services.namespace}.raw.{label}"
    _create_topics(services, {topic: 1})
    with ExitStack() as stack:
        children = _raw_readers(
            stack,
            services,
            options,
            topic,
            1,
            process_sizes(consumers, per_process),
            label,
            record_latency=True,
        )
        producer = raw_producer(services.kafka_config, options.linger_ms)

        def send(i: int, value: bytes) -> None:
            produce(producer, topic, value, f"lat-{i}".encode(), 0)

        machine = MachineCpu()
        machine.start()
        sent, first_ns, last_ns = paced(
            send, options.rate, options.latency_seconds, options.value_bytes
        )
        busy_cores = machine.stop()
        remaining = producer.flush(ACK_TIMEOUT_S)
        for child in children:
            child.expect(sent - remaining)
        result = merge_results([child.wait_result(RESULT_TIMEOUT_S) for child in children])
    return latency(
        sent=sent,
        start_ns=first_ns,
        end_ns=last_ns,
        warmup_s=options.warmup_seconds,
        readers=result,
        machine_busy_cores=busy_cores,
    )


def raw_idle_readers(
    stack: ExitStack,
    services: Services,
    options: BenchOptions,
    sizes: list[int],
    label: str = "idle",
) -> list[Child]:
    """Raw consumers with nothing to read: ``sizes[i]`` in child ``i``, each an ``assign()``
    consumer of a one-partition topic no one writes, entered on ``stack`` and ready (the
    baseline of an idle client's cost).

    Raises:
        BenchError: the topic cannot be created, or a child failed or was not ready.
    """
    topic = f"{services.namespace}.raw.{label}"
    _create_topics(services, {topic: 1})
    return _raw_readers(stack, services, options, topic, 1, sizes, label)


def raw_fanout_relay(
    services: Services, options: BenchOptions, fanout: int, label: str = "fanout"
) -> Throughput:
    """Phase (c3): ``ops`` messages to a fresh 16-partition topic, copied by a relay process
    to ``fanout`` one-partition topics, each read by its own consumer.

    ``label`` names the run's topics (``{namespace}.raw.{label}-in`` / ``-out.<i>``), so the
    relay can run more than once on one broker (the untimed warm-up, then phase (c3)).

    Returns:
        ``acked_per_s``: messages relayed per second, from the first send until the relay
        has every copy of every message acknowledged by Kafka (the counterpart of a cache
        server's operations applied per second); ``delivered_per_s``: copies the consumers
        received per second.

    Raises:
        BenchError: a topic cannot be created, or a child failed or did not answer.
    """
    topic_in = f"{services.namespace}.raw.{label}-in"
    topic_out = f"{services.namespace}.raw.{label}-out"
    _create_topics(
        services,
        {topic_in: DEFAULT_TOTAL_BUCKETS, **{fanout_topic(topic_out, i): 1 for i in range(fanout)}},
    )
    with ExitStack() as stack:
        relay = stack.enter_context(
            Child(
                run_fanout_relay,
                "raw-fanout-relay",
                kafka_config=services.kafka_config,
                topic_in=topic_in,
                partitions_in=DEFAULT_TOTAL_BUCKETS,
                topic_out=topic_out,
                fanout=fanout,
                fetch_wait_max_ms=options.fetch_wait_max_ms,
                linger_ms=options.linger_ms,
            )
        )
        consumers = stack.enter_context(
            Child(
                run_raw_consumers,
                "raw-fanout-consumers",
                kafka_config=services.kafka_config,
                topic=topic_out,
                partitions=1,
                consumers=fanout,
                fetch_wait_max_ms=options.fetch_wait_max_ms,
                record_latency=False,
                idle_timeout_s=options.idle_timeout_s,
                topic_each=True,
            )
        )
        relay.wait_ready()
        consumers.wait_ready()
        producer = raw_producer(services.kafka_config, options.linger_ms)
        services_pids = {k: v for k, v in services.pids.items() if k != "server"}
        cpu = CpuMeter({"writer": os.getpid(), "relay": relay.pid, **services_pids})
        cpu.start()
        start_ns = time.time_ns()
        for i in range(options.ops):
            key = f"tp-{i % options.key_space}"
            value = stamped_value(options.value_bytes)
            produce(producer, topic_in, value, key.encode(), _partition(key))
        remaining = producer.flush(ACK_TIMEOUT_S)
        relay.expect(options.ops - remaining)
        relayed = relay.wait_result(RESULT_TIMEOUT_S)
        consumers.expect(relayed["relayed"])
        result = consumers.wait_result(RESULT_TIMEOUT_S)
        cpu.stop()
    return throughput(
        sent=options.ops,
        acked=relayed["relayed"],
        errors=options.ops - relayed["relayed"],
        start_ns=start_ns,
        last_ack_ns=relayed["done_ns"],
        readers=result,
        cpu_s=cpu.used_s,
    )


def _partition(key: str) -> int:
    """The partition regionbus would use: the key's bucket (CRC-32, as ``bucket_of``)."""
    return zlib.crc32(f"{REGION}\x00{key}".encode()) % DEFAULT_TOTAL_BUCKETS


__all__ = [
    "raw_fanout_latency",
    "raw_fanout_relay",
    "raw_idle_readers",
    "raw_relay_latency",
    "raw_throughput",
]
