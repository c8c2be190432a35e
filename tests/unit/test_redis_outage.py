"""Recognising a Redis outage and waiting for its end, without a Redis (a stub client)."""

from __future__ import annotations

import logging
import threading

import pytest
import redis

from regionbus.runtime.redis_connect import redis_errors
from regionbus.runtime.redis_outage import RedisOutage, is_redis_unavailable
from regionbus.schemas.errors import TransportError


def _translated(error: Exception) -> TransportError:
    with pytest.raises(TransportError) as caught, redis_errors():
        raise error
    return caught.value


def test_connection_timeout_and_loading_errors_are_an_outage_also_when_translated() -> None:
    for error in (
        redis.exceptions.ConnectionError("refused"),
        redis.exceptions.TimeoutError("timed out"),
        redis.exceptions.BusyLoadingError("LOADING"),
    ):
        assert is_redis_unavailable(error)
        assert is_redis_unavailable(_translated(error))


def test_a_refused_command_or_another_error_is_not_an_outage() -> None:
    assert not is_redis_unavailable(_translated(redis.exceptions.ResponseError("WRONGTYPE")))
    assert not is_redis_unavailable(TransportError("Kafka metadata: timed out"))
    assert not is_redis_unavailable(ValueError("bad"))
    assert not is_redis_unavailable(_translated(redis.exceptions.AuthenticationError("WRONGPASS")))


class _FlakyRedis:
    """Answers PING only after ``failures`` refused connections."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.pings = 0

    def ping(self) -> bool:
        self.pings += 1
        if self.pings <= self.failures:
            raise redis.exceptions.ConnectionError("Connection refused")
        return True


def test_an_outage_is_waited_out_with_one_warning_and_one_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = _FlakyRedis(failures=4)
    outage = RedisOutage(client, "s1", threading.Event(), max_retry_interval_ms=20)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="regionbus.redis"):
        for _ in range(3):
            outage.began(redis.exceptions.ConnectionError("refused"))
        assert outage.wait()
        down_s = outage.ended()
    assert client.pings == 5
    assert down_s > 0
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
    assert "Redis unavailable for s1" in caplog.records[0].getMessage()
    assert "Redis available again for s1" in caplog.records[1].getMessage()
    assert not outage.ongoing


def test_stopping_ends_the_wait_for_redis() -> None:
    stop = threading.Event()
    stop.set()
    outage = RedisOutage(_FlakyRedis(failures=10**9), "s1", stop)  # type: ignore[arg-type]
    outage.began(redis.exceptions.ConnectionError("refused"))
    assert not outage.wait()


def test_another_redis_error_while_waiting_is_raised() -> None:
    class Refusing:
        def ping(self) -> bool:
            raise redis.exceptions.AuthenticationError("invalid password")

    outage = RedisOutage(Refusing(), "s1", threading.Event())  # type: ignore[arg-type]
    with pytest.raises(redis.exceptions.AuthenticationError):
        outage.wait()
