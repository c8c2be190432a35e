"""A server ``CacheLoader`` (Geode read-through), end to end against a real Kafka and Redis:
a get's miss loads once, through the bucket's order, as a create every interested client
hears as a load; a failing, slow or late loader holds no other client."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support import Recorder, bystander_puts, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.broker.sql_loader import SqlLoader
from regionbus.clients import ALL_KEYS, ClientRegionShortcut
from regionbus.schemas.callbacks import CacheLoader, LoaderHelper
from regionbus.schemas.errors import CacheLoaderError


class CountingLoader(CacheLoader):
    """Loads ``{"loaded": key}`` after ``delay_s``, or raises for keys starting ``bad``, or
    answers None for keys starting ``none``; counts its calls per key."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.calls: dict[str, int] = {}
        self.release = threading.Event()
        self.release.set()
        self._lock = threading.Lock()

    def load(self, helper: LoaderHelper) -> Any:
        with self._lock:
            self.calls[helper.key] = self.calls.get(helper.key, 0) + 1
        self.release.wait(30)
        time.sleep(self.delay_s)
        if helper.key.startswith("bad"):
            raise ValueError(f"no {helper.key} in the system of record")
        if helper.key.startswith("none"):
            return None
        return {"loaded": helper.key}


@pytest.fixture
def loader() -> CountingLoader:
    return CountingLoader()


@pytest.fixture
def loading_server(
    server_settings: ServerSettings, loader: CountingLoader
) -> Iterator[CacheServer]:
    with CacheServer(
        server_settings.model_copy(update={"regions": ["r", "s"]}), loaders={"r": loader}
    ) as server:
        yield server


def _subscriber_and_reader(client_factory: Any) -> tuple[Recorder, Any]:
    """A subscriber's recorder (ALL_KEYS, values, on region ``r``) and a PROXY region of
    another client, whose gets go to the server."""
    recorder = Recorder()
    client_factory().create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
    return recorder, client_factory().create_region("r", ClientRegionShortcut.PROXY)


def _stored(server: CacheServer, key: str) -> Any:
    entry = server.store.entries("r").get(key)
    return "absent" if entry is None else entry.value


def test_a_miss_loads_once_creates_the_entry_and_subscribers_hear_a_load(
    loading_server: CacheServer, loader: CountingLoader, client_factory: Any
) -> None:
    recorder, reader = _subscriber_and_reader(client_factory)

    assert reader.get("k1") == {"loaded": "k1"}

    assert _stored(loading_server, "k1") == b'{"loaded":"k1"}'
    wait_until(lambda: len(recorder.snapshot()) == 1, what="the load's create")
    assert recorder.snapshot() == [("create", "k1", {"loaded": "k1"})]
    (event,) = recorder.events
    assert event.is_load and event.origin_remote  # type: ignore[union-attr]
    # Found on the server from now on: no second load.
    other = client_factory().create_region("r", ClientRegionShortcut.PROXY)
    assert other.get("k1") == {"loaded": "k1"}
    assert loader.calls == {"k1": 1}


def test_concurrent_misses_of_one_key_load_once(
    loading_server: CacheServer, loader: CountingLoader, client_factory: Any
) -> None:
    loader.release.clear()  # every get arrives while the first load is still running
    regions = [client_factory().create_region("r", ClientRegionShortcut.PROXY) for _ in range(3)]
    with ThreadPoolExecutor(30) as pool:
        answers = [pool.submit(regions[i % 3].get, "hot") for i in range(30)]
        wait_until(lambda: loader.calls.get("hot") == 1, what="the load to start")
        time.sleep(0.5)  # let the other gets reach the server and join the load
        loader.release.set()
        assert [a.result(30) for a in answers] == [{"loaded": "hot"}] * 30
    assert loader.calls == {"hot": 1}


def test_a_failing_loader_reaches_the_caller_typed_and_none_creates_nothing(
    loading_server: CacheServer, loader: CountingLoader, client_factory: Any
) -> None:
    reader = client_factory().create_region("r", ClientRegionShortcut.PROXY)
    with pytest.raises(CacheLoaderError, match="no bad-1 in the system of record"):
        reader.get("bad-1")
    assert reader.get("none-1") is None
    assert _stored(loading_server, "bad-1") == "absent"
    assert _stored(loading_server, "none-1") == "absent"
    # A region without a loader answers a miss as before.
    assert client_factory().create_region("s", ClientRegionShortcut.PROXY).get("x") is None


def test_a_put_that_comes_before_the_loaded_value_wins(
    loading_server: CacheServer, loader: CountingLoader, client_factory: Any
) -> None:
    recorder, reader = _subscriber_and_reader(client_factory)
    writer = client_factory().create_region("r", ClientRegionShortcut.PROXY)
    loader.release.clear()
    with ThreadPoolExecutor(1) as pool:
        got = pool.submit(reader.get, "raced")
        wait_until(lambda: loader.calls.get("raced") == 1, what="the load to start")
        writer.put("raced", {"put": True})
        loader.release.set()
        assert got.result(30) == {"put": True}
    assert _stored(loading_server, "raced") == b'{"put":true}'
    wait_until(lambda: len(recorder.snapshot()) >= 1, what="the put's create")
    time.sleep(0.5)
    assert recorder.snapshot() == [("create", "raced", {"put": True})]


def test_a_slow_loader_holds_no_other_client_and_a_late_one_fails_the_get(
    server_settings: ServerSettings, client_factory: Any
) -> None:
    slow = CountingLoader(delay_s=3.0)
    settings = server_settings.model_copy(
        update={"regions": ["r", "s"], "loader_timeout_ms": 1_500}
    )
    with CacheServer(settings, loaders={"r": slow}):
        victim = client_factory().create_region("s", ClientRegionShortcut.PROXY)
        reader = client_factory().create_region("r", ClientRegionShortcut.PROXY)
        with bystander_puts(victim, [f"v{i}" for i in range(10)], at_least=10) as latencies:
            began = time.monotonic()
            with pytest.raises(CacheLoaderError, match="loader_timeout_ms=1500"):
                reader.get("slow-1")
            waited_s = time.monotonic() - began
        assert 1.4 <= waited_s < 3.0, waited_s
        assert max(latencies) < 1.0, latencies


def test_too_many_pending_loads_are_refused_at_once(
    server_settings: ServerSettings, client_factory: Any
) -> None:
    held = CountingLoader()
    held.release.clear()
    settings = server_settings.model_copy(update={"max_pending_loads": 2, "loader_threads": 2})
    with CacheServer(settings, loaders={"r": held}):
        reader = client_factory().create_region("r", ClientRegionShortcut.PROXY)
        with ThreadPoolExecutor(2) as pool:
            pending = [pool.submit(reader.get, f"p{i}") for i in range(2)]
            wait_until(lambda: len(held.calls) == 2, what="two loads running")
            with pytest.raises(CacheLoaderError, match="max_pending_loads"):
                reader.get("p3")
            held.release.set()
            assert [p.result(30) for p in pending] == [{"loaded": "p0"}, {"loaded": "p1"}]


def test_the_sql_loader_reads_a_table_through_sqlalchemy(
    server_settings: ServerSettings, client_factory: Any, tmp_path: Path
) -> None:
    database = tmp_path / "prices.db"
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE prices (symbol TEXT PRIMARY KEY, price REAL)")
        db.execute("INSERT INTO prices VALUES ('ACME', 12.5), ('INIT', 3.0)")
    loader = SqlLoader(f"sqlite:///{database}", "prices", "symbol", "price")
    with CacheServer(server_settings, loaders={"r": loader}) as server:
        reader = client_factory().create_region("r", ClientRegionShortcut.PROXY)
        assert reader.get("ACME") == 12.5
        assert reader.get("NONE") is None
        assert server.store.entries("r").get("ACME").value == b"12.5"  # type: ignore[union-attr]


def test_a_load_that_finds_nothing_is_answered_as_soon_as_it_is_done(
    loading_server: CacheServer, client_factory: Any
) -> None:
    # Its answer leaves the server when the loader returns, not with the next message the
    # server reads (this client's next ping is 30 s away).
    reader = client_factory(ping_interval_ms=30_000).create_region("r", ClientRegionShortcut.PROXY)
    for key in ("none-1", "none-2"):
        began = time.monotonic()
        assert reader.get(key) is None
        assert time.monotonic() - began < 2.0
