"""A step of a server's wall clock (NTP, a VM resumed, skew between servers) decides no
client's fate: silence is timed on the server's monotonic clock, a durable client's time
away on Redis's clock.

The server runs on a thread of this process, so shifting ``time.time`` and
``time.time_ns`` here shifts its wall clock as a step of the machine's clock would;
Redis's clock and the monotonic clock do not move.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support import Recorder, routed, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, ClientCache
from regionbus.schemas.messages import CLIENT_NEW, CLIENT_RECONNECTED

pytestmark = pytest.mark.abuse

_LIVENESS_MS = 2_000
_HOUR_S = 3_600
_EVENTS = 40


@pytest.fixture
def server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    """A server with a 2 s liveness window and a reaper looking every 0.3 s."""
    settings = server_settings.model_copy(
        update={
            "maximum_time_between_pings_ms": _LIVENESS_MS,
            "durable_client_reaper_interval_s": 0.3,
        }
    )
    with CacheServer(settings) as running:
        yield running


class _Sweeps:
    """Counts the server's silence sweeps and reaper sweeps as they run."""

    def __init__(self, server: CacheServer, monkeypatch: pytest.MonkeyPatch) -> None:
        parts = server._parts
        assert parts is not None
        self.silence = 0
        self.reaper = 0
        self._lock = threading.Lock()
        lifecycle = parts.lifecycle
        expire_silent, reap = lifecycle.expire_silent, lifecycle.reap

        def counted_expire_silent() -> None:
            expire_silent()
            with self._lock:
                self.silence += 1

        def counted_reap() -> None:
            reap()
            with self._lock:
                self.reaper += 1

        monkeypatch.setattr(lifecycle, "expire_silent", counted_expire_silent)
        monkeypatch.setattr(lifecycle, "reap", counted_reap)

    def wait_for_more(self, sweeps: int) -> None:
        """Wait until each kind of sweep has run ``sweeps`` more times than now."""
        with self._lock:
            silence, reaper = self.silence + sweeps, self.reaper + sweeps
        wait_until(
            lambda: self.silence >= silence and self.reaper >= reaper,
            timeout_s=30,
            what=f"{sweeps} more silence and reaper sweeps",
        )


def _step_wall_clock(monkeypatch: pytest.MonkeyPatch, by_s: float) -> None:
    """Step this process's wall clock by ``by_s`` seconds, as NTP would."""
    real_time, real_time_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: real_time() + by_s)
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + int(by_s * 1e9))


def _away_durable_client(client_factory: Callable[..., ClientCache], timeout_s: int) -> None:
    """A durable client ``desk`` with durable interest in every key of ``r``, closed with
    keep-alive."""
    durable = client_factory(durable_client_id="desk", durable_client_timeout_s=timeout_s)
    durable.create_region("r").register_interest(ALL_KEYS, durable=True)
    durable.ready_for_events()
    durable.close(keep_alive=True)


@pytest.mark.parametrize("step_s", [_HOUR_S, -_HOUR_S], ids=["forward", "back"])
def test_a_wall_clock_step_of_an_hour_drops_no_live_client_and_reaps_no_durable_one(
    server: CacheServer,
    client_factory: Callable[..., ClientCache],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    step_s: int,
) -> None:
    caplog.set_level(logging.WARNING, logger="regionbus.server")
    live = client_factory(ping_interval_ms=300)
    heard = Recorder()
    live.create_region("r", listeners=[heard]).register_interest(ALL_KEYS)
    _away_durable_client(client_factory, timeout_s=300)
    sweeps = _Sweeps(server, monkeypatch)

    _step_wall_clock(monkeypatch, step_s)
    writer = client_factory(ping_interval_ms=300).create_region("r")
    for i in range(_EVENTS):
        writer.put(f"k{i}", i)
    wait_until(lambda: len(heard.snapshot()) == _EVENTS, what="the live client's events")
    # Past the liveness window, with every sweep after the step seen to run several times.
    sweeps.wait_for_more(3)
    time_after_step = time.monotonic() + _LIVENESS_MS / 1000
    wait_until(lambda: time.monotonic() > time_after_step, what="a liveness window")
    sweeps.wait_for_more(2)

    dropped = [r.getMessage() for r in caplog.records if "sent nothing" in r.getMessage()]
    assert dropped == [], "a client that pings was taken as silent"
    assert live.client_id in routed(server.registry, "r", "k0", 0)
    writer.put("after", 1)
    wait_until(lambda: ("create", "after", 1) in heard.snapshot(), what="a live put after it")

    again = client_factory(durable_client_id="desk", durable_client_timeout_s=300)
    assert again.client_state == CLIENT_RECONNECTED, "the durable client was reaped"
    replayed = Recorder()
    again.create_region("r", listeners=[replayed])
    again.ready_for_events()
    wait_until(
        lambda: sum(1 for call in replayed.snapshot() if call[1].startswith("k")) >= _EVENTS,
        what="the away client's events",
    )
    keys = [key for _, key, _ in replayed.snapshot() if key.startswith("k")]
    assert sorted(keys) == sorted(f"k{i}" for i in range(_EVENTS))


def test_after_a_step_back_a_silent_client_is_dropped_and_a_durable_one_reaped_on_time(
    server: CacheServer,
    client_factory: Callable[..., ClientCache],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A clock stepped back must not keep a dead client alive, nor an expired durable
    client registered (its queue, interest and consumer group), for the step's length."""
    silent = client_factory(ping_interval_ms=600_000)
    silent.create_region("r").register_interest(ALL_KEYS)
    _away_durable_client(client_factory, timeout_s=2)
    _step_wall_clock(monkeypatch, -_HOUR_S)

    wait_until(
        lambda: silent.client_id not in routed(server.registry, "r", "k", 0),
        timeout_s=_LIVENESS_MS / 1000 + 10,
        what="the silent client to be dropped",
    )
    wait_until(
        lambda: server.clients.get("desk") is None,
        timeout_s=2 + 10,
        what="the durable client to be reaped after its 2 s",
    )
    again: Any = client_factory(durable_client_id="desk", durable_client_timeout_s=2)
    assert again.client_state == CLIENT_NEW
