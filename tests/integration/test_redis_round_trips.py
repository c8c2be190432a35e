"""The server's hot path costs Redis one command per poll batch of entry changes, not one
per operation: the changes of a batch go to Redis as one call of ``apply_entries.lua``, on
one pipeline, without redis-py's ``SCRIPT EXISTS`` before each pipeline; and every
operation of the batch keeps what it had alone (duplicates by EventID, a read seeing the
changes before it, a Redis that lost its scripts)."""

from __future__ import annotations

import threading
from typing import Any

import redis
from support import wait_until

from regionbus.broker.server import CacheServer
from regionbus.broker.store import APPLY_CALL_MAX_CHANGES, ApplyResult, RegionStore
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import EventKind, OperationKind
from regionbus.schemas.naming import RedisKeys, bucket_of

PUTS = 200


def _calls(client: redis.Redis, command: str) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def _put(store: RegionStore, key: str, sequence: int, value: bytes = b"v") -> Any:
    bucket = bucket_of("r", key, 16)
    return store.entry_args(
        OperationKind.PUT,
        "r",
        key,
        value,
        "bytes",
        EventID("member", 1, sequence, bucket),
        bucket,
        sequence,
        False,
    )


def test_a_batch_of_puts_is_one_redis_command_in_one_round_trip(
    redis_client: redis.Redis, namespace: str
) -> None:
    store = RegionStore(redis_client, namespace, 16)
    store.create_region("r")
    batch = [_put(store, f"k{i}", i) for i in range(PUTS)]
    store.run_batch(batch[:1])  # Redis loads the script on first use
    evalsha, script = _calls(redis_client, "evalsha"), _calls(redis_client, "script|exists")

    results = store.run_batch(batch[1:])

    assert _calls(redis_client, "evalsha") - evalsha == 1
    assert _calls(redis_client, "script|exists") == script
    assert all(isinstance(r, ApplyResult) and r.status == "OK" for r in results)
    assert [r.event_kind for r in results if isinstance(r, ApplyResult)] == [EventKind.CREATE] * (
        PUTS - 1
    )
    assert len(store.entries("r")) == PUTS


def test_a_huge_batch_is_cut_into_calls_that_block_redis_briefly(
    redis_client: redis.Redis, namespace: str
) -> None:
    store = RegionStore(redis_client, namespace, 16)
    store.create_region("r")
    store.run_batch([_put(store, "first", 0)])
    evalsha = _calls(redis_client, "evalsha")
    count = 2 * APPLY_CALL_MAX_CHANGES + 1

    results = store.run_batch([_put(store, f"k{i}", i + 1) for i in range(count)])

    assert _calls(redis_client, "evalsha") - evalsha == 3
    assert len(results) == count
    assert all(isinstance(r, ApplyResult) and r.status == "OK" for r in results)


def test_every_operation_of_a_batch_keeps_its_own_semantics(
    redis_client: redis.Redis, namespace: str
) -> None:
    store = RegionStore(redis_client, namespace, 16)
    store.create_region("r")
    bucket = bucket_of("r", "a", 16)
    first, again = _put(store, "a", 0, b"1"), _put(store, "a", 0, b"2")
    later = _put(store, "a", 1, b"3")

    created, duplicate, read, updated = store.run_batch(
        [first, again, ("r", "a", bucket, None), later]
    )

    assert isinstance(created, ApplyResult) and created.status == "OK"
    assert isinstance(duplicate, ApplyResult) and duplicate.status == "DUP"
    assert duplicate.event_kind is EventKind.CREATE and duplicate.version == created.version
    exists, entry = read  # type: ignore[misc]
    assert exists and entry is not None and entry.value == b"1"
    assert isinstance(updated, ApplyResult) and updated.event_kind is EventKind.UPDATE
    assert store.get("r", "a", bucket)[1].value == b"3"  # type: ignore[union-attr]


def test_a_redis_that_lost_its_scripts_gets_them_again(
    redis_client: redis.Redis, namespace: str
) -> None:
    store = RegionStore(redis_client, namespace, 16)
    store.create_region("r")
    store.run_batch([_put(store, "before", 0)])
    redis_client.script_flush()

    (result,) = store.run_batch([_put(store, "after", 1)])

    assert isinstance(result, ApplyResult) and result.status == "OK"
    assert result.event_kind is EventKind.CREATE


def test_a_running_server_applies_many_puts_in_few_redis_commands(
    cache_server: CacheServer, client_factory: Any, namespace: str, redis_url: str
) -> None:
    entries = {f"k{i}": i for i in range(1000)}
    values_keys = [RedisKeys(namespace).region_values("r", b) for b in range(16)]
    end = f"{namespace}:monitor-end"
    applies: list[str] = []
    watching = threading.Event()

    def monitor() -> None:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        try:
            with client.monitor() as commands:
                watching.set()
                while True:
                    command = commands.next_command()["command"]
                    if end in command:
                        return
                    if command.startswith("EVALSHA") and any(k in command for k in values_keys):
                        applies.append(command)
        finally:
            client.close()

    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    wait_until(watching.is_set, 10, "MONITOR")
    region = client_factory().create_region("r")

    region.put_all(entries)

    ender = redis.Redis.from_url(redis_url)
    ender.get(end)
    ender.close()
    watcher.join(30)
    assert not watcher.is_alive()
    # One call per poll batch; one per put before (a thousand).
    assert 0 < len(applies) <= len(entries) // 20, len(applies)
