"""A hostile or careless client cannot stop a cache server (invariant 6).

- A poison-pill interest regex (500 nested groups: Python's ``re`` raised ``RecursionError``
  compiling it) produced straight to ``{ns}.ops`` is dead-lettered with its reason; the
  server goes on and other clients' puts are answered.
- Any unexpected exception while one operation is handled (here a ``RecursionError``
  injected into the PUT handler) dead-letters that operation, replies an error to its
  sender, and the server goes on.
- A catastrophic-backtracking regex (``(a+)+$``) with a key of ``a``s that fails to match
  does not stall the server: another client's put on another region answers in its normal
  time. With Python's ``re`` the server's one thread (and the GIL) stalled for seconds.

The tests only use names that exist before the fix, so they can be run against the old code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import TopicPartition
from support import wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.schemas.codec import encode
from regionbus.schemas.errors import InvalidInterestError, ServerOperationError
from regionbus.schemas.kafka_clients import kafka_consumer, kafka_producer
from regionbus.schemas.messages import InterestKind, InterestSpec, Operation, OperationKind
from regionbus.schemas.naming import Topics

POISON_REGEX = "(" * 500 + "a" + ")" * 500
BACKTRACKING_REGEX = "(a+)+$"
BACKTRACKING_KEY = "a" * 28 + "!"
"""29 characters: with Python's ``re``, ``(a+)+$`` tries about 2**28 ways to fail on it
(about 15 s here)."""

NORMAL_PUT_BOUND_S = 3.0
"""Longest a put on an idle server may take while another region's event is routed
(a put takes a few ms; the bound leaves room for a loaded machine)."""


@pytest.fixture
def two_region_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    server = CacheServer(server_settings.model_copy(update={"regions": ["r", "s"]}))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _dead_letter_reasons(kafka: str, namespace: str, at_least: int) -> list[str]:
    """The ``rb.reason`` of the first ``at_least`` records of ``{ns}.dead-letter``."""
    consumer = kafka_consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": f"hostile-check-{time.monotonic_ns()}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(f"{namespace}.dead-letter", 0, 0)])
    reasons: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while len(reasons) < at_least and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            headers = dict(message.headers() or [])
            reason = headers.get("rb.reason") or b""
            reasons.append(reason.decode() if isinstance(reason, bytes) else str(reason))
    finally:
        consumer.close()
    return reasons


def _timed_put(cache: object, region: str, key: str) -> float:
    started = time.monotonic()
    cache.get_region(region).put(key, 1)  # type: ignore[attr-defined]
    return time.monotonic() - started


def test_poison_pill_regex_on_ops_is_dead_lettered_and_the_server_goes_on(
    two_region_server: CacheServer,
    client_factory,
    namespace: str,
    kafka_bootstrap_servers: str,
) -> None:
    bystander = client_factory()
    bystander.create_region("s")
    bystander.get_region("s").put("before", 1)

    poison = Operation(
        request_id=1,
        client_id="intruder",
        kind=OperationKind.REGISTER_INTEREST,
        region="r",
        timestamp_ms=int(time.time() * 1000),
        interest=InterestSpec(InterestKind.REGEX, (), POISON_REGEX),
    )
    producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers})
    producer.produce(Topics(namespace).ops, encode(poison), partition=3)
    producer.flush(10)

    reasons = _dead_letter_reasons(kafka_bootstrap_servers, namespace, at_least=1)
    assert reasons, "the poison-pill registration was not dead-lettered"
    assert "interest regex" in reasons[0]
    assert two_region_server.alive, f"server died: {two_region_server.failure}"
    assert _timed_put(bystander, "s", "after") < NORMAL_PUT_BOUND_S
    assert bystander.get_region("s").get("after") == 1


def test_client_refuses_the_poison_pill_regex_before_sending(
    two_region_server: CacheServer, client_factory
) -> None:
    cache = client_factory()
    region = cache.create_region("r")
    with pytest.raises(InvalidInterestError, match="interest regex"):
        region.register_interest_regex(POISON_REGEX)
    assert region.interest == []


def test_unexpected_error_in_a_handler_dead_letters_the_operation_and_the_server_goes_on(
    two_region_server: CacheServer,
    client_factory,
    namespace: str,
    kafka_bootstrap_servers: str,
) -> None:
    # A bug that one rare input reaches, injected into the PUT handler: the kind of error
    # (RecursionError) the poison-pill regex raised before regexes ran on RE2.
    parts = two_region_server._parts
    assert parts is not None
    put_handler = parts.handlers.table[OperationKind.PUT]

    def buggy_put(op: Operation, bucket: int, offset: int) -> None:
        if op.key == "boom":
            raise RecursionError("maximum recursion depth exceeded")
        put_handler(op, bucket, offset)

    parts.handlers.table[OperationKind.PUT] = buggy_put
    cache = client_factory()
    region = cache.create_region("r")
    other = cache.create_region("s")
    region.put("fine", 1)
    with pytest.raises(ServerOperationError, match="RecursionError"):
        region.put("boom", 1)
    reasons = _dead_letter_reasons(kafka_bootstrap_servers, namespace, at_least=1)
    assert any("RecursionError" in reason for reason in reasons), reasons
    assert two_region_server.alive, f"server died: {two_region_server.failure}"
    assert two_region_server.stats.dead_letters_by_category.get("processing_failed") == 1
    region.put("fine-again", 2)
    assert _timed_put(cache, "s", "other") < NORMAL_PUT_BOUND_S
    assert other.get("other") == 1
    assert region.get("boom") is None


def test_backtracking_regex_does_not_stall_other_clients(
    two_region_server: CacheServer, client_factory
) -> None:
    subscriber = client_factory()
    watched = subscriber.create_region("r")
    watched.register_interest_regex(BACKTRACKING_REGEX)

    bystander = client_factory()
    bystander.create_region("s")
    baseline_s = min(_timed_put(bystander, "s", f"warm-{i}") for i in range(3))

    writer = client_factory()
    writer.create_region("r").put_async(BACKTRACKING_KEY, 1)
    writer.get_region("r").put_async("a" * 40, 2)
    # The events of the hostile keys are routed now; a stalled server answers nothing.
    latencies = [_timed_put(bystander, "s", f"during-{i}") for i in range(5)]
    print(
        f"bystander put: baseline {baseline_s * 1000:.1f} ms, worst while routing "
        f"the hostile keys {max(latencies) * 1000:.1f} ms"
    )
    bound_s = max(NORMAL_PUT_BOUND_S, 10 * baseline_s)
    assert max(latencies) < bound_s, f"puts took {latencies} s (baseline {baseline_s:.3f} s)"
    wait_until(lambda: watched.contains_key("a" * 40), what="the matching key's event")
    assert not watched.contains_key(BACKTRACKING_KEY)
    assert two_region_server.alive


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda r: r.put("k" * 1_000_000, 1), "InvalidKeyError"),
        (lambda r: r.put("\ud800", 1), "InvalidKeyError"),
        (lambda r: r.put(42, 1), "InvalidKeyError"),
        (lambda r: r.get(None), "InvalidKeyError"),
        (lambda r: r.destroy(7), "InvalidKeyError"),
        (lambda r: r.put("k", "v" * 1_000_000), "ValueTooLargeError"),
    ],
)
def test_bad_arguments_raise_typed_errors_before_anything_is_sent(
    cache_server: CacheServer, client_factory, call, error: str
) -> None:
    from regionbus.schemas.errors import RegionBusError

    region = client_factory().create_region("r")
    region.put("before", 1)
    applied = cache_server.stats.operations_applied
    with pytest.raises(RegionBusError) as raised:
        call(region)
    assert type(raised.value).__name__ == error
    region.put("after", 1)
    assert cache_server.stats.operations_applied == applied + 1


@pytest.mark.parametrize("name", ["", "a b", "*", "r" * 5_000])
def test_bad_region_names_are_refused_by_the_client(
    cache_server: CacheServer, client_factory, name: str
) -> None:
    from regionbus.schemas.errors import RegionBusError

    cache = client_factory()
    with pytest.raises(RegionBusError) as raised:
        cache.create_region(name)
    assert type(raised.value).__name__ == "InvalidRegionNameError"
    assert cache.get_region(name) is None
