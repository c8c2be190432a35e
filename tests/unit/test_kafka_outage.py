"""The Kafka outage tracker's decisions, fed the callbacks librdkafka would make (no broker)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError

from regionbus.schemas.kafka_outage import (
    LIBRDKAFKA_LOGGER,
    UNREACHABLE_QUIET_S,
    KafkaOutage,
    UnreachableBrokers,
    brokers_up,
)

_ALL_DOWN = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")
_REFUSED = KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:9092 failed")


def _stats(*states: str, logical_up: bool = False) -> str:
    brokers: dict[str, Any] = {
        f"127.0.0.1:{9092 + i}/{i + 1}": {"state": s, "nodeid": i + 1, "source": "learned"}
        for i, s in enumerate(states)
    }
    if logical_up:
        brokers["GroupCoordinator"] = {"state": "UP", "nodeid": -1, "source": "logical"}
    return json.dumps({"brokers": brokers})


def _callbacks(outage: KafkaOutage, client: str) -> tuple[Any, Any]:
    config = outage.client_config(client)
    return config["error_cb"], config["stats_cb"]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A settable ``time.monotonic`` of the tracker's module."""
    now = [1000.0]
    monkeypatch.setattr("regionbus.schemas.kafka_outage.time.monotonic", lambda: now[0])
    return now


def test_brokers_up_counts_real_brokers_only() -> None:
    assert brokers_up(_stats("DOWN", "UP"))
    assert not brokers_up(_stats("DOWN", "CONNECT", logical_up=True))
    assert not brokers_up("not json")


def test_an_outage_is_logged_once_at_its_start_and_once_at_its_end_whatever_the_clients(
    clock: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    outage = KafkaOutage("cache server s1")
    producer_error, producer_stats = _callbacks(outage, "producer")
    consumer_error, consumer_stats = _callbacks(outage, "consumer")
    with caplog.at_level(logging.DEBUG, logger="regionbus.kafka"):
        for _ in range(3):
            producer_error(_ALL_DOWN)
            consumer_error(_ALL_DOWN)
            producer_error(_REFUSED)
        clock[0] += 1.0
        producer_stats(_stats("DOWN"))
        consumer_stats(_stats("CONNECT"))
        assert outage.ongoing
        clock[0] += 5.0
        producer_stats(_stats("UP"))
        assert outage.ongoing, "over only when every client in it sees a broker again"
        consumer_stats(_stats("UP"))
    assert not outage.ongoing
    assert outage.outages == 1
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO]
    assert "Kafka unavailable for cache server s1" in lines[0][1]
    assert "Kafka available again for cache server s1 after 6.0 s" in lines[1][1]


def test_an_unwatched_client_reports_no_statistics_and_leaves_outages_to_the_watched(
    clock: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    outage = KafkaOutage("client c1")
    unwatched = outage.client_config("replies", watched=False)
    assert "stats_cb" not in unwatched and "statistics.interval.ms" not in unwatched
    producer_error, producer_stats = _callbacks(outage, "producer")
    with caplog.at_level(logging.DEBUG, logger="regionbus.kafka"):
        unwatched["error_cb"](_ALL_DOWN)
        clock[0] += 5.0
        producer_stats(_stats("DOWN"))
        assert not outage.ongoing, "the watched producer never saw its brokers down"
        producer_error(_ALL_DOWN)
        clock[0] += 1.0
        producer_stats(_stats("DOWN"))
        assert outage.ongoing
        producer_stats(_stats("UP"))
    assert not outage.ongoing, "the unwatched client holds no outage open"
    assert [r.levelno for r in caplog.records if r.levelno >= logging.INFO] == [
        logging.WARNING,
        logging.INFO,
    ]


def test_all_brokers_down_followed_by_a_connection_to_another_broker_is_a_failover(
    clock: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    outage = KafkaOutage("client c1")
    on_error, on_stats = _callbacks(outage, "producer")
    with caplog.at_level(logging.INFO, logger="regionbus.kafka"):
        on_error(_ALL_DOWN)
        clock[0] += 0.2
        on_stats(_stats("DOWN", "INIT"))
        clock[0] += 1.0
        on_stats(_stats("DOWN", "UP"))
        clock[0] += 1.0
        on_stats(_stats("DOWN", "UP"))
    assert outage.outages == 0
    assert not [r for r in caplog.records if r.name == "regionbus.kafka"]


def test_a_client_closed_during_an_outage_ends_it_without_a_recovery_line(
    clock: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    outage = KafkaOutage("client c1")
    on_error, on_stats = _callbacks(outage, "queue")
    on_error(_ALL_DOWN)
    clock[0] += 1.0
    on_stats(_stats("DOWN"))
    assert outage.ongoing
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="regionbus.kafka"):
        outage.forget("queue")
    assert not outage.ongoing
    assert not caplog.records


def test_librdkafka_lines_of_retried_connections_go_to_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG):
        LIBRDKAFKA_LOGGER.error("%s [%s] %s", "FAIL", "rdkafka#producer-1", "Connection refused")
        LIBRDKAFKA_LOGGER.warning("%s [%s] %s", "CONFWARN", "rdkafka#producer-1", "odd config")
    levels = {r.getMessage().split()[0]: (r.name, r.levelno) for r in caplog.records}
    assert levels["FAIL"] == ("regionbus.kafka.connections", logging.DEBUG)
    assert levels["CONFWARN"] == ("regionbus.kafka.librdkafka", logging.WARNING)


def test_an_unreachable_broker_is_one_warning_naming_it_until_its_failures_pause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    brokers = UnreachableBrokers(clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger="regionbus.kafka"):
        assert brokers.failed("127.0.0.1:1", "Connect to ipv4#127.0.0.1:1 failed")
        for _ in range(50):
            now[0] += 0.05
            assert not brokers.failed("127.0.0.1:1", "Connect to ipv4#127.0.0.1:1 failed")
        assert brokers.failed("10.0.0.9:9092", "Connect to ipv4#10.0.0.9:9092 failed")
        now[0] += UNREACHABLE_QUIET_S
        assert brokers.failed("127.0.0.1:1", "Connect to ipv4#127.0.0.1:1 failed")
        brokers.clear()
        assert brokers.failed("10.0.0.9:9092", "Connect to ipv4#10.0.0.9:9092 failed")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4
    assert "Kafka broker 127.0.0.1:1 unreachable" in warnings[0]
    assert "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS" in warnings[0]


def test_librdkafka_connect_failures_are_one_warning_per_broker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    line = (
        "[thrd:127.0.0.1:47/bootstrap]: 127.0.0.1:47/bootstrap: Connect to ipv4#127.0.0.1:47 "
        "failed: Connection refused (after 0ms in state CONNECT)"
    )
    with caplog.at_level(logging.DEBUG):
        for _ in range(20):
            LIBRDKAFKA_LOGGER.error("%s [%s] %s", "FAIL", "rdkafka#producer-1", line)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in warnings] == ["regionbus.kafka"]
    assert "Kafka broker 127.0.0.1:47 unreachable" in warnings[0].getMessage()
    assert sum(r.name == "regionbus.kafka.connections" for r in caplog.records) == 20
