"""A client region bounded by LRU eviction, against a real Kafka and Redis: it keeps at
most its maximum of entries, its listeners hear each eviction as a local destroy (Geode
``EVICT_DESTROY``), the servers keep everything, and an evicted key still gets its events."""

from __future__ import annotations

from typing import Any

from support import Recorder, Sentinel, wait_until

from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, EvictionAttributes


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
