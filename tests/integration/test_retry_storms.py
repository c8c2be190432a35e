"""A slow server is not buried under resends: a client backs off, resends only to buckets
gone quiet and bounds what it resends; every request, pipelined or not, has a deadline."""

from __future__ import annotations

import time
from concurrent.futures import wait
from typing import Any

import pytest

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients.resend import MAX_RESENDS_IN_FLIGHT
from regionbus.schemas.callbacks import CacheWriter, EntryEvent
from regionbus.schemas.errors import ServerTimeoutError

pytestmark = pytest.mark.abuse

_PUTS = 1500


class SlowWriter(CacheWriter):
    """A server-side writer that takes 3 ms per change: a server slower than its clients."""

    def before_create(self, event: EntryEvent) -> None:
        time.sleep(0.003)

    before_update = before_create


def test_a_burst_at_a_short_retry_interval_makes_a_bounded_number_of_duplicates(
    server_settings: ServerSettings, client_factory: Any
) -> None:
    with CacheServer(server_settings, writers={"r": [SlowWriter()]}) as server:
        cache = client_factory(retry_interval_ms=300, read_timeout_ms=60_000)
        region = cache.create_region("r")
        started = time.monotonic()
        futures = [region.put_async(f"k{i}", i) for i in range(_PUTS)]
        done, _ = wait(futures, timeout=120)
        elapsed_s = time.monotonic() - started
        assert len(done) == _PUTS and all(f.exception() is None for f in futures)
        # The backlog took several retry intervals to work through...
        assert elapsed_s > 5 * 0.3
        # ...yet the resends stayed within the bound (at most the cap resent at once, each
        # sent again only after the servers went quiet), where every pass used to resend
        # every change older than 300 ms (2,700 resends for these 1,500 puts).
        print(
            f"{_PUTS} puts in {elapsed_s:.1f} s: {cache.pool.retries} resends, "
            f"{server.stats.duplicates} duplicates seen by the server"
        )
        assert cache.pool.retries <= 2 * MAX_RESENDS_IN_FLIGHT
        assert server.stats.duplicates <= 2 * MAX_RESENDS_IN_FLIGHT
        assert server.stats.operations_applied == _PUTS


def test_a_pipelined_put_fails_at_read_timeout_when_no_server_answers(
    cache_server: CacheServer, client_factory: Any
) -> None:
    cache = client_factory(read_timeout_ms=2_000, retry_interval_ms=300)
    region = cache.create_region("r")
    region.put("warm", 0)
    cache_server.stop()
    started = time.monotonic()
    future = region.put_async("k", 1)
    with pytest.raises(ServerTimeoutError):
        future.result(timeout=30)
    assert time.monotonic() - started < 2.0 + 2.0
