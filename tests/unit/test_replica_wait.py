"""How many Redis replicas a change waits for, and when a WAIT's answer does not count."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import redis

from regionbus.runtime.redis_replication import ReplicaWait, live_replicas_by_master
from regionbus.schemas.errors import ReplicationTimeoutError


def _node(port: int, role: str, health: str) -> dict[bytes, Any]:
    return {
        b"id": f"id-{port}".encode(),
        b"port": port,
        b"ip": b"127.0.0.1",
        b"endpoint": b"127.0.0.1",
        b"role": role.encode(),
        b"replication-offset": 0,
        b"health": health.encode(),
    }


def test_a_master_counts_the_replicas_not_marked_failed() -> None:
    shards = [
        {
            b"slots": [0, 5460],
            b"nodes": [_node(1, "master", "online"), _node(4, "replica", "online")],
        },
        # A replica still syncing is waited for: it acknowledges once loaded.
        {
            b"slots": [5461, 10922],
            b"nodes": [_node(2, "master", "online"), _node(5, "replica", "loading")],
        },
        # The master died and its replica was promoted: nothing left to wait for.
        {
            b"slots": [10923, 16383],
            b"nodes": [_node(3, "master", "fail"), _node(6, "master", "online")],
        },
    ]

    assert live_replicas_by_master(shards) == {"127.0.0.1:1": 1, "127.0.0.1:2": 1, "127.0.0.1:6": 0}


def test_a_shard_reply_under_the_answering_nodes_name_is_read_the_same() -> None:
    shards = [
        {
            b"slots": [0, 16383],
            b"nodes": [_node(1, "master", "online"), _node(2, "replica", "fail")],
        }
    ]

    assert live_replicas_by_master({"127.0.0.1:1": shards}) == {"127.0.0.1:1": 0}


def _single(replicas: int) -> ReplicaWait:
    return ReplicaWait(redis.Redis(), replicas, 500)


class _Pipe:
    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any, **options: Any) -> None:
        self.commands.append(args)


def test_one_redis_waits_for_the_replicas_asked_for_after_the_writes() -> None:
    pipe = _Pipe()

    assert _single(2).queue(pipe, ["k"]) == [2]
    assert pipe.commands == [("WAIT", 2, 500)]
    assert _single(0).queue(_Pipe(), ["k"]) == []
    reads = _Pipe()
    assert _single(2).queue(reads, []) == [] and reads.commands == []


def test_fewer_confirmations_or_a_failed_wait_do_not_acknowledge() -> None:
    waits, pipe = _single(1), SimpleNamespace()
    waits.check(pipe, [1], [1])
    waits.check(pipe, [], [])
    with pytest.raises(ReplicationTimeoutError, match="0 of 1"):
        waits.check(pipe, [1], [0])
    with pytest.raises(ReplicationTimeoutError, match="WAIT failed"):
        waits.check(pipe, [1], [redis.ConnectionError("gone")])
