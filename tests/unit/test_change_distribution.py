"""What follows an applied change, in the order docs/behaviour.md §1 gives (apply, server listeners,
distribution), the same for entry changes, expirations and region changes (pure logic: the parts are
recorders)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from regionbus.broker.distribution import Distribution
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import Event, EventKind


class _Recorder:
    """Stands for the listeners, the notifier, the gateways and the CQs at once."""

    def __init__(self, listeners: bool = True, queries: bool = False) -> None:
        self.calls: list[str] = []
        self._listeners = listeners
        self._queries = queries

    def after_entry(self, event: Event, old_value: bytes | None) -> None:
        self.calls.append("listeners")

    def after_region(self, event: Event) -> None:
        self.calls.append("listeners")

    def entry_event(self, *args: Any) -> None:
        self.calls.append("routing")

    def region_event(self, *args: Any) -> None:
        self.calls.append("routing")

    def enqueue(self, *args: Any) -> None:
        self.calls.append("gateways")

    def __bool__(self) -> bool:
        return True

    def produce(self, *args: Any) -> None:  # the outbox
        self.calls.append("produce")

    def has_listeners(self, region: str) -> bool:
        return self._listeners

    def has_queries(self, region: str) -> bool:
        return self._queries


def _distribution(recorder: _Recorder) -> Distribution:
    part = cast(Any, recorder)
    return Distribution(part, part, part, part, part)


EVENT = Event(EventID("m", 1, 1, 0), EventKind.UPDATE, "r", 2, 0, "c", "k", b"1", "json")
REGION = Event(EventID("m", 1, 2, 0), EventKind.REGION_CLEAR, "r", 3, 0, "c")


def test_an_entry_change_reaches_listeners_then_routing_then_gateways() -> None:
    recorder = _Recorder()
    _distribution(recorder).entry_changed(EVENT, 0, None, None, duplicate=False)
    assert recorder.calls == ["listeners", "routing", "gateways"]


def test_a_region_change_reaches_listeners_before_routing_as_an_entry_change_does() -> None:
    recorder = _Recorder()
    _distribution(recorder).region_changed(REGION, 0, duplicate=False)
    assert recorder.calls == ["listeners", "routing"]


@pytest.mark.parametrize("region_change", [False, True])
def test_a_duplicate_is_distributed_again_but_not_told_to_listeners(region_change: bool) -> None:
    recorder = _Recorder()
    distribution = _distribution(recorder)
    if region_change:
        distribution.region_changed(REGION, 0, duplicate=True)
    else:
        distribution.entry_changed(EVENT, 0, None, None, duplicate=True)
    assert "listeners" not in recorder.calls and "routing" in recorder.calls


@pytest.mark.parametrize(
    ("listeners", "queries", "wanted"),
    [(False, False, False), (True, False, True), (False, True, True)],
)
def test_the_old_value_is_read_only_when_listeners_or_cqs_need_it(
    listeners: bool, queries: bool, wanted: bool
) -> None:
    recorder = _Recorder(listeners=listeners, queries=queries)
    assert _distribution(recorder).wants_old_value("r") is wanted
