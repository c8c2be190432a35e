"""The Redis key layout: which keys share a Redis Cluster hash slot (docs/redis-cluster.md).

A Lua script or a transaction on a Redis Cluster must name keys of one slot only; these
tests pin the slot of every key the scripts and transactions take together.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest
from redis.crc import key_slot

from regionbus.schemas.naming import (
    REAPER_ROLE,
    VERSION_COUNTER_DIGITS,
    RedisKeys,
    bucket_of_role,
    bucket_role,
    dispatcher_role,
    entry_version,
    sender_role,
)

KEYS = RedisKeys("geode.site-1")


def _slot(key: str) -> int:
    return key_slot(key.encode())


def _bucket_keys(bucket: int) -> list[str]:
    k = KEYS
    region = "flights"
    return [
        k.regions(bucket),
        k.region_values(region, bucket),
        k.region_meta(region, bucket),
        k.region_gateway_versions(region, bucket),
        k.region_expiry(region, bucket),
        k.region_entry_times(region, bucket),
        k.region_expiry_claims(region, bucket),
        k.region_version(region, bucket),
        k.expiry_sequence(bucket),
        k.tracking(bucket),
        k.results(bucket),
        k.results_index(bucket),
        k.lease(bucket_role(bucket)),
        k.epoch(bucket_role(bucket)),
        k.secondaries(bucket),
        k.handoff(bucket),
    ]


@pytest.mark.parametrize("bucket", [0, 7, 15, 112])
def test_every_key_of_a_bucket_is_in_one_slot(bucket: int) -> None:
    keys = _bucket_keys(bucket)
    assert {_slot(key) for key in keys} == {_slot(keys[0])}, keys


def test_buckets_hash_on_their_own_tags() -> None:
    slots = {_slot(KEYS.tracking(b)) for b in range(16)}
    assert len(slots) > 8  # spread over the cluster, not piled on one slot


def test_the_control_state_shares_the_namespace_slot() -> None:
    keys = [
        KEYS.members,
        KEYS.member_alive("server-1"),
        KEYS.clients,
        KEYS.interest("desk"),
        KEYS.cqs("desk"),
        KEYS.lease(REAPER_ROLE),
        KEYS.epoch(REAPER_ROLE),
        KEYS.lease(sender_role("to-ny")),
        KEYS.epoch(dispatcher_role("db")),
        KEYS.prefix + "sec:principals",
    ]
    assert {_slot(key) for key in keys} == {_slot(KEYS.members)}, keys
    assert _slot(KEYS.members) not in {_slot(KEYS.tracking(b)) for b in range(16)}


def test_a_roles_lease_and_epoch_share_a_slot_and_a_buckets_role_is_parsed_back() -> None:
    for role in (bucket_role(3), REAPER_ROLE, sender_role("x"), dispatcher_role("y")):
        assert _slot(KEYS.lease(role)) == _slot(KEYS.epoch(role)), role
    assert bucket_of_role(bucket_role(42)) == 42
    assert bucket_of_role(REAPER_ROLE) is None
    assert bucket_of_role("bucket:x") is None


def test_two_namespaces_never_share_a_key() -> None:
    other = RedisKeys("geode.site-2")
    assert KEYS.tracking(0) != other.tracking(0) and KEYS.clients != other.clients


def test_an_entry_version_puts_the_generation_above_every_counter_of_the_one_before() -> None:
    assert entry_version(0, 41) == 41
    assert entry_version(1, 0) > entry_version(0, 10**VERSION_COUNTER_DIGITS - 1)
    assert entry_version(3, 5) == 3 * 10**VERSION_COUNTER_DIGITS + 5
    assert entry_version(9_200_000, 10**VERSION_COUNTER_DIGITS - 1) < 2**63


def test_the_lua_scripts_build_versions_with_the_same_number_of_digits() -> None:
    text = resources.files("regionbus.broker").joinpath("lua", "version.lua").read_text()
    match = re.search(r"local VERSION_DIGITS = (\d+)", text)
    assert match is not None and int(match.group(1)) == VERSION_COUNTER_DIGITS
