"""The one place a Kafka producer, consumer or admin client of regionbus is made.

Every process (cache servers, clients, gateway workers, the Spark source and sink, the
benchmarks, the tests) builds its confluent-kafka clients with these functions, so every
one has ``allow.auto.create.topics=false``: regionbus creates each topic itself, with its
partition count and retention (`regionbus.schemas.topics.ensure_topics`). A client that named a
missing topic must never make a broker create it with the broker's defaults (one
partition, seven days), which would later read as a wrong partition count or lost events.
``tests/unit/test_kafka_clients.py`` fails when a client is constructed anywhere else.

Every consumer is a `regionbus.schemas.record_guard.GuardedConsumer`, which skips record
batches librdkafka cannot read, and consumers and producers get the size and compression
bounds of `regionbus.schemas.record_limits` unless the caller sets its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.kafka_outage import quiet_config
from regionbus.schemas.record_guard import GuardedConsumer
from regionbus.schemas.record_limits import (
    CONSUMER_FETCH_MAX_BYTES,
    CONSUMER_MAX_PARTITION_FETCH_BYTES,
    CONSUMER_RECEIVE_MESSAGE_MAX_BYTES,
    PRODUCER_COMPRESSION,
    PRODUCER_MAX_MESSAGE_BYTES,
)

AUTO_CREATE_KEY: Final = "allow.auto.create.topics"
"""The librdkafka key this module always sets to false (librdkafka CONFIGURATION.md)."""

_FALSE_SPELLINGS: Final = frozenset({"false", "0"})

RECONNECT_BACKOFF_MS: Final = 20
"""librdkafka ``reconnect.backoff.ms`` of every client made here (librdkafka's default is
100). librdkafka connects a new client to the brokers it learns from the bootstrap answer
only after its "sparse connect" interval, half this backoff: 50 ms by default, paid by every
client handle at start (a consumer's first metadata answer took 54 ms, 13 ms with 20).
Backoffs after a failure still double up to ``reconnect.backoff.max.ms``."""

CONSUMER_BOUNDS: Final[dict[str, Any]] = {
    "fetch.max.bytes": CONSUMER_FETCH_MAX_BYTES,
    "max.partition.fetch.bytes": CONSUMER_MAX_PARTITION_FETCH_BYTES,
    "receive.message.max.bytes": CONSUMER_RECEIVE_MESSAGE_MAX_BYTES,
}
"""librdkafka keys every consumer gets unless its caller sets them (why: `record_limits`)."""

PRODUCER_BOUNDS: Final[dict[str, Any]] = {
    "message.max.bytes": PRODUCER_MAX_MESSAGE_BYTES,
    "compression.type": PRODUCER_COMPRESSION,
}
"""librdkafka keys every producer gets unless its caller sets them (why: `record_limits`)."""


def client_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with ``allow.auto.create.topics=false``.

    Args:
        config: librdkafka settings (``bootstrap.servers`` at least).

    Returns:
        A new dict: the settings, with auto-creation off.

    Raises:
        ConfigurationError: ``config`` asks for auto-creation (the key set to anything but
            false): regionbus never relies on it, so the setting is a mistake.
    """
    asked = config.get(AUTO_CREATE_KEY, False)
    if str(asked).strip().lower() not in _FALSE_SPELLINGS:
        raise ConfigurationError(
            f"{AUTO_CREATE_KEY}={asked!r}: regionbus creates its topics itself and never "
            "lets a client auto-create one"
        )
    return {**config, AUTO_CREATE_KEY: False}


def factory_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """What the factories below hand to librdkafka: :func:`client_config`, with
    librdkafka's log going to Python ``logging`` unless ``config`` names its own logger
    (:func:`regionbus.schemas.kafka_outage.quiet_config`: one WARNING per unreachable broker, each
    reconnect attempt at DEBUG), so no client of the project writes librdkafka's lines
    to stderr.

    Kept apart from :func:`client_config`, whose result also feeds Spark's string-only
    ``kafka.*`` options, where a logger object has no place.

    The librdkafka ``reconnect.backoff.ms`` is :data:`RECONNECT_BACKOFF_MS` unless
    ``config`` sets it.

    Raises:
        ConfigurationError: as :func:`client_config`.
    """
    return {"reconnect.backoff.ms": RECONNECT_BACKOFF_MS, **quiet_config(), **client_config(config)}


def kafka_consumer(config: Mapping[str, Any]) -> GuardedConsumer:
    """A consumer with :func:`factory_config` and :data:`CONSUMER_BOUNDS` applied, which
    skips record batches librdkafka cannot read (`regionbus.schemas.record_guard`).

    Args:
        config: librdkafka settings; ``group.id`` is required by librdkafka even for
            consumers that only ``assign()``.

    Raises:
        ConfigurationError: as :func:`client_config`.
        confluent_kafka.KafkaException: librdkafka refused a setting (callers translate).
    """
    return GuardedConsumer(factory_config({**CONSUMER_BOUNDS, **config}))


def kafka_producer(config: Mapping[str, Any]) -> Producer:
    """A producer with :func:`factory_config` and :data:`PRODUCER_BOUNDS` applied
    (librdkafka's producer default is ``allow.auto.create.topics=true``, unlike its
    consumer's).

    Raises:
        ConfigurationError: as :func:`client_config`.
        confluent_kafka.KafkaException: librdkafka refused a setting (callers translate).
    """
    return Producer(factory_config({**PRODUCER_BOUNDS, **config}))


class KafkaAdmin(AdminClient):
    """An AdminClient that keeps the settings it was made with, so that another one, for
    one broker of the same cluster, can be made with the same security settings
    (:meth:`on_broker`).

    librdkafka sends a metadata request to whichever broker it is connected to, and each
    broker answers from its own metadata cache, which learns a new topic a moment after the
    controller created it. `regionbus.schemas.topics.ensure_topics` asks every broker
    through :meth:`on_broker`.

    Args:
        config: librdkafka settings (``bootstrap.servers`` at least); :func:`factory_config`
            is applied.

    Raises:
        ConfigurationError: as :func:`client_config`.
        confluent_kafka.KafkaException: librdkafka refused a setting (callers translate).
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(factory_config(config))
        self.settings: dict[str, Any] = dict(config)
        """The settings this client was made with, before :func:`factory_config`."""

    def on_broker(self, host: str, port: int) -> KafkaAdmin:
        """A new admin client bootstrapped from the one broker ``host:port`` only (the
        address the cluster's metadata advertises), with this one's other settings. Its
        first requests go to that broker, the only one it knows until metadata tells it of
        the others."""
        return KafkaAdmin({**self.settings, "bootstrap.servers": f"{host}:{port}"})


def kafka_admin(config: Mapping[str, Any]) -> KafkaAdmin:
    """An admin client with :func:`factory_config` applied (its metadata requests then
    never create a topic they name either), which keeps its settings (:class:`KafkaAdmin`).

    Raises:
        ConfigurationError: as :func:`client_config`.
        confluent_kafka.KafkaException: librdkafka refused a setting (callers translate).
    """
    return KafkaAdmin(config)


__all__ = [
    "AUTO_CREATE_KEY",
    "CONSUMER_BOUNDS",
    "PRODUCER_BOUNDS",
    "RECONNECT_BACKOFF_MS",
    "KafkaAdmin",
    "client_config",
    "factory_config",
    "kafka_admin",
    "kafka_consumer",
    "kafka_producer",
]
