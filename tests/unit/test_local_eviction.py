"""LRU eviction by entry count in a client region's local store (Geode
``EvictionAttributes.createLRUEntryAttributes(max, LOCAL_DESTROY)``): the least recently
used entry goes, a use moves an entry back, and an evicted key's events still count."""

from __future__ import annotations

import pytest

from regionbus.clients.local_store import LocalEntry, LocalStore
from regionbus.clients.region_attributes import EvictionAttributes
from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.messages import Entry


def _store(maximum: int) -> tuple[LocalStore, list[tuple[str, LocalEntry]]]:
    evicted: list[tuple[str, LocalEntry]] = []
    store = LocalStore("r", True, max_entries=maximum, on_evict=lambda k, e: evicted.append((k, e)))
    return store, evicted


def test_the_least_recently_used_entry_is_evicted() -> None:
    store, evicted = _store(3)
    for i, key in enumerate(["a", "b", "c"], start=1):
        store.apply_value(key, b"1", "json", i)
    assert store.valid("a") is not None  # a local read is a use: "b" is now the oldest
    store.apply_value("c", b"2", "json", 4)  # so is an update
    store.apply_value("d", b"1", "json", 5)
    assert [k for k, _ in evicted] == ["b"]
    assert evicted[0][1].version == 2
    assert sorted(store.keys()) == ["a", "c", "d"]
    store.load(Entry("e", 6, b"1", "json"))  # a registration's load counts too
    assert [k for k, _ in evicted] == ["b", "a"]
    assert len(store) == 3 and store.evictions == 2


def test_an_evicted_key_takes_newer_events_only() -> None:
    store, _ = _store(1)
    store.apply_value("a", b"1", "json", 10)
    store.apply_value("b", b"1", "json", 11)
    assert "a" not in store
    assert not store.is_newer("a", 9)  # an older event of the evicted entry stays older
    store.apply_value("a", b"2", "json", 12)
    assert store.valid("a") == LocalEntry(b"2", "json", 12)
    assert "b" not in store


def test_without_eviction_every_entry_stays() -> None:
    store, evicted = _store(0)
    for i in range(1000):
        store.apply_value(f"k{i}", b"1", "json", i + 1)
    assert len(store) == 1000 and evicted == [] and store.evictions == 0


def test_an_lru_entry_count_keeps_at_least_one_entry() -> None:
    assert EvictionAttributes.lru_entry_count().maximum == 900  # Geode's default
    with pytest.raises(ConfigurationError):
        EvictionAttributes.lru_entry_count(0)
