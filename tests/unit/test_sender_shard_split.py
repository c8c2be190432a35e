"""The split of a gateway sender's queue into shards: which partitions a shard reads, the
settings that name it, its lease role and batch sequence id, and how status shows it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from regionbus.broker.status import _shard_holders
from regionbus.gateways.queue_reader import shard_partitions
from regionbus.gateways.sender_settings import GatewaySenderSettings
from regionbus.schemas.naming import sender_role, sender_shard_id


def test_the_shards_of_a_queue_read_each_partition_once_and_hold_about_as_many_each() -> None:
    shards = [shard_partitions(113, shard, 4) for shard in range(4)]
    assert sorted(p for owned in shards for p in owned) == list(range(113))
    assert [len(owned) for owned in shards] == [29, 28, 28, 28]
    assert shard_partitions(113, 0, 1) == list(range(113))
    assert shard_partitions(5, 7, 8) == []  # more shards than partitions: some read none


@pytest.mark.parametrize(("shard", "shards"), [(2, 2), (-1, 2), (0, 0)])
def test_a_shard_outside_its_count_is_refused(shard: int, shards: int) -> None:
    with pytest.raises(ValueError, match="a shard is 0 to shards - 1"):
        shard_partitions(10, shard, shards)
    with pytest.raises(ValidationError):
        GatewaySenderSettings(
            sender_id="to-b",
            distributed_system_id=1,
            remote_distributed_system_id=2,
            remote_namespace="b",
            remote_kafka_bootstrap_servers="127.0.0.1:9",
            shard=shard,
            shards=shards,
        )


def test_an_unsharded_sender_keeps_its_role_and_id_and_a_shard_gets_its_own() -> None:
    assert sender_role("to-b") == "gateway-sender:to-b"
    assert sender_shard_id("to-b") == "to-b"
    assert sender_role("to-b", 1, 3) == "gateway-sender:to-b/1"
    assert sender_shard_id("to-b", 1, 3) == "to-b.shard-1"


def test_status_names_each_shards_holder_with_the_highest_epoch() -> None:
    leases = {
        "gateway-sender:to-b/1": ("m2", 4),
        "gateway-sender:to-b/0": ("m1", 7),
        "gateway-sender:to-c": ("m3", 1),
        "gateway-sender:to-b2/0": ("m4", 9),  # another sender whose id starts alike
    }
    assert _shard_holders(leases, "gateway-sender:to-b") == ("m1 (shard 0), m2 (shard 1)", 7)
    assert _shard_holders(leases, "gateway-sender:to-d") == (None, 0)
