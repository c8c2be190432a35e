"""A reconnecting durable client reads its queue once: counting the pending events keeps
the messages it read (up to a bound), and the replay starts from them. Whether they were
kept or read again, every queued event reaches the listeners once, in order, before the
marker, without changing the cache (docs/behaviour.md §5)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support import Recorder, wait_until

import regionbus.clients.subscription
from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS

_KEYS = 5
_PUTS = 40


@pytest.fixture
def durable_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    with CacheServer(server_settings.model_copy(update={"regions": ["r"]})) as server:
        yield server


def _queue_while_away(client_factory: Callable[..., Any]) -> list[tuple[str, str, Any]]:
    """Register the durable client, close it with keep-alive, put while it is away.

    Returns:
        The listener calls the replay must give: every put in order, then the marker.
    """
    durable = client_factory(durable_client_id="desk")
    durable.create_region("r").register_interest(ALL_KEYS, durable=True)
    durable.ready_for_events()
    durable.close(keep_alive=True)
    writer = client_factory(subscription_enabled=False).create_region("r")
    expected: list[tuple[str, str, Any]] = []
    for i in range(_PUTS):
        key = f"k{i % _KEYS}"
        writer.put(key, i)
        expected.append(("create" if i < _KEYS else "update", key, i))
    # A put_all lands in the queue as batches of several events.
    writer.put_all({f"k{i}": 100 + i for i in range(_KEYS)})
    expected += [("update", f"k{i}", 100 + i) for i in range(_KEYS)]
    return [*expected, ("region_live", "r", None)]


def _by_key(calls: list[tuple[str, str, Any]]) -> dict[str, list[tuple[str, Any]]]:
    keys: dict[str, list[tuple[str, Any]]] = {}
    for method, key, value in calls:
        keys.setdefault(key, []).append((method, value))
    return keys


def _replay(client_factory: Callable[..., Any]) -> tuple[Any, Any, Recorder]:
    again = client_factory(durable_client_id="desk")
    recorder = Recorder()
    region = again.create_region("r", listeners=[recorder])
    return again, region, recorder


@pytest.mark.parametrize("prefetch_max_bytes", [64 * 1024 * 1024, 300])
def test_a_reconnecting_durable_client_replays_every_queued_event_once_in_order(
    durable_server: CacheServer,
    client_factory: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    prefetch_max_bytes: int,
) -> None:
    """With the default bound every message counted is kept; with 300 bytes only the first
    few are, and the rest are read again after a seek back."""
    monkeypatch.setattr(regionbus.clients.subscription, "_PREFETCH_MAX_BYTES", prefetch_max_bytes)
    expected = _queue_while_away(client_factory)

    again, region, recorder = _replay(client_factory)
    assert again.client_state == "RECONNECTED"
    assert again.pending_event_count == len(expected) - 1
    kept = again.subscription._prefetched
    assert kept, "counting kept the messages it read"
    assert sum(len(m.value()) for m in kept) <= prefetch_max_bytes
    again.ready_for_events()

    wait_until(lambda: ("region_live", "r", None) in recorder.snapshot(), what="the marker")
    calls = recorder.snapshot()
    assert calls[-1] == ("region_live", "r", None)
    # Each key's events in order; the buckets of different keys are not ordered together.
    assert _by_key(calls) == _by_key(expected)
    stats = again.subscription_stats
    assert stats.replayed == stats.events_delivered == len(expected) - 1
    assert stats.duplicates_dropped == 0
    assert region.local_entries() == {}, "replayed events do not change the cache"
    assert again.subscription._prefetched == []


def test_a_reconnection_that_finds_no_queued_event_counts_none_and_goes_live(
    durable_server: CacheServer, client_factory: Callable[..., Any]
) -> None:
    durable = client_factory(durable_client_id="desk")
    durable.create_region("r").register_interest(ALL_KEYS, durable=True)
    durable.ready_for_events()
    durable.close(keep_alive=True)

    again, _, recorder = _replay(client_factory)
    assert again.pending_event_count == 0
    again.ready_for_events()
    wait_until(lambda: ("region_live", "r", None) in recorder.snapshot(), what="the marker")
    assert recorder.snapshot() == [("region_live", "r", None)]
