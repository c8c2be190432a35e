"""The server's hot path costs Redis one command per poll batch of entry changes and hash
slot, not one per operation: the changes of a batch go to Redis as one call of
``apply_entries.lua`` per slot (one on a single Redis, one per bucket on a Redis Cluster),
on one pipeline, without redis-py's ``SCRIPT EXISTS`` before each pipeline; and every
operation of the batch keeps what it had alone (duplicates by EventID, a read seeing the
changes before it, a Redis that lost its scripts). A region operation interrupted between
its buckets completes, when processed again, without clearing a bucket twice."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from support import wait_until

from regionbus.broker.server import CacheServer
from regionbus.broker.store import APPLY_CALL_MAX_CHANGES, ApplyResult, RegionStore
from regionbus.schemas.errors import TransportError
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import EventKind, OperationKind
from regionbus.schemas.naming import RedisKeys, bucket_of, entry_version, region_bucket

PUTS = 200


def _calls(client: Any, command: str) -> int:
    """Calls of ``command`` so far, over every master of a cluster."""
    if isinstance(client, RedisCluster):
        per_node = client.info("commandstats", target_nodes=RedisCluster.PRIMARIES)
        stats = list(per_node.values()) if isinstance(per_node, dict) else [per_node]
    else:
        stats = [client.info("commandstats")]
    return sum(int(s.get(f"cmdstat_{command}", {}).get("calls", 0)) for s in stats)


def _slots(client: Any, store: RegionStore, keys: list[str]) -> int:
    """Hash slots the keys' buckets are in: one on a single Redis."""
    if not isinstance(client, RedisCluster):
        return 1
    buckets = {bucket_of("r", key, 16) for key in keys}
    return len({key_slot(store.keys.tracking(b).encode()) for b in buckets})


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


@pytest.mark.redis_modes
def test_a_batch_of_puts_is_one_redis_command_per_slot_in_one_round_trip(
    redis_client: redis.Redis, namespace: str
) -> None:
    store = RegionStore(redis_client, namespace, 16)
    store.create_region("r")
    batch = [_put(store, f"k{i}", i) for i in range(PUTS)]
    store.run_batch(batch[:1])  # Redis loads the script on first use
    evalsha, script = _calls(redis_client, "evalsha"), _calls(redis_client, "script|exists")

    results = store.run_batch(batch[1:])

    slots = _slots(redis_client, store, [f"k{i}" for i in range(1, PUTS)])
    assert _calls(redis_client, "evalsha") - evalsha == slots
    assert _calls(redis_client, "script|exists") == script
    assert all(isinstance(r, ApplyResult) and r.status == "OK" for r in results)
    assert [r.event_kind for r in results if isinstance(r, ApplyResult)] == [EventKind.CREATE] * (
        PUTS - 1
    )
    assert len(store.entries("r")) == PUTS


@pytest.mark.redis_modes
def test_a_huge_batch_is_cut_into_calls_that_block_redis_briefly(
    redis_client: redis.Redis, namespace: str
) -> None:
    store = RegionStore(redis_client, namespace, 16)
    store.create_region("r")
    store.run_batch([_put(store, "first", 0)])
    evalsha = _calls(redis_client, "evalsha")
    count = 2 * APPLY_CALL_MAX_CHANGES + 1
    # one bucket, one slot: its changes need three calls of at most APPLY_CALL_MAX_CHANGES
    keys = [k for k in (f"k{i}" for i in range(100 * count)) if bucket_of("r", k, 16) == 3]

    results = store.run_batch([_put(store, k, i + 1) for i, k in enumerate(keys[:count])])

    assert _calls(redis_client, "evalsha") - evalsha == 3
    assert len(results) == count
    assert all(isinstance(r, ApplyResult) and r.status == "OK" for r in results)


@pytest.mark.redis_modes
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


@pytest.mark.redis_modes
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


@pytest.mark.redis_modes
def test_a_region_clear_interrupted_between_buckets_completes_without_clearing_one_twice(
    redis_client: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RegionStore(redis_client, namespace, 16)
    store.create_region("r")
    keys = [f"k{i}" for i in range(40)]
    store.run_batch([_put(store, k, i) for i, k in enumerate(keys)])
    home = region_bucket("r", 16)
    clear_id = EventID("admin", 7, 0, home)
    real_execute = store.execute
    steps: list[int] = []

    def dies_before_finishing(build: Any, written: Any = ()) -> list[Any]:
        steps.append(1)
        if len(steps) == 3:  # begun, every bucket cleared, not finished: the primary died
            raise TransportError("the primary died")
        return real_execute(build, written)

    monkeypatch.setattr(store, "execute", dies_before_finishing)
    with pytest.raises(TransportError):
        store.apply_region(OperationKind.CLEAR, "r", clear_id, home, 0)
    monkeypatch.setattr(store, "execute", real_execute)
    # A change made after the clear reached its bucket: the clear read again must keep it.
    (after,) = store.run_batch([_put(store, "k1", 1000, b"after")])

    again = store.apply_region(OperationKind.CLEAR, "r", clear_id, home, 0)
    duplicate = store.apply_region(OperationKind.CLEAR, "r", clear_id, home, 0)

    assert again.status == "OK" and again.event_kind is EventKind.REGION_CLEAR
    assert again.version == entry_version(1, 0)
    assert isinstance(after, ApplyResult) and after.version is not None
    assert after.version > again.version, "a change after the clear is newer than the clear"
    assert set(store.entries("r")) == {"k1"}
    assert store.get("r", "k1", bucket_of("r", "k1", 16))[1].value == b"after"  # type: ignore[union-attr]
    assert (duplicate.status, duplicate.version) == ("DUP", again.version)


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
    # One call per poll batch; one per put before (a thousand). A put_all goes a window
    # at a time (BULK_ENTRIES_IN_FLIGHT, sent BULK_SEND_GROUP at a time and split by
    # bucket), so a poll holds what arrived since the last: on a quiet machine about six
    # entries a call (~170 calls), more the busier the server (~55 under load).
    assert 0 < len(applies) <= len(entries) // 4, len(applies)
