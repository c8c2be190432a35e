"""The client region's local copy: the version rules that keep a stale change from
overwriting a newer one, the registration window, replay and tombstones (no Kafka, no
Redis)."""

from __future__ import annotations

import pytest

from regionbus.clients.local_store import LocalEntry, LocalStore, Removal
from regionbus.schemas.errors import EntryNotFoundError
from regionbus.schemas.messages import Entry, EventKind


def _store(caching: bool = True, max_tombstones: int = 100) -> LocalStore:
    return LocalStore("r", caching, max_tombstones)


def test_a_change_older_than_the_held_version_never_overwrites_it() -> None:
    store = _store()
    assert store.apply_value("k", b"new", "json", 7) == (EventKind.CREATE, None)
    kind, old = store.apply_value("k", b"stale", "json", 5)
    assert (kind, old) == (EventKind.UPDATE, b"new")  # listeners hear it; the cache keeps 7
    assert store.entry("k") == LocalEntry(b"new", "json", 7)
    store.apply_value("k", b"newer", "json", 8)
    assert store.entry("k") == LocalEntry(b"newer", "json", 8)


def test_a_destroy_leaves_a_tombstone_that_refuses_older_changes_and_takes_newer_ones() -> None:
    store = _store()
    store.apply_value("k", b"v", "json", 3)
    assert store.apply_removal(EventKind.DESTROY, "k", 4, "json") == Removal(True, b"v", "json")
    assert "k" not in store
    store.apply_value("k", b"late reply", "json", 3)
    assert "k" not in store
    assert not store.load(Entry("k", 4, b"from a snapshot", "json"))
    store.apply_value("k", b"recreated", "json", 5)
    assert store.entry("k") == LocalEntry(b"recreated", "json", 5)


def test_tombstones_are_bounded_oldest_forgotten_first() -> None:
    store = _store(max_tombstones=2)
    for i, key in enumerate(("a", "b", "c")):
        store.apply_value(key, b"v", "json", 10 + i)
        store.apply_removal(EventKind.DESTROY, key, 20 + i, "json")
    assert store.is_newer("a", 15)  # forgotten: only the clear version (-1) remains
    assert not store.is_newer("b", 21)
    assert not store.is_newer("c", 22)


def test_a_region_clear_refuses_every_change_older_than_it() -> None:
    store = _store()
    store.apply_value("k", b"v", "json", 3)
    store.cleared(10)
    assert len(store) == 0
    store.apply_value("k", b"before the clear", "json", 9)
    assert "k" not in store
    store.apply_value("k", b"after the clear", "json", 11)
    assert store.entry("k") == LocalEntry(b"after the clear", "json", 11)


def test_an_invalidate_keeps_the_key_and_a_valid_value_of_the_same_version_revives_it() -> None:
    store = _store()
    store.apply_value("k", b"v", "json", 3)
    assert store.apply_removal(EventKind.INVALIDATE, "k", 4, "json") == Removal(True, b"v", "json")
    assert store.entry("k") == LocalEntry(None, "json", 4)
    assert store.valid("k") is None
    assert store.load(Entry("k", 4, b"loaded", "json"))
    assert store.valid("k") == LocalEntry(b"loaded", "json", 4)


def test_a_bulk_load_keeps_a_valid_local_value_unless_the_answer_is_newer() -> None:
    store = _store()
    store.apply_value("k", b"local", "json", 6)
    assert not store.load(Entry("k", 6, b"same version", "json"))
    assert not store.load(Entry("k", 5, b"older", "json"))
    assert store.load(Entry("k", 7, b"newer", "json"))
    assert store.entry("k") == LocalEntry(b"newer", "json", 7)


def test_a_registration_drops_affected_entries_and_never_revives_one_destroyed_meanwhile() -> None:
    store = _store()
    store.apply_value("a", b"1", "json", 1)
    store.apply_value("b", b"2", "json", 2)
    store.begin_registration(["a"])
    assert "a" not in store and "b" in store
    store.apply_value("a", b"during", "json", 5)
    store.apply_removal(EventKind.DESTROY, "a", 6, "json")
    assert not store.load(Entry("a", 9, b"snapshot", "json"))  # destroyed while registering
    store.end_registration()
    assert store.load(Entry("a", 9, b"after", "json"))
    store.begin_registration(None)  # all keys or a regex: every entry goes
    assert len(store) == 0
    store.end_registration()


def test_a_local_destroy_during_a_registration_is_not_revived_either() -> None:
    store = _store()
    store.begin_registration(["x"])
    store.apply_value("k", b"v", "json", 1)
    assert store.destroy_local("k") == LocalEntry(b"v", "json", 1)
    assert not store.load(Entry("k", 2, b"snapshot", "json"))
    store.end_registration()


def test_replay_changes_nothing_but_remembers_created_keys_for_later_events() -> None:
    store = _store()
    replayed = store.apply_value(
        "k", b"replayed", "json", 3, apply=False, server_kind=EventKind.CREATE
    )
    assert replayed == (EventKind.CREATE, None)
    assert "k" not in store
    # seen in replay: the next change of the key is an update for listeners
    assert store.apply_value("k", b"live", "json", 4) == (EventKind.UPDATE, None)
    assert store.entry("k") == LocalEntry(b"live", "json", 4)
    # a replayed invalidate of a key the cache does not hold still reaches listeners
    assert store.apply_removal(EventKind.INVALIDATE, "z", 5, "json", apply=False, replay=True).held


def test_a_replayed_event_has_the_servers_kind_and_no_old_value_whatever_the_cache_holds() -> None:
    store = _store()
    store.apply_value("k", b"loaded", "json", 5)
    assert store.apply_value("k", b"old", "json", 3, apply=False, server_kind=EventKind.CREATE) == (
        EventKind.CREATE,
        None,
    )
    replayed = store.apply_removal(EventKind.INVALIDATE, "k", 4, "json", apply=False, replay=True)
    assert replayed == Removal(True, None, "json")
    assert store.entry("k") == LocalEntry(b"loaded", "json", 5)


def test_an_invalidate_of_an_entry_already_invalid_is_not_heard() -> None:
    store = _store()
    store.apply_value("k", b"v", "json", 1)
    assert store.apply_removal(EventKind.INVALIDATE, "k", 2, "json").held
    assert not store.apply_removal(EventKind.INVALIDATE, "k", 3, "json").held
    # a get of the invalidation's own version makes it valid again
    store.apply_value("k", b"w", "json", 3)
    assert store.valid("k") == LocalEntry(b"w", "json", 3)
    assert store.apply_removal(EventKind.INVALIDATE, "k", 4, "json").held


def test_a_destroy_forgets_a_key_seen_in_replay() -> None:
    store = _store()
    store.apply_value("k", b"replayed", "json", 3, apply=False)
    assert store.apply_removal(EventKind.DESTROY, "k", 4, "json", apply=False).held
    assert not store.apply_removal(EventKind.INVALIDATE, "k", 5, "json").held


def test_an_event_for_a_key_not_held_is_not_heard_by_a_caching_region() -> None:
    store = _store()
    assert store.apply_removal(EventKind.INVALIDATE, "k", 1, "json") == Removal(False, None, "json")


def test_a_proxy_region_stores_nothing_and_reports_the_servers_kinds() -> None:
    store = _store(caching=False)
    assert store.apply_value("k", b"v", "json", 1, server_kind=EventKind.CREATE) == (
        EventKind.CREATE,
        None,
    )
    assert store.apply_value("k", b"w", "json", 2, server_kind=EventKind.UPDATE)[0] is (
        EventKind.UPDATE
    )
    assert len(store) == 0


def test_the_lowest_registration_version_of_a_bucket_is_kept() -> None:
    store = _store()
    assert store.registered_at(3) is None
    store.registered(3, 40)
    store.registered(3, 35)
    store.registered(3, 50)
    assert store.registered_at(3) == 35
    store.reset()
    assert store.registered_at(3) is None


def test_local_changes_of_a_missing_key_raise_entry_not_found() -> None:
    store = _store()
    with pytest.raises(EntryNotFoundError):
        store.invalidate_local("k")
    with pytest.raises(EntryNotFoundError):
        store.destroy_local("k")


def test_a_local_invalidate_keeps_the_version_and_reports_what_was_there() -> None:
    store = _store()
    store.apply_value("k", b"v", "json", 3)
    assert store.invalidate_local("k") == LocalEntry(b"v", "json", 3)
    assert store.entry("k") == LocalEntry(None, "json", 3)


def test_an_invalidate_older_than_the_value_held_is_not_heard() -> None:
    store = _store()
    store.apply_value("k", b"loaded", "json", 2)
    assert not store.apply_removal(EventKind.INVALIDATE, "k", 2, "json").held
    assert store.valid("k") == LocalEntry(b"loaded", "json", 2)
