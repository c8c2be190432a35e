"""Geode's client event rules that the cache's contents decide: when an invalidate fires
``after_invalidate`` (docs/behaviour.md §3) and which kind a durable client's replayed event has
(docs/behaviour.md §5), against a real Kafka and Redis."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from support import Recorder, Sentinel, wait_until

from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS


def test_receive_values_false_invalidates_a_held_entry_once_not_on_every_later_put(
    cache_server: CacheServer, client_factory: Callable[..., Any]
) -> None:
    """Geode ``AbstractRegionMap.invalidate``: ``afterInvalidate`` fires only when the local
    entry exists and is valid; a put of an entry that is already invalid here fires nothing."""
    writer = client_factory().create_region("r")
    recorder = Recorder()
    reader = client_factory().create_region("r", listeners=[recorder])
    reader.register_interest(ALL_KEYS, receive_values=False)
    reader.register_interest(["sentinel"])
    fence = Sentinel(writer, recorder)
    writer.put("k", 1)
    assert reader.get("k") == 1
    recorder.clear()
    writer.put("k", 2)
    writer.put("k", 3)
    writer.put("k", 4)
    assert fence.fence() == [("invalidate", "k", None)]
    assert reader.contains_key("k") and not reader.contains_value_for_key("k")
    assert reader.get("k") == 4  # valid again: the next put invalidates it again
    recorder.clear()
    writer.put("k", 5)
    assert fence.fence() == [("invalidate", "k", None)]


def test_a_replayed_create_reaches_listeners_as_a_create_without_old_value_although_interest_loaded_the_key(  # noqa: E501
    cache_server: CacheServer, client_factory: Callable[..., Any]
) -> None:
    """Geode ``LocalRegion.basicBridgeClientUpdate`` before the marker: only the put
    callbacks run, ``isCreate ? AFTER_CREATE : AFTER_UPDATE`` from the server's message,
    and the region map is not read, so the event has no old value."""
    first = client_factory(durable_client_id="desk")
    first.create_region("r").register_interest(["a"], durable=True)
    first.ready_for_events()
    first.close(keep_alive=True)
    writer = client_factory().create_region("r")
    writer.put("a", 1)
    writer.put("a", 2)

    recorder = Recorder()
    second = client_factory(durable_client_id="desk")
    region = second.create_region("r", listeners=[recorder])
    region.register_interest(["a"], durable=True)  # loads a=2 before the replay
    assert region.local_entries() == {"a": 2}
    second.ready_for_events()
    wait_until(lambda: ("region_live", "r", None) in recorder.snapshot(), what="the marker")
    assert recorder.snapshot() == [
        ("create", "a", 1),
        ("update", "a", 2),
        ("region_live", "r", None),
    ]
    assert [getattr(e, "old_value", None) for e in recorder.events[:2]] == [None, None]
    assert region.local_entries() == {"a": 2}


class _RegionRecorder(Recorder):
    def after_region_invalidate(self, event: Any) -> None:
        self._add("region_invalidate", event.region, None, event)


def test_a_region_invalidate_drops_every_value_on_the_server_and_pushes_no_client_event(
    server_settings: Any, client_factory: Callable[..., Any]
) -> None:
    """docs/behaviour.md §3; Geode documentation, *How Client/Server Distribution Works*: "Region
    invalidation in the server is not forwarded to the client"."""
    server_listener = _RegionRecorder()
    with CacheServer(server_settings, listeners={"r": [server_listener]}) as server:
        writer_listener = _RegionRecorder()
        writer = client_factory().create_region("r", listeners=[writer_listener])
        recorder = _RegionRecorder()
        reader = client_factory().create_region("r", listeners=[recorder])
        reader.register_interest(ALL_KEYS)
        fence = Sentinel(writer, recorder)
        writer.put_all({"a": 1, "b": 2})
        # Two keys, two buckets: their events come in either order.
        assert sorted(fence.fence()) == [("create", "a", 1), ("create", "b", 2)]
        writer_listener.clear()

        writer.invalidate_region()
        entries = server.store.entries("r")
        assert {k: e.value for k, e in entries.items() if k != "sentinel"} == {
            "a": None,
            "b": None,
        }
        assert writer_listener.snapshot() == [("region_invalidate", "r", None)]
        assert writer.local_entries()["a"] is None and writer.contains_key("b")
        wait_until(
            lambda: ("region_invalidate", "r", None) in server_listener.snapshot(),
            what="the server listener",
        )
        assert fence.fence() == [], "a client got an event for the region invalidate"
        assert reader.local_entries()["a"] == 1  # not forwarded: the client keeps its copy
        assert client_factory().create_region("r").get("a") is None
        writer.put("a", 3)  # a later put revives the entry as an update
        assert fence.fence() == [("update", "a", 3)]
