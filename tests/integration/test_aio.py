"""The asyncio face of the client (``regionbus.aio``) against a real Kafka and Redis:
awaitable operations, ``async for`` over a region's and a CQ's events, and the
back-pressure a full stream puts on the subscription thread."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from support import Recorder, wait_until

from regionbus.aio import AsyncClientCache
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS


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
