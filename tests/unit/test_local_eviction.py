"""LRU eviction by entry count and by memory size in a client region's local store (Geode
``EvictionAttributes.createLRUEntryAttributes(max, LOCAL_DESTROY)`` and
``createLRUMemoryAttributes(megabytes, sizer, LOCAL_DESTROY)``): the least recently used
entry goes, a use moves an entry back, and an evicted key's events still count."""

from __future__ import annotations

import random

import pytest

from regionbus.clients.local_store import LocalEntry, LocalStore, entry_bytes
from regionbus.clients.region_attributes import EvictionAlgorithm, EvictionAttributes
from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.messages import Entry, EventKind


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


# --- LRU by memory size ---------------------------------------------------------------


def test_a_memory_lru_evicts_the_least_recently_used_once_the_bytes_are_over() -> None:
    limit = 3 * entry_bytes("a", b"x" * 100)
    evicted: list[str] = []
    store = LocalStore("r", True, max_bytes=limit, on_evict=lambda k, _e: evicted.append(k))
    for i, key in enumerate("abc", start=1):
        store.apply_value(key, b"x" * 100, "bytes", i)
    assert evicted == [] and store.entry_bytes == limit
    store.apply_value("a", b"x" * 150, "bytes", 4)  # growing a value counts, and is a use
    assert evicted == ["b"]
    store.apply_value("d", b"x" * 10, "bytes", 5)
    assert evicted == ["b"] and sorted(store.keys()) == ["a", "c", "d"]
    store.apply_value("e", b"x" * 300, "bytes", 6)  # one large value evicts several
    assert evicted == ["b", "c", "a"] and store.keys() == ["d", "e"]
    assert store.entry_bytes == entry_bytes("d", b"x" * 10) + entry_bytes("e", b"x" * 300)


def test_a_memory_lru_keeps_its_byte_count_exact_through_every_kind_of_change() -> None:
    rng = random.Random(7)
    store = LocalStore("r", True, max_bytes=20 * entry_bytes("k00", b"x" * 50))
    for version in range(1, 5_001):
        key = f"k{rng.randrange(40):02d}"
        step = rng.randrange(10)
        if step < 4:
            store.apply_value(key, b"x" * rng.randrange(120), "bytes", version)
        elif step == 4:
            store.apply_removal(EventKind.INVALIDATE, key, version, "bytes")
        elif step == 5:
            store.apply_removal(EventKind.DESTROY, key, version, "bytes")
        elif step == 6:
            store.load(Entry(key, version, b"y" * rng.randrange(120), "bytes"))
        elif step == 7 and key in store:
            store.invalidate_local(key)
        elif step == 8 and key in store:
            store.destroy_local(key)
        elif step == 9 and rng.random() < 0.02:
            store.cleared(version)
        held = sum(entry_bytes(k, e.value) for k, e in store.items())
        assert store.entry_bytes == held
        assert held <= 20 * entry_bytes("k00", b"x" * 50) + entry_bytes(key, b"x" * 120)


def test_memory_eviction_attributes_count_megabytes() -> None:
    attributes = EvictionAttributes.lru_memory_size()
    assert (attributes.maximum, attributes.algorithm) == (10, EvictionAlgorithm.LRU_MEMORY)
    assert (attributes.max_bytes, attributes.max_entries) == (10 * 1024 * 1024, 0)
    assert EvictionAttributes.lru_entry_count(5).max_bytes == 0
    with pytest.raises(ConfigurationError, match="LRU_MEMORY eviction keeps at least 1"):
        EvictionAttributes.lru_memory_size(0)
