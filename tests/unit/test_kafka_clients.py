"""Every Kafka client of the project is made by `regionbus.schemas.kafka_clients`, with topic
auto-creation off."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.kafka_clients import (
    AUTO_CREATE_KEY,
    CONSUMER_BOUNDS,
    PRODUCER_BOUNDS,
    RECONNECT_BACKOFF_MS,
    client_config,
    factory_config,
    kafka_consumer,
)
from regionbus.schemas.kafka_outage import LIBRDKAFKA_LOGGER
from regionbus.schemas.record_guard import GuardedConsumer
from regionbus.schemas.record_limits import DEAD_LETTER_BATCH_MAX_BYTES

_ROOT = Path(__file__).resolve().parents[2]
_FACTORY = _ROOT / "src" / "regionbus" / "schemas" / "kafka_clients.py"
_CLIENT_CLASSES = frozenset(
    {
        "Consumer",
        "GuardedConsumer",
        "Producer",
        "AdminClient",
        "DeserializingConsumer",
        "SerializingProducer",
    }
)
_SKIPPED_DIRS = frozenset({".venv", "jvm", "build", "dist", ".git", "node_modules"})


def _project_sources() -> list[Path]:
    return [
        path
        for path in sorted(_ROOT.rglob("*.py"))
        if not _SKIPPED_DIRS & set(path.relative_to(_ROOT).parts)
        and not any(part.endswith(".egg-info") for part in path.parts)
    ]


def _client_constructions(path: Path, root: Path = _ROOT) -> list[str]:
    """``file:line name`` of every call to a confluent-kafka client class in one file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name in _CLIENT_CLASSES:
            found.append(f"{path.relative_to(root)}:{node.lineno} {name}(...)")
    return found


def test_no_kafka_client_is_constructed_outside_the_factory() -> None:
    sources = _project_sources()
    assert _FACTORY in sources and len(sources) > 100, "the scan must see the whole project"

    outside = [site for path in sources if path != _FACTORY for site in _client_constructions(path)]

    assert outside == [], (
        "construct Kafka clients with regionbus.schemas.kafka_clients (kafka_consumer, "
        "kafka_producer, kafka_admin) so allow.auto.create.topics=false holds everywhere:\n"
        + "\n".join(outside)
    )


def test_the_scan_finds_a_raw_construction(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import confluent_kafka\n"
        "from confluent_kafka import Consumer\n"
        "a = Consumer({'group.id': 'g'})\n"
        "b = confluent_kafka.Producer({})\n",
        encoding="utf-8",
    )
    assert _client_constructions(sample, tmp_path) == [
        "sample.py:3 Consumer(...)",
        "sample.py:4 Producer(...)",
    ]


def test_the_factory_turns_auto_creation_off_and_keeps_every_other_setting() -> None:
    given = {"bootstrap.servers": "k:9092", "linger.ms": 5}

    config = client_config(given)

    assert config == {"bootstrap.servers": "k:9092", "linger.ms": 5, AUTO_CREATE_KEY: False}
    assert given == {"bootstrap.servers": "k:9092", "linger.ms": 5}
    assert client_config({AUTO_CREATE_KEY: "false"})[AUTO_CREATE_KEY] is False


def test_every_client_logs_through_python_logging_unless_given_a_logger() -> None:
    own = logging.getLogger("mine")

    assert factory_config({"bootstrap.servers": "k:9092"}) == {
        "bootstrap.servers": "k:9092",
        AUTO_CREATE_KEY: False,
        "logger": LIBRDKAFKA_LOGGER,
        "reconnect.backoff.ms": RECONNECT_BACKOFF_MS,
    }
    assert factory_config({"logger": own})["logger"] is own


def test_a_clients_first_connection_waits_a_short_reconnect_backoff_unless_told_otherwise() -> None:
    # librdkafka's sparse-connect interval, half of reconnect.backoff.ms, delays every new
    # client's connection to the brokers it learns at bootstrap.
    assert RECONNECT_BACKOFF_MS <= 20
    assert factory_config({"reconnect.backoff.ms": 250})["reconnect.backoff.ms"] == 250


@pytest.mark.parametrize("asked", [True, "true", "TRUE", 1])
def test_asking_for_auto_creation_is_a_configuration_error(asked: object) -> None:
    with pytest.raises(ConfigurationError, match=AUTO_CREATE_KEY):
        client_config({"bootstrap.servers": "k:9092", AUTO_CREATE_KEY: asked})


def test_every_consumer_skips_unreadable_batches_and_is_bounded_in_what_it_fetches() -> None:
    """The factory's consumer is the guarded one, with the fetch bounds of record_limits
    unless the caller sets its own (librdkafka itself refuses a receive limit below the
    fetch limit, so the pair is checked where it is made)."""
    consumer = kafka_consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "unit"})
    try:
        assert isinstance(consumer, GuardedConsumer)
    finally:
        consumer.close()
    assert CONSUMER_BOUNDS["receive.message.max.bytes"] >= CONSUMER_BOUNDS["fetch.max.bytes"] + 512
    assert CONSUMER_BOUNDS["fetch.max.bytes"] >= 2 * DEAD_LETTER_BATCH_MAX_BYTES
    assert PRODUCER_BOUNDS == {
        "message.max.bytes": DEAD_LETTER_BATCH_MAX_BYTES,
        "compression.type": "none",
    }
