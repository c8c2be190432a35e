"""The child processes of ``bench.fleet``: fleets of clients that register and go away,
fleets that wait to be killed, and subscribers with a key list of their own.

Each runs in a process of its own (``spawn``), as the readers of ``bench.workers``, and
talks to the parent over the same pipe protocol (``ready``, ``stop``, ``result``).
"""

from __future__ import annotations

import time
from contextlib import suppress
from multiprocessing.connection import Connection
from typing import Any

from bench.workers import (
    CountingListener,
    Tally,
    child_signals,
    stamped_value,
    tallies_result,
    wait_until_done,
)
from regionbus.clients import (
    ALL_KEYS,
    BytesSerializer,
    CacheListener,
    ClientCache,
    ClientSettings,
    EntryEvent,
    InterestResultPolicy,
)

DURABLE_KEYS_PER_CLIENT = 3
"""Keys each durable client of the fleet registers durable interest in."""

DURABLE_TIMEOUT_S = 6 * 3600
"""The fleet's durable clients are kept this long while away: registering thousands takes
longer than the default 300 s."""


def durable_id(index: int) -> str:
    """The client id of the fleet's ``index``-th durable client."""
    return f"fleet-d-{index}"


def durable_keys(index: int) -> list[str]:
    """The keys the fleet's ``index``-th durable client is interested in."""
    return [f"d{index}-{j}" for j in range(DURABLE_KEYS_PER_CLIENT)]


def run_durable_registrations(
    conn: Connection,
    *,
    settings: dict[str, Any],
    region: str,
    first: int,
    count: int,
    all_keys: bool = False,
) -> None:
    """Child: connect durable clients ``first`` .. ``first + count - 1`` one after the
    other, each registering durable interest in its keys, then closing with keep-alive
    (away, its queue and interest kept). Result: ``connect_s`` (each construction, in
    seconds) and ``total_s``.

    Args:
        conn: The pipe to the parent.
        settings: ``ClientSettings`` fields.
        region: The region of interest.
        first: Index of the first durable client.
        count: How many.
        all_keys: Register ``ALL_KEYS`` (one interest every client shares) instead of
            each client's own keys (:func:`durable_keys`).
    """
    child_signals()
    connect_s: list[float] = []
    started = time.monotonic()
    conn.send(("ready", None))
    for index in range(first, first + count):
        began = time.perf_counter()
        cache = ClientCache(
            ClientSettings(
                **settings,
                durable_client_id=durable_id(index),
                durable_client_timeout_s=DURABLE_TIMEOUT_S,
                ping_interval_ms=60_000,
            )
        )
        connect_s.append(time.perf_counter() - began)
        try:
            cache.create_region(region, serializer=BytesSerializer()).register_interest(
                ALL_KEYS if all_keys else durable_keys(index),
                InterestResultPolicy.NONE,
                durable=True,
            )
        finally:
            cache.close(keep_alive=True)
    conn.send(("result", {"connect_s": connect_s, "total_s": time.monotonic() - started}))


def run_killable_clients(
    conn: Connection,
    *,
    settings: dict[str, Any],
    region: str,
    prefix: str,
    count: int,
    durable_client_timeout_s: int | None,
) -> None:
    """Child: ``count`` clients ``<prefix>-<n>`` (durable with that timeout, if given), each
    with interest in every key, pinging often; ``ready`` once all are connected, then
    waits to be killed.

    Args:
        conn: The pipe to the parent.
        settings: ``ClientSettings`` fields.
        region: The region of interest.
        prefix: Client id prefix.
        count: How many clients.
        durable_client_timeout_s: Makes them durable with this timeout; None: not durable.
    """
    child_signals()
    caches = []
    for n in range(count):
        client_id = f"{prefix}-{n}"
        identity: dict[str, Any] = (
            {"client_id": client_id}
            if durable_client_timeout_s is None
            else {
                "durable_client_id": client_id,
                "durable_client_timeout_s": durable_client_timeout_s,
            }
        )
        cache = ClientCache(ClientSettings(**settings, **identity, ping_interval_ms=500))
        cache.create_region(region, serializer=BytesSerializer()).register_interest(
            ALL_KEYS, InterestResultPolicy.NONE, durable=durable_client_timeout_s is not None
        )
        if durable_client_timeout_s is not None:
            cache.ready_for_events()
        caches.append(cache)
    conn.send(("ready", None))
    while True:
        time.sleep(3600)


class _Replay(CacheListener):
    """Records what a reconnected durable client hears: ``(key, put index, replay)`` per
    event (values are the put's index as 8 bytes after the stamp) and the marker."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, bool]] = []
        self.live = False

    def _record(self, event: EntryEvent) -> None:
        value = event.new_value_bytes or b""
        self.events.append((event.key, int.from_bytes(value[8:16], "big"), not self.live))

    def after_create(self, event: EntryEvent) -> None:
        self._record(event)

    def after_update(self, event: EntryEvent) -> None:
        self._record(event)

    def after_region_live(self, event: object) -> None:
        self.live = True


def reconnect_durable(
    settings: dict[str, Any], region: str, index: int, timeout_s: float
) -> dict[str, Any]:
    """Reconnect the fleet's ``index``-th durable client, let its backlog replay, and say
    what it heard: ``state``, ``pending`` (events counted at connect), ``events`` (see
    :class:`_Replay`) and ``replay_s``.

    Raises:
        RegionBusError: the client could not connect or be made ready.
    """
    listener = _Replay()
    began = time.monotonic()
    cache = ClientCache(
        ClientSettings(
            **settings,
            durable_client_id=durable_id(index),
            durable_client_timeout_s=DURABLE_TIMEOUT_S,
        )
    )
    try:
        region_cache = cache.create_region(
            region, serializer=BytesSerializer(), listeners=[listener]
        )
        region_cache.register_interest(durable_keys(index), InterestResultPolicy.NONE, durable=True)
        cache.ready_for_events()
        deadline = time.monotonic() + timeout_s
        while not listener.live and time.monotonic() < deadline:
            time.sleep(0.01)
        cache.wait_for_quiet(idle_s=0.3, timeout_s=timeout_s)
        return {
            "state": cache.client_state,
            "pending": cache.pending_event_count,
            "events": list(listener.events),
            "live": listener.live,
            "replay_s": time.monotonic() - began,
        }
    finally:
        with suppress(Exception):
            cache.close(keep_alive=False)


def run_keyed_subscribers(
    conn: Connection,
    *,
    settings: dict[str, Any],
    region: str,
    keys: list[str],
    clients: int,
    idle_timeout_s: float,
) -> None:
    """Child: ``clients`` ClientCaches with interest in the same key list, each recording
    the latency of what it hears (``bench.workers.run_subscribers`` with keys, not
    ``ALL_KEYS``).

    Args:
        conn: The pipe to the parent.
        settings: ``ClientSettings`` fields.
        region: The region.
        keys: The keys of interest.
        clients: How many client caches.
        idle_timeout_s: After ``expect``, give up when nothing arrived for this long.
    """
    child_signals()
    caches: list[ClientCache] = []
    try:
        tallies = [Tally(True) for _ in range(clients)]
        for tally in tallies:
            cache = ClientCache(ClientSettings(**settings))
            caches.append(cache)
            cache.create_region(
                region, listeners=[CountingListener(tally)], serializer=BytesSerializer()
            ).register_interest(keys, InterestResultPolicy.NONE)
        cpu_start_s = time.process_time()
        conn.send(("ready", None))
        status = wait_until_done(conn, tallies, idle_timeout_s)
        conn.send(("result", tallies_result(tallies, status, cpu_start_s)))
    finally:
        for cache in caches:
            with suppress(Exception):
                cache.close()


def run_bystander(conn: Connection, *, settings: dict[str, Any], region: str) -> None:
    """Child: one client putting, each put sent once the last is answered, from ``ready``
    until ``stop``. Result: ``puts``, a ``(began, latency_ms)`` pair per put, ``began``
    being ``time.monotonic()`` (one clock for every process of the machine), so that the
    parent can tell which puts fell in which of its windows.

    Args:
        conn: The pipe to the parent.
        settings: ``ClientSettings`` fields.
        region: The region put to.
    """
    child_signals()
    cache = ClientCache(ClientSettings(**settings))
    try:
        bystander = cache.create_region(region, serializer=BytesSerializer())
        puts: list[tuple[float, float]] = []
        conn.send(("ready", None))
        i = 0
        while not conn.poll():
            began = time.monotonic()
            bystander.put(f"bystander-{i % 64}", stamped_value(24))
            puts.append((began, (time.monotonic() - began) * 1000))
            i += 1
        conn.recv()
        conn.send(("result", {"puts": puts}))
    finally:
        with suppress(Exception):
            cache.close()


__all__ = [
    "DURABLE_KEYS_PER_CLIENT",
    "durable_id",
    "durable_keys",
    "reconnect_durable",
    "run_bystander",
    "run_durable_registrations",
    "run_keyed_subscribers",
    "run_killable_clients",
]
