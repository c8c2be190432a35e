"""Geode's conditional operations (``putIfAbsent``, ``create``, ``replace``, ``remove(k,
v)``) and the server reads (``getAll``, ``containsKeyOnServer``, ``sizeOnServer``), end to
end against a real Kafka and Redis: what each answers, what it changes, and that it sends
an event only when it changes something."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from support import (
    Recorder,
    Sentinel,
    entry_operation,
    send_raw_operation,
    wait_until,
    writer_and_subscriber,
)

from regionbus import EntryExistsError
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, ClientRegionShortcut
from regionbus.schemas.messages import OperationKind
from regionbus.schemas.naming import bucket_of


@pytest.fixture
def pair(cache_server: CacheServer, client_factory: Any) -> tuple[Any, Any, Recorder]:
    """A writer client and a subscriber client (ALL_KEYS, values) on region ``r``."""
    return writer_and_subscriber(client_factory)


def _stored(server: CacheServer, key: str) -> Any:
    entry = server.store.entries("r").get(key)
    return "absent" if entry is None else entry.value


def _invalidate_on_server(server: CacheServer, kafka: str, namespace: str, key: str) -> None:
    """Invalidate an entry on the server, as a server-side application does (a client's
    invalidate is local only, docs/behaviour.md §1)."""
    global _SEQUENCE
    _SEQUENCE += 1
    op, bucket = entry_operation("app", OperationKind.INVALIDATE, key, _SEQUENCE)
    send_raw_operation(kafka, namespace, op, bucket)
    wait_until(lambda: _stored(server, key) is None, what=f"{key} invalid on the server")


_SEQUENCE = 0


@pytest.mark.redis_modes
def test_put_if_absent_creates_once_and_answers_what_is_there(
    pair: Any, cache_server: CacheServer, kafka_bootstrap_servers: str, namespace: str
) -> None:
    writer, _, recorder = pair
    assert writer.put_if_absent("a", {"n": 1}) is None
    assert writer.put_if_absent("a", {"n": 2}) == {"n": 1}
    assert _stored(cache_server, "a") == b'{"n":1}'
    writer.put("i", 1)
    _invalidate_on_server(cache_server, kafka_bootstrap_servers, namespace, "i")
    # Geode: an invalid entry is present (RegionMapPut's create precondition): nothing
    # changes, and the answer is null.
    assert writer.put_if_absent("i", 5) is None
    assert _stored(cache_server, "i") is None
    assert Sentinel(writer, recorder).fence() == [
        ("create", "a", {"n": 1}),
        ("create", "i", 1),
        ("invalidate", "i", None),
    ]
    assert writer.local_entries()["a"] == {"n": 1}


def test_create_makes_a_new_entry_and_refuses_one_that_exists(
    pair: Any, cache_server: CacheServer, kafka_bootstrap_servers: str, namespace: str
) -> None:
    writer, _, recorder = pair
    writer.create("c", {"n": 1})
    with pytest.raises(EntryExistsError) as exists:
        writer.create("c", {"n": 2})
    assert exists.value.old_value == {"n": 1}
    assert _stored(cache_server, "c") == b'{"n":1}'
    writer.put("i", 1)
    _invalidate_on_server(cache_server, kafka_bootstrap_servers, namespace, "i")
    # Geode: an invalid entry exists (EntryExistsException), and nothing changes.
    with pytest.raises(EntryExistsError) as invalid:
        writer.create("i", 5)
    assert invalid.value.old_value is None
    assert _stored(cache_server, "i") is None
    assert Sentinel(writer, recorder).fence() == [
        ("create", "c", {"n": 1}),
        ("create", "i", 1),
        ("invalidate", "i", None),
    ]
    assert writer.local_entries()["c"] == {"n": 1}


@pytest.mark.redis_modes
def test_replace_updates_only_what_exists_or_holds_the_expected_value(
    pair: Any, cache_server: CacheServer
) -> None:
    writer, reader, recorder = pair
    assert writer.replace("missing", 1) is None
    assert _stored(cache_server, "missing") == "absent"
    writer.put("b", [1])
    assert writer.replace("b", [2]) == [1]
    assert writer.replace("b", [1], [3]) is False
    assert writer.replace("b", [2], [3]) is True
    assert _stored(cache_server, "b") == b"[3]"
    assert Sentinel(writer, recorder).fence() == [
        ("create", "b", [1]),
        ("update", "b", [2]),
        ("update", "b", [3]),
    ]
    assert writer.local_entries()["b"] == [3]
    assert reader.local_entries()["b"] == [3]


@pytest.mark.redis_modes
def test_remove_destroys_only_an_entry_holding_the_value(
    pair: Any, cache_server: CacheServer, kafka_bootstrap_servers: str, namespace: str
) -> None:
    writer, _, recorder = pair
    assert writer.remove("c", 1) is False
    writer.put("c", 1)
    assert writer.remove("c", 2) is False
    assert writer.remove("c", None) is False
    assert writer.remove("c", 1) is True
    assert _stored(cache_server, "c") == "absent"
    writer.put("v", "x")
    _invalidate_on_server(cache_server, kafka_bootstrap_servers, namespace, "v")
    # Geode: remove(k, null) removes an invalid entry (null stands for Token.INVALID).
    assert writer.remove("v", "x") is False
    assert writer.remove("v", None) is True
    assert _stored(cache_server, "v") == "absent"
    assert Sentinel(writer, recorder).fence() == [
        ("create", "c", 1),
        ("destroy", "c", None),
        ("create", "v", "x"),
        ("invalidate", "v", None),
        ("destroy", "v", None),
    ]
    assert not writer.contains_key("c")


@pytest.mark.redis_modes
def test_get_all_contains_key_and_size_read_the_server(
    cache_server: CacheServer, client_factory: Any, kafka_bootstrap_servers: str, namespace: str
) -> None:
    writer = client_factory().create_region("r")
    writer.put_all({f"k{i}": i for i in range(30)})
    _invalidate_on_server(cache_server, kafka_bootstrap_servers, namespace, "k3")
    reader = client_factory().create_region("r")
    assert reader.size_on_server() == 30
    assert reader.contains_key_on_server("k3") is True
    assert reader.contains_key_on_server("nope") is False
    asked = ["k1", "k3", "nope", "k29", "k1"]
    assert reader.get_all(asked) == {"k1": 1, "k3": None, "nope": None, "k29": 29}
    # The values fetched are kept locally, as get keeps them.
    assert reader.local_entries() == {"k1": 1, "k29": 29}
    writer.destroy("k1")
    assert reader.size_on_server() == 29


def test_two_clients_racing_on_put_if_absent_one_wins_each_key(
    cache_server: CacheServer, client_factory: Any
) -> None:
    rounds = 1000
    racers = [client_factory().create_region("r") for _ in range(2)]
    recorder = Recorder()
    watcher = client_factory().create_region("r", listeners=[recorder])
    watcher.register_interest(ALL_KEYS)
    answers: list[list[Any]] = [[], []]
    start = threading.Barrier(2)

    def race(index: int) -> None:
        for i in range(rounds):
            start.wait(30)
            answers[index].append(racers[index].put_if_absent(f"race-{i}", f"racer-{index}"))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert all(len(a) == rounds for a in answers)
    stored = cache_server.store.entries("r")
    for i in range(rounds):
        first, second = answers[0][i], answers[1][i]
        # Exactly one got None (it created the entry); the other got the winner's value.
        assert (first is None) != (second is None), (i, first, second)
        winner = "racer-0" if first is None else "racer-1"
        assert (second if first is None else first) == winner
        assert stored[f"race-{i}"].value == f'"{winner}"'.encode()
    wait_until(lambda: len(recorder.snapshot()) >= rounds, timeout_s=120, what="every create")
    calls = Sentinel(racers[0], recorder).fence()
    assert sorted(c[1] for c in calls) == sorted(f"race-{i}" for i in range(rounds))
    assert {c[0] for c in calls} == {"create"}


def test_a_put_if_absent_that_changed_nothing_is_a_duplicate_when_read_again(
    cache_server: CacheServer, client_factory: Any, kafka_bootstrap_servers: str, namespace: str
) -> None:
    # A bucket's operations are read again from its committed offset after a failover: a
    # conditional operation that changed nothing must change nothing then either, though
    # the entry it found may be gone by then.
    writer = client_factory().create_region("r")
    writer.put("x", "first")
    op, bucket = entry_operation(
        "app", OperationKind.PUT_IF_ABSENT, "x", 1, value=b'"second"', request_id=7
    )
    send_raw_operation(kafka_bootstrap_servers, namespace, op, bucket)
    wait_until(lambda: _processed(cache_server, op.event_id), what="the put-if-absent processed")
    assert _stored(cache_server, "x") == b'"first"'
    writer.destroy("x")
    send_raw_operation(kafka_bootstrap_servers, namespace, op, bucket)
    # An operation after it in the same bucket: once applied, the copy was processed.
    later_key = next(
        k for k in (f"later-{i}" for i in range(10_000)) if bucket_of("r", k, 16) == bucket
    )
    later, _ = entry_operation("app", OperationKind.PUT, later_key, 2, value=b"1")
    send_raw_operation(kafka_bootstrap_servers, namespace, later, bucket)
    wait_until(lambda: _stored(cache_server, later_key) == b"1", what="the later put applied")
    assert _stored(cache_server, "x") == "absent"


def _processed(server: CacheServer, event_id: Any) -> bool:
    """Whether the bucket recorded the EventID (its thread's last sequence id)."""
    keys = server.store.keys
    field = f"{event_id.member}:{event_id.thread}"
    last = server.store.redis.hget(keys.tracking(event_id.bucket), field)
    return last is not None and int(last) >= event_id.sequence


def test_a_region_reads_as_a_python_mapping(cache_server: CacheServer, client_factory: Any) -> None:
    with client_factory() as writer_cache:
        flights = writer_cache.create_region("r", ClientRegionShortcut.CACHING_PROXY)
        flights["UA-1"] = {"delay": 3}
        assert _stored(cache_server, "UA-1") == b'{"delay":3}'
        assert "UA-1" in flights and 42 not in flights and len(flights) == 1
        other = client_factory().create_region("r", ClientRegionShortcut.PROXY)
        assert "UA-1" not in other  # local only, as Geode's containsKey
        assert other["UA-1"] == {"delay": 3}  # a miss goes to the server
        with pytest.raises(KeyError):
            other["nope"]
        del other["UA-1"]
        assert _stored(cache_server, "UA-1") == "absent"
        with pytest.raises(KeyError):
            del other["UA-1"]
    assert writer_cache.closed
