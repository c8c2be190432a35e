"""A client region bounded by LRU eviction, against a real Kafka and Redis: it keeps at
most its maximum of entries, its listeners hear each eviction as a local destroy (Geode
``EVICT_DESTROY``), the servers keep everything, and an evicted key still gets its events."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from support import Recorder, Sentinel, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, EvictionAttributes
from regionbus.clients.local_store import LocalStore, entry_bytes


def test_an_lru_bounded_region_keeps_its_maximum_and_still_gets_events(
    cache_server: CacheServer, client_factory: Any
) -> None:
    writer = client_factory().create_region("r")
    recorder = Recorder()
    bounded = client_factory().create_region(
        "r", listeners=[recorder], eviction=EvictionAttributes.lru_entry_count(10)
    )
    bounded.register_interest(ALL_KEYS)
    writer.put_all({f"k{i:03d}": i for i in range(100)})
    wait_until(
        lambda: sum(c[0] == "create" for c in recorder.snapshot()) >= 100, what="every create"
    )
    assert len(bounded) <= 10
    evicted = [e for e in recorder.events if getattr(e, "is_eviction", False)]
    assert len(evicted) == bounded.evictions >= 90
    assert all(e.kind.name == "DESTROY" and e.old_value is not None for e in evicted)
    assert len(cache_server.store.entries("r")) == 100  # a local destroy: the server keeps it
    first = evicted[0].key
    assert first not in bounded
    writer.put(first, "again")
    Sentinel(writer, recorder).fence()
    assert bounded.local_entries()[first] == "again"  # its interest stayed
    assert len(bounded) <= 10


def test_a_memory_bounded_region_keeps_its_megabytes(
    cache_server: CacheServer, client_factory: Any
) -> None:
    writer = client_factory().create_region("r")
    recorder = Recorder()
    bounded = client_factory().create_region(
        "r", listeners=[recorder], eviction=EvictionAttributes.lru_memory_size(1)
    )
    bounded.register_interest(ALL_KEYS)
    value = "v" * 2_000  # about 2 KB a JSON string: 1,000 of them are twice the limit
    for start in range(0, 1_000, 250):
        writer.put_all({f"k{i:04d}": value for i in range(start, start + 250)})
    wait_until(
        lambda: sum(c[0] == "create" for c in recorder.snapshot()) >= 1_000,
        timeout_s=60,
        what="every create",
    )
    held = bounded.local_entries()
    per_entry = entry_bytes("k0000", b'"' + value.encode() + b'"')
    assert len(held) == (1024 * 1024) // per_entry  # as many as fit in 1 MiB
    assert bounded.evictions == 1_000 - len(held)
    # The most recently created stay (in the order their events arrived: bucket by bucket).
    created = [key for kind, key, _ in recorder.snapshot() if kind == "create"]
    assert set(held) == set(created[-len(held) :])
    assert len(cache_server.store.entries("r")) == 1_000


def test_a_registrations_entries_are_taken_chunk_by_chunk_as_they_arrive(
    server_settings: ServerSettings, client_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registration's answer is loaded as each reply chunk arrives, on the reply thread,
    never held whole: a bounded region stays bounded however large the answer."""
    chunks: list[tuple[str, int]] = []
    load_all = LocalStore.load_all

    def recording(store: LocalStore, entries: Any) -> None:
        entries = list(entries)
        chunks.append((threading.current_thread().name, len(entries)))
        load_all(store, entries)

    monkeypatch.setattr(LocalStore, "load_all", recording)
    with CacheServer(server_settings.model_copy(update={"reply_chunk_bytes": 4096})):
        writer = client_factory().create_region("r")
        writer.put_all({f"k{i:04d}": "v" * 40 for i in range(2_000)})
        bounded = client_factory().create_region(
            "r", eviction=EvictionAttributes.lru_entry_count(50)
        )
        bounded.register_interest(ALL_KEYS)
    assert sum(n for _, n in chunks) == 2_000
    assert len(chunks) > 16  # more chunks than buckets: 4 KB each
    assert max(n for _, n in chunks) < 100
    assert threading.current_thread().name not in {name for name, _ in chunks}
    assert len(bounded) == 50 and bounded.evictions == 1_950
