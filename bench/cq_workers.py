"""The continuous-query benchmark's subscriber processes: client caches that follow the
region with ``ALL_KEYS`` interest or with continuous queries, counting what arrives.

Values are JSON objects ``{"t": send time ns, "n": i, "pad": "x..."}`` (so the servers read
an attribute of each), the latency is read from ``t``. The pipe protocol is
:mod:`bench.workers`'s.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from contextlib import suppress
from multiprocessing.connection import Connection
from typing import Any

from bench.workers import Tally, child_signals, tallies_result, wait_until_done
from regionbus.clients import (
    ALL_KEYS,
    CacheListener,
    ClientCache,
    ClientSettings,
    CqAttributes,
    CqEvent,
    CqListener,
    EntryEvent,
    InterestResultPolicy,
)


def _hit(tally: Tally, value: Any) -> None:
    now_ns = time.time_ns()
    if not tally.count:
        tally.first_ns = now_ns
    tally.count += 1
    tally.last_ns = now_ns
    if tally.record_latency and isinstance(value, dict) and "t" in value:
        tally.sent_ns.append(int(value["t"]))
        tally.received_ns.append(now_ns)


class _InterestCounter(CacheListener):
    def __init__(self, tally: Tally) -> None:
        self._tally = tally

    def after_create(self, event: EntryEvent) -> None:
        _hit(self._tally, event.new_value)

    def after_update(self, event: EntryEvent) -> None:
        _hit(self._tally, event.new_value)


class _CqCounter(CqListener):
    def __init__(self, tally: Tally) -> None:
        self._tally = tally

    def on_event(self, event: CqEvent) -> None:
        _hit(self._tally, event.new_value)


def run_followers(
    conn: Connection,
    *,
    settings: dict[str, Any],
    region: str,
    clients: int,
    queries: Sequence[str],
    record_latency: bool,
    idle_timeout_s: float,
) -> None:
    """Child: ``clients`` client caches, each following ``region`` by ``ALL_KEYS`` interest
    (``queries`` empty) or by holding every query of ``queries`` as a running CQ; each
    client's tally counts its listener calls (one per CQ a change matches).

    Args:
        conn: The pipe to the parent.
        settings: ``ClientSettings`` fields.
        region: The region followed (JSON values).
        clients: How many client caches (each has its own subscription queue).
        queries: The CQs every client holds; empty for interest.
        record_latency: Keep send and receive times of every call.
        idle_timeout_s: After ``expect``, give up when nothing arrived for this long.
    """
    child_signals()
    caches: list[ClientCache] = []
    try:
        tallies = [Tally(record_latency) for _ in range(clients)]
        client_settings = ClientSettings(**settings)
        for tally in tallies:
            cache = ClientCache(client_settings, client_id=f"bench-cq-{uuid.uuid4().hex[:10]}")
            caches.append(cache)
            if not queries:
                cache.create_region(region, listeners=[_InterestCounter(tally)]).register_interest(
                    ALL_KEYS, InterestResultPolicy.NONE
                )
                continue
            cache.create_region(region)
            service = cache.query_service()
            for index, query in enumerate(queries):
                cq = service.new_cq(f"cq-{index}", query, CqAttributes([_CqCounter(tally)]))
                cq.execute()
        cpu_start_s = time.process_time()
        conn.send(("ready", None))
        status = wait_until_done(conn, tallies, idle_timeout_s)
        conn.send(("result", tallies_result(tallies, status, cpu_start_s)))
    finally:
        for cache in caches:
            with suppress(Exception):
                cache.close()


__all__ = ["run_followers"]
