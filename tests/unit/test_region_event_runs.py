"""A run of pushed events handed to a client region at once (``Region.on_events``, as the
subscription queue hands over a Kafka message's events): each is applied and heard in
order, and neither a failing listener nor an event that cannot be applied stops the rest
of the run (no Kafka, no Redis: the region's server side is never called)."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest

from regionbus.clients import BytesSerializer, CacheListener, EntryEvent, RegionShortcut
from regionbus.clients.region import Region
from regionbus.schemas.messages import Event, EventKind
from tests.unit.test_server_events import _event as server_event


def _event(version: int, key: str | None, kind: EventKind = EventKind.CREATE) -> Event:
    """An event of version (and sequence id) ``version`` in bucket 3, value ``v<version>``."""
    return server_event(kind, version, key, b"v%d" % version)._replace(serializer="bytes")


class _Listener(CacheListener):
    """Records what it hears; raises for the keys in ``fail``."""

    def __init__(self, fail: set[str]) -> None:
        self.heard: list[tuple[str, str]] = []
        self.fail = fail

    def _hear(self, kind: str, event: EntryEvent) -> None:
        self.heard.append((kind, event.key))
        if event.key in self.fail:
            raise RuntimeError(f"listener failed on {event.key}")

    def after_create(self, event: EntryEvent) -> None:
        self._hear("create", event)

    def after_update(self, event: EntryEvent) -> None:
        self._hear("update", event)


def _region(*listeners: CacheListener) -> Region:
    # No cache: a pushed event never reaches the servers.
    return Region(
        cast(Any, None), "r", RegionShortcut.CACHING_PROXY, BytesSerializer(), listeners, None
    )


def test_a_run_is_applied_and_heard_in_order_past_a_failing_listener_and_a_bad_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing, recording = _Listener({"a"}), _Listener(set())
    region = _region(failing, recording)
    run = [
        _event(1, "a"),
        _event(2, None),  # an entry event without a key: cannot be applied
        _event(3, "b"),
        _event(4, "a", EventKind.UPDATE),
    ]
    with caplog.at_level(logging.ERROR):
        region.on_events(run)
    expected = [("create", "a"), ("create", "b"), ("update", "a")]
    assert failing.heard == expected
    assert recording.heard == expected  # the listener after the failing one heard all
    assert region.local_entries() == {"a": b"v4", "b": b"v3"}
    messages = [r.getMessage() for r in caplog.records]
    assert any("failed for r/a" in m for m in messages)  # both of "a"'s events
    assert any("handling event server-1:1:2@3 failed" in m for m in messages)


def test_a_replayed_run_reaches_listeners_and_leaves_the_cache_alone() -> None:
    recording = _Listener(set())
    region = _region(recording)
    region.on_events([_event(1, "a"), _event(2, "b")], apply=False)
    assert recording.heard == [("create", "a"), ("create", "b")]
    assert len(region) == 0
