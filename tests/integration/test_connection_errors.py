"""A wrong Kafka address or namespace fails within ``read_timeout_ms``, saying what was tried
and how to fix it, and librdkafka's reconnect attempts are one WARNING, not a flood."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import pytest

from regionbus.clients import ClientCache
from regionbus.schemas.errors import TransportError
from regionbus.schemas.kafka_outage import UNREACHABLE_BROKERS

READ_TIMEOUT_MS = 2_000
SLACK_S = 3.0
"""Beyond ``read_timeout_ms``: making and closing the client's admin handle, on a slow
machine. The old behaviour (a fixed 30 s metadata wait) is far outside it."""


@pytest.fixture
def refusing_address() -> Iterator[str]:
    """A loopback address that refuses connections: bound (so no one else takes it) but
    not listening, for the whole test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{bound.getsockname()[1]}"


def test_an_unreachable_broker_fails_within_read_timeout_naming_the_address(
    refusing_address: str,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    UNREACHABLE_BROKERS.clear()
    began = time.monotonic()
    with caplog.at_level(logging.INFO), pytest.raises(TransportError) as raised:
        ClientCache(
            namespace="nowhere",
            kafka_bootstrap_servers=refusing_address,
            read_timeout_ms=READ_TIMEOUT_MS,
        )
    took_s = time.monotonic() - began

    assert took_s < READ_TIMEOUT_MS / 1000 + SLACK_S, f"took {took_s:.1f} s"
    message = str(raised.value)
    assert f"Kafka at {refusing_address} did not answer within {READ_TIMEOUT_MS} ms" in message
    assert "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS" in message
    assert "regionbus stack" in message
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([w for w in warnings if refusing_address in w]) == 1, warnings
    assert f"Kafka broker {refusing_address} unreachable" in warnings[0]
    assert refusing_address not in capfd.readouterr().err, "librdkafka wrote to stderr"


def test_a_namespace_without_servers_fails_within_read_timeout_naming_it(
    namespace: str, kafka_bootstrap_servers: str
) -> None:
    began = time.monotonic()
    with pytest.raises(TransportError) as raised:
        ClientCache(
            namespace=namespace,
            kafka_bootstrap_servers=kafka_bootstrap_servers,
            read_timeout_ms=READ_TIMEOUT_MS,
        )
    took_s = time.monotonic() - began

    assert took_s < READ_TIMEOUT_MS / 1000 + SLACK_S, f"took {took_s:.1f} s"
    message = str(raised.value)
    assert f"no cache server of namespace {namespace!r}" in message
    assert f"on Kafka at {kafka_bootstrap_servers}" in message
    assert f"`regionbus serve --namespace {namespace}`" in message
    assert "REGIONBUS_NAMESPACE" in message
