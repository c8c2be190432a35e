"""The durable operations desk's checks pass on a faithful log and catch each kind of fault."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from regionbus.demo.flights_desks import DeskKind, DeskSpec, DurableLog, Phase
from regionbus.demo.flights_verify import verify_durable

_SPEC = DeskSpec("ops desk ORD (durable)", DeskKind.OPERATIONS, keys=("a", "b", "c"))
_OPERATIONS = {"a": 3, "b": 2, "c": 3}
_SERVER = {"a": {"s": "arrived"}, "c": {"s": "arrived"}}


def _log(**changes: Any) -> DurableLog:
    """Away and back: "a" changed before it left and in replay, "b" was created and
    destroyed in replay, "c" was created in replay and updated live twice, the first time
    before ``after_region_live`` (its bucket's marker came before the others')."""
    log = DurableLog(
        events=[
            ("a", 1, Phase.CONNECTED),
            ("a", 2, Phase.REPLAY),
            ("b", 3, Phase.REPLAY),
            ("b", 4, Phase.REPLAY),
            ("a", 5, Phase.REPLAY),
            ("c", 6, Phase.REPLAY),
            ("c", 7, Phase.LIVE),
            ("c", 8, Phase.LIVE),
        ],
        live_calls=[1, 1],
        away=True,
        client_state="RECONNECTED",
        pending_event_count=4,
        cache_at_live={"c": {"s": "departed"}},
        applied_before_live={"c": {"s": "departed"}},
    )
    return replace(log, **changes)


def _failed(log: DurableLog, entries: dict[str, Any] | None = None) -> list[str]:
    final = {"c": {"s": "arrived"}} if entries is None else entries
    checks = verify_durable(_SPEC, log, final, _SERVER, _OPERATIONS)
    assert len(checks) == 5
    return [c.name for c in checks if not c.ok]


def test_a_faithful_log_passes_every_check() -> None:
    assert _failed(_log()) == []


def test_a_missed_or_repeated_event_fails_the_once_and_in_order_check() -> None:
    missed = _log().events[:-1]
    repeated = [*_log().events, ("c", 8, Phase.LIVE)]
    for events in (missed, repeated):
        failed = _failed(_log(events=events))
        assert any("every change of its keys once" in name for name in failed), failed


def test_a_phase_going_back_or_an_empty_replay_fails_the_phase_check() -> None:
    back = [*_log().events[:-1], ("c", 8, Phase.REPLAY)]
    no_replay = [(k, v, Phase.LIVE if p is Phase.REPLAY else p) for k, v, p in _log().events]
    for events in (back, no_replay):
        failed = _failed(_log(events=events))
        assert any("phases in order" in name for name in failed), failed


def test_replay_that_changed_the_cache_fails() -> None:
    failed = _failed(_log(cache_at_live={"a": {"s": "departed"}, "c": {"s": "departed"}}))
    assert any("replay left the cache alone" in name for name in failed), failed


def test_a_second_after_region_live_fails() -> None:
    failed = _failed(_log(live_calls=[1, 2]))
    assert any("after_region_live once" in name for name in failed), failed


def test_a_final_cache_unlike_the_server_fails() -> None:
    failed = _failed(_log(), entries={"a": {"s": "arrived"}, "c": {"s": "arrived"}})
    assert any("server entries of its keys with live events" in name for name in failed), failed
