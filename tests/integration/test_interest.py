"""Interest registration (docs/behaviour.md §3): union of registrations, bulk-load policies,
local destroy at registration, unregister, and invariant 3 (no gap at registration)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from support import Recorder, Sentinel, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, ClientCache, InterestResultPolicy
from regionbus.schemas.errors import InvalidInterestError


def test_the_server_routes_the_union_of_key_and_regex_interest(
    cache_server, client_factory
) -> None:  # type: ignore[no-untyped-def]
    writer = client_factory().create_region("r")
    recorder = Recorder()
    reader = client_factory().create_region("r", listeners=[recorder])
    reader.register_interest(["A", "sentinel"])
    reader.register_interest_regex("B.*")
    for key in ["A", "B1", "Bxyz", "C", "AB", "xB"]:
        writer.put(key, key)
    before = Sentinel(writer, recorder).fence()
    assert sorted(c[1] for c in before) == ["A", "B1", "Bxyz"]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (InterestResultPolicy.KEYS_VALUES, {"a1": 1, "a2": 2}),
        (InterestResultPolicy.KEYS, {"a1": None, "a2": None}),
        (InterestResultPolicy.NONE, {}),
    ],
)
def test_bulk_load_policies_fire_no_listener(
    policy, expected, cache_server, client_factory
) -> None:  # type: ignore[no-untyped-def]
    writer = client_factory().create_region("r")
    writer.put_all({"a1": 1, "a2": 2, "b1": 3})
    recorder = Recorder()
    reader = client_factory().create_region("r", listeners=[recorder])
    reader.register_interest_regex("a.*", policy)
    assert reader.local_entries() == expected
    assert recorder.snapshot() == []
    reader.register_interest(["sentinel"])
    assert Sentinel(writer, recorder).fence() == []
    if policy is InterestResultPolicy.KEYS:
        assert reader.get("a1") == 1  # an invalid (keys-only) entry is fetched on get


def test_registration_first_destroys_the_affected_local_entries(
    cache_server, client_factory
) -> None:  # type: ignore[no-untyped-def]
    writer = client_factory().create_region("r")
    writer.put_all({"A": "server-A", "B": "server-B", "C": "server-C"})
    recorder = Recorder()
    reader = client_factory().create_region("r", listeners=[recorder])
    for key in "ABC":
        reader.get(key)
    writer.destroy("B")  # the reader still holds a stale B: the registration must drop it
    recorder.clear()
    reader.register_interest(["A", "B"], InterestResultPolicy.NONE)
    assert reader.local_entries() == {"C": "server-C"}  # key list: A and B destroyed, C left
    reader.register_interest_regex("nothing-matches-.*", InterestResultPolicy.NONE)
    assert reader.local_entries() == {}  # regex: every local entry destroyed
    assert recorder.snapshot() == []  # silently


def test_unregister_stops_delivery(cache_server, client_factory) -> None:  # type: ignore[no-untyped-def]
    writer = client_factory().create_region("r")
    recorder = Recorder()
    reader = client_factory().create_region("r", listeners=[recorder])
    reader.register_interest(["k", "sentinel"])
    reader.register_interest_regex("re-.*")
    reader.register_interest(ALL_KEYS)
    reader.unregister_interest(ALL_KEYS)
    fence = Sentinel(writer, recorder)
    writer.put("k", 1)
    writer.put("re-1", 1)
    writer.put("other", 1)
    assert sorted(c[1] for c in fence.fence()) == ["k", "re-1"]
    reader.unregister_interest("k")
    reader.unregister_interest_regex("re-.*")
    writer.put("k", 2)
    writer.put("re-1", 2)
    assert fence.fence() == []
    assert reader.local_entries()["k"] == 1  # local entries stay after unregister


def test_an_invalid_regex_fails_at_registration_with_a_clear_error(
    cache_server, client_factory
) -> None:  # type: ignore[no-untyped-def]
    reader = client_factory().create_region("r")
    with pytest.raises(InvalidInterestError, match="invalid interest regex"):
        reader.register_interest_regex("([unclosed")
    assert reader.interest == []


def test_no_gap_at_registration_while_another_client_puts_the_same_keys(
    cache_server, client_factory
) -> None:  # type: ignore[no-untyped-def]
    """Invariant 3: every change after the bulk load reaches the client and the bulk load
    reflects every change before it, under concurrent puts of the same keys."""
    keys = [f"k{i}" for i in range(20)]
    rounds = 60
    writer_cache: ClientCache = client_factory()
    writer = writer_cache.create_region("r")
    writer.put_all({k: -1 for k in keys})
    seen: dict[str, list[int]] = {k: [] for k in keys}
    lock = threading.Lock()

    class Collect(Recorder):
        def after_update(self, event) -> None:  # type: ignore[no-untyped-def]
            with lock:
                seen[event.key].append(event.new_value)

        after_create = after_update

    reader = client_factory().create_region("r", listeners=[Collect()])
    started = threading.Event()

    def write() -> None:
        for value in range(rounds):
            futures = [writer.put_async(k, value) for k in keys]
            for future in futures:
                future.result(30)
            if value == 5:
                started.set()

    thread = threading.Thread(target=write)
    thread.start()
    assert started.wait(30)
    with lock:
        pass
    reader.register_interest(keys)
    with lock:
        loaded = {k: reader.local_entries().get(k) for k in keys}
        early = {k: list(v) for k, v in seen.items()}
    thread.join(60)
    wait_until(lambda: all(reader.local_entries().get(k) == rounds - 1 for k in keys), what="final")
    for key in keys:
        values = seen[key]
        assert values == list(range(values[0], rounds)), f"gap or duplicate for {key}: {values}"
        if not early[key]:
            # nothing had arrived by the time the registration returned: the first event
            # is the successor of the bulk-loaded value
            assert values[0] == loaded[key] + 1, (key, loaded[key], values[:3])
    assert reader.local_entries() == {k: rounds - 1 for k in keys}


def test_the_registry_in_redis_keeps_each_registration_with_its_flags(
    cache_server, client_factory
) -> None:  # type: ignore[no-untyped-def]
    import json

    cache: ClientCache = client_factory()
    region = cache.create_region("r")
    region.register_interest(["k1"], durable=True)
    region.register_interest_regex("a.*", receive_values=False)
    region.register_interest(ALL_KEYS, InterestResultPolicy.NONE)
    stored = cache_server.store.redis.hgetall(cache_server.store.keys.interest(cache.client_id))
    records = {k.decode().replace("\x00", "|"): json.loads(v) for k, v in stored.items()}
    assert records == {
        "r|KEYS|k1": {"receive_values": True, "durable": True},
        "r|REGEX|a.*": {"receive_values": False, "durable": False},
        "r|ALL_KEYS|": {"receive_values": True, "durable": False},
    }


def test_a_bulk_load_larger_than_one_reply_arrives_whole_in_chunks(
    server_settings: ServerSettings, client_factory: Any
) -> None:
    settings = server_settings.model_copy(update={"reply_chunk_bytes": 1024})
    with CacheServer(settings):
        writer = client_factory().create_region("r")
        writer.put_all({f"k{i:03d}": "x" * 100 for i in range(200)})  # ~ 25 KiB
        reader = client_factory()
        region = reader.create_region("r")
        region.register_interest(ALL_KEYS)
        assert region.local_entries() == {f"k{i:03d}": "x" * 100 for i in range(200)}
