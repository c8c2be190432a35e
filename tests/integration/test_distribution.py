"""docs/behaviour.md §1 (client -> server forwarding) and §3 (server -> client distribution), end to
end against a real Kafka and Redis."""

from __future__ import annotations

import pytest
from support import (
    Recorder,
    Sentinel,
    entry_operation,
    send_raw_operation,
    wait_until,
    writer_and_subscriber,
)

from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, RegionShortcut
from regionbus.schemas.errors import EntryNotFoundError, RegionNotFoundError
from regionbus.schemas.messages import OperationKind

pytestmark = pytest.mark.redis_modes


@pytest.fixture
def pair(cache_server: CacheServer, client_factory):  # type: ignore[no-untyped-def]
    """A writer client and a subscriber client (ALL_KEYS, values) on region ``r``."""
    return writer_and_subscriber(client_factory)


def test_client_create_and_update_are_applied_on_the_server_and_pushed(pair, cache_server) -> None:  # type: ignore[no-untyped-def]
    writer, reader, recorder = pair
    writer.put("a", 1)
    writer.put("a", 2)
    entries = cache_server.store.entries("r")
    assert entries["a"].value == b"2"
    fence = Sentinel(writer, recorder).fence()
    assert fence == [("create", "a", 1), ("update", "a", 2)]
    assert reader.local_entries()["a"] == 2


def test_destroy_is_forwarded_even_when_the_key_is_not_in_the_client_cache(
    pair, cache_server, client_factory
) -> None:  # type: ignore[no-untyped-def]
    writer, reader, recorder = pair
    writer.put("gone", "x")
    third = client_factory().create_region("r")
    assert not third.contains_key("gone")
    third.destroy("gone")
    assert "gone" not in cache_server.store.entries("r")
    assert Sentinel(writer, recorder).fence() == [
        ("create", "gone", "x"),
        ("destroy", "gone", None),
    ]
    assert not reader.contains_key("gone")
    with pytest.raises(EntryNotFoundError):
        third.destroy("gone")


def test_client_invalidate_is_local_only(pair, cache_server) -> None:  # type: ignore[no-untyped-def]
    writer, reader, recorder = pair
    writer.put("k", "v")
    writer.invalidate("k")
    assert writer.contains_key("k") and not writer.contains_value_for_key("k")
    assert cache_server.store.entries("r")["k"].value == b'"v"'
    assert Sentinel(writer, recorder).fence() == [("create", "k", "v")]
    assert reader.local_entries()["k"] == "v"
    assert writer.get("k") == "v"  # the next get after an invalidate goes to the server


def test_clear_is_forwarded_and_pushed_to_every_client_with_interest(
    pair, cache_server, client_factory
) -> None:  # type: ignore[no-untyped-def]
    writer, reader, recorder = pair
    key_recorder = Recorder()
    key_client = client_factory().create_region("r", listeners=[key_recorder])
    key_client.register_interest(["only-this-key"])
    writer.put_all({"a": 1, "b": 2})
    writer.clear()
    assert cache_server.store.entries("r") == {}
    assert writer.keys() == []
    wait_until(lambda: ("region_clear", "r", None) in recorder.snapshot(), what="reader clear")
    wait_until(
        lambda: ("region_clear", "r", None) in key_recorder.snapshot(), what="key client clear"
    )
    assert reader.keys() == []


def test_destroy_region_is_forwarded_and_destroys_the_region_at_interested_clients(
    pair, cache_server
) -> None:  # type: ignore[no-untyped-def]
    writer, reader, recorder = pair
    writer.put("a", 1)
    writer.destroy_region()
    assert "r" not in cache_server.store.region_names()
    wait_until(lambda: ("region_destroy", "r", None) in recorder.snapshot(), what="region destroy")
    with pytest.raises(RegionNotFoundError):
        reader.put("a", 2)
    with pytest.raises(RegionNotFoundError):
        writer.get("a")


def test_the_originator_gets_no_event_for_its_own_change(cache_server, client_factory) -> None:  # type: ignore[no-untyped-def]
    own = Recorder()
    cache = client_factory()
    region = cache.create_region("r", listeners=[own])
    region.register_interest(ALL_KEYS)
    other_recorder = Recorder()
    other = client_factory().create_region("r", listeners=[other_recorder])
    other.register_interest(ALL_KEYS)
    region.put("mine", 1)  # fires the local listener once (a local event)
    assert own.snapshot() == [("create", "mine", 1)]
    assert own.events[0].origin_remote is False
    own.clear()
    other_sentinel = Sentinel(other, own, key="from-other")
    assert other_sentinel.fence() == []
    assert cache.subscription_stats.events_received == 1  # only the sentinel came by the queue


def _server_invalidate(kafka: str, namespace: str, key: str, seq: int) -> None:
    op, bucket = entry_operation("server-app", OperationKind.INVALIDATE, key, seq)
    send_raw_operation(kafka, namespace, op, bucket)


@pytest.mark.parametrize("receive_values", [True, False])
def test_server_changes_reach_the_client_per_the_spec_table(
    receive_values: bool, cache_server, client_factory, kafka_bootstrap_servers, namespace
) -> None:  # type: ignore[no-untyped-def]
    writer = client_factory().create_region("r")
    recorder = Recorder()
    reader = client_factory().create_region("r", listeners=[recorder])
    reader.register_interest(ALL_KEYS, receive_values=receive_values)
    reader.register_interest(["sentinel"])  # the union: values for the sentinel key
    fence = Sentinel(writer, recorder)
    # entry create / update of a key the client does not hold
    writer.put("new", 1)
    writer.put("new", 2)
    before = fence.fence()
    if receive_values:
        assert before == [("create", "new", 1), ("update", "new", 2)]
        assert reader.local_entries()["new"] == 2
    else:
        assert before == []  # invalidate if the client holds the key, else nothing
        assert not reader.contains_key("new")
    # entry update of a key the client holds
    assert reader.get("new") == 2
    recorder.clear()
    writer.put("new", 3)
    before = fence.fence()
    if receive_values:
        assert before == [("update", "new", 3)]
        assert reader.local_entries()["new"] == 3
    else:
        assert before == [("invalidate", "new", None)]
        assert reader.contains_key("new") and not reader.contains_value_for_key("new")
        assert reader.get("new") == 3  # the next get goes to the server
        recorder.clear()
    # entry invalidate (distributed, from a server-side application) and destroy
    _server_invalidate(kafka_bootstrap_servers, namespace, "new", seq=0)
    wait_until(
        lambda: cache_server.store.entries("r")["new"].value is None, what="server invalidate"
    )
    assert fence.fence() == [("invalidate", "new", None)]
    assert not reader.contains_value_for_key("new")
    writer.destroy("new")
    assert fence.fence() == [("destroy", "new", None)]
    assert not reader.contains_key("new")
    # region clear: to every client with interest, values or not
    writer.put("x", 1)
    fence.fence()
    writer.clear()
    wait_until(lambda: ("region_clear", "r", None) in recorder.snapshot(), what="region clear")
    assert reader.keys() == []


def test_proxy_region_keeps_nothing_and_reads_from_the_server(cache_server, client_factory) -> None:  # type: ignore[no-untyped-def]
    cache = client_factory()
    proxy = cache.create_region("r", RegionShortcut.PROXY)
    proxy.put("p", {"a": 1})
    assert proxy.keys() == []
    assert proxy.get("p") == {"a": 1}
    assert proxy.get("missing") is None
    assert sorted(proxy.keys_on_server()) == ["p"]


def test_put_all_and_remove_all(pair, cache_server) -> None:  # type: ignore[no-untyped-def]
    writer, reader, recorder = pair
    writer.put_all({f"k{i}": i for i in range(50)})
    assert len(cache_server.store.entries("r")) == 50
    assert sorted(writer.keys_on_server()) == sorted(f"k{i}" for i in range(50))
    writer.remove_all([f"k{i}" for i in range(0, 50, 2)] + ["never-existed"])
    assert sorted(cache_server.store.entries("r")) == sorted(f"k{i}" for i in range(1, 50, 2))
    before = Sentinel(writer, recorder).fence()
    assert len([c for c in before if c[0] == "create"]) == 50
    assert len([c for c in before if c[0] == "destroy"]) == 25
    assert sorted(k for k in reader.keys() if k != "sentinel") == sorted(
        f"k{i}" for i in range(1, 50, 2)
    )


def test_operations_on_an_undefined_region_raise(cache_server, client_factory) -> None:  # type: ignore[no-untyped-def]
    region = client_factory().create_region("nowhere")
    with pytest.raises(RegionNotFoundError):
        region.put("a", 1)
    with pytest.raises(RegionNotFoundError):
        region.get("a")
    with pytest.raises(RegionNotFoundError):
        region.register_interest(ALL_KEYS)


def test_local_destroy_and_local_clear_change_only_this_client(pair, cache_server) -> None:  # type: ignore[no-untyped-def]
    writer, reader, recorder = pair
    writer.put_all({"a": 1, "b": 2})
    Sentinel(writer, recorder).fence()
    reader.local_destroy("a")
    assert recorder.snapshot() == [("destroy", "a", None)]
    assert not reader.contains_key("a")
    with pytest.raises(EntryNotFoundError):
        reader.local_destroy("a")
    reader.local_clear()
    assert reader.keys() == []
    assert recorder.snapshot()[-1] == ("region_clear", "r", None)
    assert set(cache_server.store.entries("r")) == {"a", "b", "sentinel"}
    assert reader.get("a") == 1  # still on the server
