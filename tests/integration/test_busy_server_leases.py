"""A server slow but alive keeps its leases: they are renewed on a thread of their own,
and a loop tick does a bounded amount of work."""

from __future__ import annotations

import time
from concurrent.futures import wait
from typing import Any

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.schemas.callbacks import CacheWriter, EntryEvent
from regionbus.schemas.messages import CLIENT_RECONNECTED

_PUTS = 300


class BusyWriter(CacheWriter):
    """A server-side writer that keeps the CPU (and the GIL) busy for 20 ms per change."""

    def before_create(self, event: EntryEvent) -> None:
        until = time.perf_counter() + 0.02
        while time.perf_counter() < until:
            pass

    before_update = before_create


def test_a_server_busy_for_longer_than_its_lease_keeps_every_lease_and_its_durable_clients(
    server_settings: ServerSettings, client_factory: Any
) -> None:
    settings = server_settings.model_copy(update={"lease_ttl_ms": 2_000})
    with CacheServer(settings, writers={"r": [BusyWriter()]}) as server:
        away = client_factory(durable_client_id="desk", durable_client_timeout_s=120)
        away.create_region("r").register_interest(["k0"], durable=True)
        away.ready_for_events()
        away.close(keep_alive=True)
        region = client_factory(read_timeout_ms=120_000).create_region("r")
        # 300 changes at 20 ms each: three times the lease's TTL of work in one backlog.
        futures = [region.put_async(f"k{i}", i) for i in range(_PUTS)]
        done, _ = wait(futures, timeout=180)
        assert len(done) == _PUTS and all(f.exception() is None for f in futures)
        assert server.stats.buckets_lost == 0
        assert len(server.primary_buckets) == settings.total_buckets
        assert server.stats.durable_clients_expired == 0
        back = client_factory(durable_client_id="desk", durable_client_timeout_s=120)
        assert back.client_state == CLIENT_RECONNECTED
        assert back.pending_event_count >= 1
