"""A full subscription queue holds back only the writers of its events (docs/behaviour.md §4).

Ten subscribers with interest in every key of region ``stalled`` stop reading (their
listener is stuck, so they ack nothing) and their queues fill to the capacity. The put
whose events find them full waits, as a Geode put blocks on a full queue, for
``maximum_queue_full_wait_ms``; meanwhile a victim putting on region ``free``, which no
stalled client subscribes to, is not held at all, however many queues are held. Nothing
is lost: once the subscribers read again they get every event, in order.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import pytest
from support import Recorder, settle, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, RegionShortcut
from regionbus.schemas.callbacks import EntryEvent

pytestmark = pytest.mark.abuse

_CAPACITY = 20
_WAIT_MS = 5_000
_STALLED = 10
_VICTIM_PUTS = 60


class Stuck(Recorder):
    """A listener stuck on its first event until released (so its client acks nothing)."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def after_create(self, event: EntryEvent) -> None:
        super().after_create(event)
        self.release.wait(60)


def test_stalled_queues_hold_their_writers_and_no_other_client(
    server_settings: ServerSettings, client_factory: Any
) -> None:
    settings = server_settings.model_copy(
        update={
            "regions": ["stalled", "free"],
            "maximum_message_count": _CAPACITY,
            "maximum_queue_full_wait_ms": _WAIT_MS,
        }
    )
    release = threading.Event()
    with CacheServer(settings) as server:
        stuck = [Stuck(release) for _ in range(_STALLED)]
        for listener in stuck:
            subscriber = client_factory(ping_interval_ms=120_000)
            subscriber.create_region("stalled", listeners=[listener]).register_interest(ALL_KEYS)
        writer = client_factory(subscription_enabled=False)
        stalled = writer.create_region("stalled", RegionShortcut.PROXY)
        victim = client_factory(subscription_enabled=False).create_region(
            "free", RegionShortcut.PROXY
        )
        victim.put("warm", 0)
        try:
            for i in range(_CAPACITY):
                stalled.put(f"k{i}", i)
            # The next put's events find every stalled queue full: that put is held.
            held_s: list[float] = []

            def held_put() -> None:
                started = time.monotonic()
                stalled.put(f"k{_CAPACITY}", _CAPACITY)
                held_s.append(time.monotonic() - started)

            holder = threading.Thread(target=held_put)
            holder.start()
            wait_until(lambda: server.stats.queue_full_waits >= 1, what="a hold to begin")
            victim_ms: list[float] = []
            for i in range(_VICTIM_PUTS):
                started = time.monotonic()
                victim.put(f"v{i}", i)
                victim_ms.append((time.monotonic() - started) * 1000)
                time.sleep(0.02)
            during_hold = holder.is_alive()
            holder.join(_WAIT_MS / 1000 + 30)
        finally:
            release.set()

        assert held_s and held_s[0] >= _WAIT_MS / 1000 * 0.8, (
            f"the put whose events found the queues full took {held_s} s: it should wait "
            f"for them, up to {_WAIT_MS} ms"
        )
        assert during_hold, "the victim's puts did not all happen while the queues were held"
        p99 = statistics.quantiles(victim_ms, n=100)[98]
        print(f"victim put p50 {statistics.median(victim_ms):.1f} ms, p99 {p99:.1f} ms")
        assert max(victim_ms) < 1_000, (
            f"a put on a region no stalled client reads took {max(victim_ms):.0f} ms while "
            f"the full queues were held (p99 {p99:.0f} ms)"
        )
        wanted = [f"k{i}" for i in range(_CAPACITY + 1)]
        for listener in stuck:
            wait_until(
                lambda listener=listener: len(listener.snapshot()) == len(wanted),
                what="every event at each stalled subscriber",
            )
            assert [key for _, key, _ in listener.snapshot()] == wanted
        settle(writer)
