"""A one-shot query runs on a worker thread, never on the server's loop: a client whose
queries read every entry for seconds leaves another client's puts their pace, and a client
asking more queries than a server holds pending is refused at once, typed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import bystander_puts

from regionbus import RequestLimitError
from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ClientCache, ClientRegionShortcut

pytestmark = pytest.mark.abuse

_HEAVY = "SELECT * FROM /r x WHERE x.s LIKE '%a%b%c%d%e%f%g%h%' ORDER BY x.n DESC LIMIT 5"
"""Reads and matches every entry of each bucket (no entry matches: all are read)."""


def test_long_queries_leave_another_clients_puts_their_pace(
    server_settings: ServerSettings, client_factory: Callable[..., ClientCache]
) -> None:
    settings = server_settings.model_copy(
        update={
            "regions": ["r", "s"],
            "total_buckets": 4,
            "query_max_execution_time_ms": 60_000,
            "query_max_rows_per_bucket": 100_000,
        }
    )
    with CacheServer(settings):
        loader = client_factory(read_timeout_ms=120_000)
        region = loader.create_region("r", ClientRegionShortcut.PROXY)
        for start in range(0, 20_000, 5_000):
            region.put_all(
                {f"k{i:05d}": {"s": "xy" * 20, "n": i} for i in range(start, start + 5_000)}
            )
        service = loader.query_service()
        began = time.monotonic()
        assert service.new_query(_HEAVY).execute() == []
        one_query_s = time.monotonic() - began
        victim = client_factory().create_region("s", ClientRegionShortcut.PROXY)
        stop = threading.Event()

        def query_until_stopped() -> int:
            ran = 0
            while not stop.is_set():
                service.new_query(_HEAVY).execute()
                ran += 1
            return ran

        with ThreadPoolExecutor(2) as pool:
            running = [pool.submit(query_until_stopped) for _ in range(2)]
            with bystander_puts(victim, [f"v{i}" for i in range(10)], at_least=20) as latencies:
                time.sleep(max(3.0, 2 * one_query_s))
            stop.set()
            assert all(r.result(120) >= 1 for r in running)
        # Each query holds a server for about one_query_s; on its loop, every put behind it
        # would have waited that long.
        assert max(latencies) < max(1.0, one_query_s / 2), (one_query_s, latencies)


def test_more_queries_than_a_server_holds_pending_are_refused_typed(
    server_settings: ServerSettings, client_factory: Callable[..., ClientCache]
) -> None:
    settings = server_settings.model_copy(
        update={
            "total_buckets": 4,
            "max_pending_queries": 4,
            "query_threads": 1,
            "query_max_execution_time_ms": 60_000,
            "query_max_rows_per_bucket": 100_000,
        }
    )
    with CacheServer(settings):
        cache = client_factory(read_timeout_ms=120_000)
        region = cache.create_region("r", ClientRegionShortcut.PROXY)
        region.put_all({f"k{i:05d}": {"s": "xy" * 20, "n": i} for i in range(5_000)})
        service = cache.query_service()
        with ThreadPoolExecutor(4) as pool:
            outcomes = [pool.submit(service.new_query(_HEAVY).execute) for _ in range(4)]
            refused = [f.exception(120) for f in outcomes]
        # Four queries of four buckets each: at most four bucket parts wait on the server.
        assert any(isinstance(e, RequestLimitError) for e in refused), refused
        assert all(e is None or isinstance(e, RequestLimitError) for e in refused), refused
