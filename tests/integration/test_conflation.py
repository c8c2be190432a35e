"""Subscription conflation (docs/behaviour.md §4): a slow client gets only the last of queued
updates."""

from __future__ import annotations

import threading
from typing import Any

from support import Recorder, settle, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.schemas.callbacks import EntryEvent


class SlowRecorder(Recorder):
    """Blocks on the first event of key ``block`` until released: a slow client."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def after_create(self, event: EntryEvent) -> None:
        super().after_create(event)
        if event.key == "block":
            assert self.release.wait(30)


def _queue_behind_a_slow_listener(
    client_factory: Any, region: str = "r", **client: Any
) -> tuple[Any, SlowRecorder]:
    """Updates k to 1..6, creates and destroys d, updates k to 7 and 8, all while the
    client's listener is stuck on its first event."""
    recorder = SlowRecorder()
    slow = client_factory(**client)
    slow.create_region(region, listeners=[recorder]).register_interest(["block", "k", "d"])
    writer = client_factory().create_region(region)
    writer.put("block", 0)
    wait_until(lambda: recorder.snapshot() == [("create", "block", 0)], what="the slow event")
    for value in range(1, 7):
        writer.put("k", value)
    writer.put("d", 1)
    writer.destroy("d")
    writer.put("k", 7)
    writer.put("k", 8)
    settle(client_factory(), idle_s=0.5)  # give the server time to queue everything
    recorder.release.set()
    settle(slow)
    return slow, recorder


def test_a_slow_client_with_conflation_gets_only_the_last_queued_update_of_a_key(
    cache_server: CacheServer, client_factory: Any
) -> None:
    slow, recorder = _queue_behind_a_slow_listener(client_factory, subscription_conflation="true")
    assert recorder.snapshot()[1:] == [
        ("create", "k", 1),
        ("create", "d", 1),
        ("destroy", "d", None),
        ("update", "k", 8),
    ]
    assert slow.subscription_stats.conflated == 6  # k = 2..7
    assert slow.get_region("r").get("k") == 8


def test_a_slow_client_with_paced_fetches_conflates_what_each_fetch_brought(
    cache_server: CacheServer, client_factory: Any
) -> None:
    """A paced consumer holds one fetch, not the whole backlog: what it fetched while the
    listener was stuck comes unconflated (as what Geode already dispatched), the rest
    conflated; creates and destroys always come, and the last update wins."""
    slow, recorder = _queue_behind_a_slow_listener(
        client_factory, subscription_conflation="true", queue_fetch_backoff_ms=50
    )
    calls = recorder.snapshot()[1:]
    updates = [value for method, key, value in calls if (method, key) == ("update", "k")]
    assert [c for c in calls if c[1] == "d"] == [("create", "d", 1), ("destroy", "d", None)]
    assert calls[0] == ("create", "k", 1)
    assert updates == sorted(updates) and updates[-1] == 8
    assert slow.subscription_stats.conflated == 7 - len(updates) >= 1
    assert slow.get_region("r").get("k") == 8


def test_the_servers_setting_is_the_default_and_off_delivers_every_update(
    server_settings: ServerSettings, client_factory: Any
) -> None:
    settings = server_settings.model_copy(
        update={"enable_subscription_conflation": True, "regions": ["r", "r2"]}
    )
    with CacheServer(settings):
        _, conflated = _queue_behind_a_slow_listener(client_factory)
        assert ("update", "k", 2) not in conflated.snapshot()
        _, every = _queue_behind_a_slow_listener(
            client_factory, "r2", subscription_conflation="false"
        )
        assert [c for c in every.snapshot() if c[0] == "update"] == [
            ("update", "k", v) for v in (2, 3, 4, 5, 6, 7, 8)
        ]
