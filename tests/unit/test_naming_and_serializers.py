"""Topic and key naming, the bucket function, value serializers, settings validation."""

from __future__ import annotations

import pytest

from regionbus.broker.config import ServerSettings
from regionbus.clients.settings import ClientSettings
from regionbus.schemas.errors import (
    CacheWriterError,
    ConfigurationError,
    InvalidInterestError,
    InvalidOperationError,
    SerializationError,
    ServerOperationError,
    error_from_wire,
)
from regionbus.schemas.interest_regex import compile_interest_regex
from regionbus.schemas.naming import QueueTopic, Topics, bucket_of, check_name, region_bucket
from regionbus.schemas.serializers import (
    AvroSerializer,
    BytesSerializer,
    JsonSerializer,
    StrSerializer,
    serializer_named,
)


def test_bucket_of_is_stable_across_processes_and_in_range() -> None:
    # CRC-32 values pinned: every process and Spark must agree on them
    assert bucket_of("flights", "UA-1545-EWR-2013-01-01", 16) == bucket_of(
        "flights", "UA-1545-EWR-2013-01-01", 16
    )
    assert [bucket_of("r", f"k{i}", 16) for i in range(5)] == [
        _crc_bucket("r", f"k{i}") for i in range(5)
    ]
    assert all(0 <= bucket_of("r", str(i), 7) < 7 for i in range(1000))
    assert 0 <= region_bucket("r", 16) < 16


def _crc_bucket(region: str, key: str) -> int:
    import zlib

    return zlib.crc32(f"{region}\x00{key}".encode()) % 16


def test_topic_names() -> None:
    topics = Topics("geode.site1")
    assert topics.ops == "geode.site1.ops"
    assert topics.queue("c-1") == "geode.site1.queue.c-1"
    assert topics.reply("c-1") == "geode.site1.reply.c-1"
    assert topics.dead_letter == "geode.site1.dead-letter"
    assert topics.gateway("ny") == "geode.site1.gw.ny"
    assert topics.async_event_queue("db") == "geode.site1.aeq.db"


def test_a_queue_topic_parses_back_into_its_kind_id_and_the_group_its_reader_acks_in() -> None:
    topics = Topics("geode.site1")
    assert topics.parse_queue(topics.queue("c.1")) == QueueTopic(
        "queue", "c.1", topics.client_group("c.1")
    )
    assert topics.parse_queue(topics.gateway("to-ny")) == QueueTopic(
        "gateway", "to-ny", topics.sender_group("to-ny")
    )
    assert topics.parse_queue(topics.async_event_queue("db")) == QueueTopic(
        "async-event-queue", "db", topics.dispatcher_group("db")
    )


@pytest.mark.parametrize(
    "topic",
    [
        "geode.site1.reply.c-1",
        "geode.site1.gwr.receiver",
        "geode.site1.events",
        "geode.site2.queue.c-1",
        "geode.site1.queue.",
        "geode.site1.gw." + "x" * 200,
    ],
)
def test_a_topic_that_is_no_queue_of_the_namespace_does_not_parse(topic: str) -> None:
    assert Topics("geode.site1").parse_queue(topic) is None


@pytest.mark.parametrize("bad", ["", "has space", "slash/no", "x" * 200, "ümlaut"])
def test_names_illegal_in_topics_are_refused(bad: str) -> None:
    with pytest.raises(ConfigurationError):
        check_name("client id", bad)


@pytest.mark.parametrize(
    ("serializer", "value"),
    [
        (JsonSerializer(), {"a": [1, 2.5, None, "x"]}),
        (StrSerializer(), "héllo"),
        (BytesSerializer(), b"\x00\xff"),
        (
            AvroSerializer(
                {"type": "record", "name": "Flight", "fields": [{"name": "n", "type": "int"}]}
            ),
            {"n": 7},
        ),
    ],
)
def test_serializers_round_trip_and_are_found_by_name(serializer, value) -> None:  # type: ignore[no-untyped-def]
    data = serializer.dumps(value)
    assert serializer.loads(data) == value
    assert serializer_named(serializer.name, {serializer.name: serializer}) is serializer


def test_serializers_raise_typed_errors() -> None:
    with pytest.raises(SerializationError):
        JsonSerializer().dumps(float("nan"))
    with pytest.raises(SerializationError):
        JsonSerializer().loads(b"{")
    with pytest.raises(SerializationError):
        StrSerializer().dumps(1)
    with pytest.raises(SerializationError):
        serializer_named("pickle")


def test_invalid_interest_regex_is_a_typed_error() -> None:
    with pytest.raises(InvalidInterestError, match="invalid interest regex"):
        compile_interest_regex("(")
    assert compile_interest_regex("UA-.*").fullmatch("UA-1-EWR") is not None


def test_settings_are_validated_at_start() -> None:
    with pytest.raises(ConfigurationError):
        ServerSettings(namespace="bad name")
    with pytest.raises(ConfigurationError):
        ClientSettings(client_id="no/slash")
    assert ServerSettings(namespace="ok").message_sync_interval_s == 1.0  # Geode default
    assert ClientSettings().subscription_ack_interval_ms == 100  # Geode default
    assert ClientSettings().subscription_message_tracking_timeout_s == 900  # Geode default


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGIONBUS_NAMESPACE", "from-env")
    monkeypatch.setenv("REGIONBUS_TOTAL_BUCKETS", "8")
    settings = ServerSettings()
    assert (settings.namespace, settings.total_buckets) == ("from-env", 8)


def test_server_errors_map_back_to_their_classes() -> None:
    assert isinstance(error_from_wire("CacheWriterError", "no"), CacheWriterError)
    # a malformed operation's refusal reaches the client as what it is
    assert type(error_from_wire("InvalidOperationError", "no key")) is InvalidOperationError
    unknown = error_from_wire("SomethingNew", "boom")
    assert isinstance(unknown, ServerOperationError) and "boom" in str(unknown)
