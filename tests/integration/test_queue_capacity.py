"""Subscription queue capacity (docs/behaviour.md §4): a full queue slows producers for a bounded
time instead of dropping events, or gets its client disconnected when the operator says so.
Capacity is checked as each event is queued (Geode ``HARegionQueue``), so the writer whose
event finds the queue full is the one held, and nothing past the capacity reaches a client
that was disconnected for it."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from support import Recorder, settle, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.schemas.callbacks import EntryEvent
from regionbus.schemas.naming import RedisKeys

_CAPACITY = 20
_WAIT_MS = 1_500


class Stuck(Recorder):
    """A listener stuck on its first event until released (so the client acks nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def after_create(self, event: EntryEvent) -> None:
        super().after_create(event)
        self.release.wait(30)


def _server(server_settings: ServerSettings, **extra: Any) -> CacheServer:
    return CacheServer(
        server_settings.model_copy(
            update={
                "maximum_message_count": _CAPACITY,
                "maximum_queue_full_wait_ms": _WAIT_MS,
                **extra,
            }
        )
    )


def _fill(client_factory: Any, stuck: Stuck) -> tuple[Any, list[float]]:
    """60 puts, one after the other, of keys a stuck client is interested in; returns the
    client and each put's time, in seconds. The client pings rarely, so it does not learn of
    a disconnect (and register again) while the test looks."""
    slow = client_factory(ping_interval_ms=120_000)
    slow.create_region("r", listeners=[stuck]).register_interest([f"k{i}" for i in range(60)])
    writer = client_factory().create_region("r")
    took_s = []
    for i in range(60):
        started = time.monotonic()
        writer.put(f"k{i}", i)
        took_s.append(time.monotonic() - started)
    return slow, took_s


def test_a_full_queue_holds_operations_back_for_a_bounded_time_and_loses_nothing(
    server_settings: ServerSettings, client_factory: Any
) -> None:
    with _server(server_settings) as server:
        stuck = Stuck()
        slow, took_s = _fill(client_factory, stuck)
        assert server.stats.queue_full_waits == 1
        held = [i for i, s in enumerate(took_s) if s >= _WAIT_MS / 1000 * 0.8]
        assert held, "the writer was not held back"
        assert held[0] == _CAPACITY, (
            f"put {held[0]} was the first held: the one whose event found the queue full "
            f"(put {_CAPACITY}) should be"
        )
        assert held == [_CAPACITY], "held again: once per full-queue episode"
        assert max(took_s) < _WAIT_MS / 1000 + 5, "the hold was not bounded"
        stuck.release.set()
        wait_until(lambda: len(stuck.snapshot()) == 60, what="every queued event")
        settle(slow)
        delivered = [c[1] for c in stuck.snapshot()]
        assert sorted(delivered) == sorted(f"k{i}" for i in range(60)), "an event was lost"


def test_an_unresponsive_client_is_disconnected_when_the_operator_chose_so(
    server_settings: ServerSettings,
    client_factory: Any,
    redis_client: redis.Redis,
    namespace: str,
) -> None:
    with _server(server_settings, disconnect_unresponsive_clients=True) as server:
        fast = Recorder()
        other = client_factory()
        other.create_region("r", listeners=[fast]).register_interest(["k59"])
        stuck = Stuck()
        slow, took_s = _fill(client_factory, stuck)
        assert server.stats.clients_disconnected == 1
        assert [i for i, s in enumerate(took_s) if s >= _WAIT_MS / 1000 * 0.8] == [_CAPACITY]
        wait_until(
            lambda: not redis_client.exists(RedisKeys(namespace).interest(slow.client_id)),
            what="the unresponsive client's interest to be dropped",
        )
        wait_until(lambda: ("create", "k59", 59) in fast.snapshot(), what="the other client")
        stuck.release.set()
        wait_until(lambda: len(stuck.snapshot()) >= _CAPACITY, what="the queued events")
        settle(slow)
        got = [key for _, key, _ in stuck.snapshot()]
        assert got == [f"k{i}" for i in range(_CAPACITY)], (
            f"{len(got)} events reached the disconnected client: only those queued before "
            f"its queue was full ({_CAPACITY}) may"
        )
