"""The asyncio face of the client (``regionbus.aio``) against a real Kafka and Redis:
awaitable operations and function executions, ``async for`` over a region's and a CQ's
events, and the back-pressure a full stream puts on the subscription thread."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import Recorder, wait_until
from test_function_execution import Failing, Member, Sleeping, Where

from regionbus import (
    ClientRegionShortcut,
    FunctionError,
    FunctionNotRegisteredError,
    ResultCollector,
)
from regionbus.aio import AsyncClientCache, AsyncFunctionService
from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS
from regionbus.schemas.naming import bucket_of


def _connect(namespace: str, kafka: str) -> Any:
    return AsyncClientCache.connect(
        namespace=namespace,
        kafka_bootstrap_servers=kafka,
        fetch_wait_max_ms=50,
        read_timeout_ms=30_000,
    )


def test_awaitable_operations_answer_as_the_threaded_ones(
    cache_server: CacheServer, namespace: str, kafka_bootstrap_servers: str
) -> None:
    async def main() -> None:
        async with await _connect(namespace, kafka_bootstrap_servers) as cache:
            region = cache.create_region("r")
            await region.put("a", {"n": 1})
            assert await region.get("a") == {"n": 1}
            assert await region.put_if_absent("a", {"n": 2}) == {"n": 1}
            assert await region.replace("a", {"n": 1}, {"n": 3}) is True
            await region.put_all({"b": 2, "c": 3})
            assert await region.get_all(["a", "b", "zz"]) == {"a": {"n": 3}, "b": 2, "zz": None}
            assert await region.size_on_server() == 3
            assert await region.remove("b", 2) is True
            await region.destroy("c")
            assert await region.contains_key_on_server("c") is False
            assert sorted(await region.keys_on_server()) == ["a"]
        assert cache.cache.closed

    asyncio.run(main())
    assert cache_server.store.entries("r")["a"].value == b'{"n":3}'


def test_a_full_stream_holds_the_subscription_thread_until_consumed(
    cache_server: CacheServer,
    namespace: str,
    kafka_bootstrap_servers: str,
    client_factory: Any,
) -> None:
    writer = client_factory().create_region("r")
    recorder = Recorder()
    count = 20

    async def main() -> list[tuple[str, Any]]:
        async with await _connect(namespace, kafka_bootstrap_servers) as cache:
            region = cache.create_region("r", listeners=[recorder])
            await region.register_interest(ALL_KEYS)
            got: list[tuple[str, Any]] = []
            async with region.events(max_buffered=2) as events:
                await asyncio.to_thread(writer.put_all, {f"k{i}": i for i in range(count)})
                # Two events wait in the stream; the subscription thread is held in the
                # third's hand-over, after the listener before the stream heard it.
                await asyncio.to_thread(
                    wait_until, lambda: len(recorder.snapshot()) >= 3, what="three events"
                )
                await asyncio.sleep(0.5)
                assert len(recorder.snapshot()) == 3
                async for event in events:
                    got.append((event.key, event.new_value))
                    if len(got) == count:
                        break
            # Closed: the listener is gone, and later events reach only the others.
            assert events.closed
            await asyncio.to_thread(writer.put, "after", 1)
            await asyncio.to_thread(
                wait_until,
                lambda: any(c[1] == "after" for c in recorder.snapshot()),
                what="an event after the stream closed",
            )
            return got

    got = asyncio.run(main())
    assert sorted(got) == sorted((f"k{i}", i) for i in range(count))


def test_a_continuous_querys_events_stream(
    cache_server: CacheServer, namespace: str, kafka_bootstrap_servers: str, client_factory: Any
) -> None:
    writer = client_factory().create_region("r")

    async def main() -> list[Any]:
        async with await _connect(namespace, kafka_bootstrap_servers) as cache:
            cache.create_region("r")  # a CQ's region is defined locally first, as in Geode
            cq = await cache.new_cq("big", "SELECT * FROM /r v WHERE v > 100")
            await cq.execute()
            for key, value in (("small", 1), ("big1", 500), ("big1", 50)):
                await asyncio.to_thread(writer.put, key, value)
            seen = []
            deadline = time.monotonic() + 60
            async for event in cq.events():
                seen.append((event.key, event.query_operation.name, event.new_value))
                if len(seen) == 2 or time.monotonic() > deadline:
                    break
            await cq.close()
            assert cq.events().closed
            return seen

    assert asyncio.run(main()) == [("big1", "CREATE", 500), ("big1", "DESTROY", 50)]


_ENTRIES = {f"k{i:02d}": i for i in range(40)}


@pytest.fixture
def function_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    functions = [Where(), Member(), Sleeping(), Failing()]
    with CacheServer(server_settings, functions=functions) as server:
        yield server


def test_function_executions_are_awaited_as_the_threaded_ones_answer(
    function_server: CacheServer, namespace: str, kafka_bootstrap_servers: str
) -> None:
    filter_keys = ["k01", "k02", "k03"]
    buckets = {bucket_of("r", k, 16) for k in filter_keys}
    assert len(buckets) > 1, "the filter should span buckets"

    class Listing(ResultCollector):
        def __init__(self) -> None:
            self.results: list[Any] = []

        def add_result(self, member_id: str, result: Any) -> None:
            self.results.append(result)

        def get_result(self, timeout_ms: int | None = None) -> list[Any]:
            return self.results

    async def main() -> None:
        async with await _connect(namespace, kafka_bootstrap_servers) as cache:
            region = cache.create_region("r", ClientRegionShortcut.PROXY)
            await region.put_all(_ENTRIES)
            execution = AsyncFunctionService.on_region(region)

            filtered = await execution.with_filter(filter_keys).set_arguments([7]).execute("where")
            results = filtered.get_result()
            assert sorted(r["bucket"] for r in results) == sorted(buckets)
            for result in results:
                in_bucket = [k for k in _ENTRIES if bucket_of("r", k, 16) == result["bucket"]]
                assert result["keys"] == sorted(in_bucket)
                assert result["filter"] == sorted(
                    k for k in filter_keys if bucket_of("r", k, 16) == result["bucket"]
                )
                assert result["arguments"] == [7]

            everywhere = (await execution.execute("where")).get_result()
            assert sorted(r["bucket"] for r in everywhere) == list(range(16))

            members = (await AsyncFunctionService.on_servers(cache).execute("member")).get_result()
            assert members == [function_server.settings.member_id]

            listing = Listing()
            collected = await execution.with_collector(listing).set_arguments(0).execute("sleeping")
            assert collected is listing and listing.get_result() == [True] * 16

            with pytest.raises(FunctionError, match="ValueError: no flights on the moon"):
                await execution.with_filter(["k01"]).set_arguments("raise").execute("failing")
            with pytest.raises(FunctionNotRegisteredError):
                await execution.execute("no-such-function")
            with pytest.raises(FunctionError, match="Cannot specify filter"):
                AsyncFunctionService.on_servers(cache).with_filter(["k01"])

    asyncio.run(main())


def test_the_event_loop_runs_on_while_a_function_executes(
    function_server: CacheServer, namespace: str, kafka_bootstrap_servers: str
) -> None:
    async def main() -> tuple[list[Any], int]:
        async with await _connect(namespace, kafka_bootstrap_servers) as cache:
            region = cache.create_region("r", ClientRegionShortcut.PROXY)
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.05)
                    ticks += 1

            ticker = asyncio.create_task(tick())
            execution = AsyncFunctionService.on_region(region).with_filter(["k01"])
            collector = await execution.set_arguments(1.5).execute("sleeping")
            ticker.cancel()
            return collector.get_result(), ticks

    results, ticks = asyncio.run(main())
    assert results == [True]
    # 1.5 s of the function at a tick every 50 ms: the loop was not held by the wait.
    assert ticks >= 10
