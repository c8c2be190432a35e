"""Leases with fencing epochs and the member list, against a real Redis."""

from __future__ import annotations

import time

import pytest
import redis

from regionbus.runtime.leases import Lease, Membership

pytestmark = pytest.mark.redis_modes


def test_a_free_role_goes_to_one_member_with_a_new_epoch(
    redis_client: redis.Redis, namespace: str
) -> None:
    first = Lease(redis_client, namespace, "reaper", "m1", ttl_ms=5_000)
    second = Lease(redis_client, namespace, "reaper", "m2", ttl_ms=5_000)
    epoch = first.try_acquire()
    assert epoch == 1
    assert second.try_acquire() is None
    assert first.try_acquire() == 1, "re-acquiring one's own lease keeps the epoch"
    holder = second.holder()
    assert holder is not None and holder.member_id == "m1" and holder.epoch == 1


def test_a_lapsed_lease_is_taken_over_with_a_higher_epoch_and_the_old_holder_cannot_renew(
    redis_client: redis.Redis, namespace: str
) -> None:
    old = Lease(redis_client, namespace, "bucket:3", "old", ttl_ms=200)
    new = Lease(redis_client, namespace, "bucket:3", "new", ttl_ms=5_000)
    assert old.try_acquire() == 1
    time.sleep(0.4)
    assert new.try_acquire() == 2
    assert not old.renew()
    assert not old.held
    assert new.renew()
    assert int(redis_client.get(new.epoch_key) or 0) == 2


def test_release_frees_the_role_at_once(redis_client: redis.Redis, namespace: str) -> None:
    first = Lease(redis_client, namespace, "reaper", "m1", ttl_ms=60_000)
    second = Lease(redis_client, namespace, "reaper", "m2", ttl_ms=60_000)
    first.try_acquire()
    first.release()
    assert second.try_acquire() == 2


def test_live_members_are_listed_longest_lived_first_and_dead_ones_dropped(
    redis_client: redis.Redis, namespace: str
) -> None:
    older = Membership(redis_client, namespace, "older", ttl_ms=5_000)
    time.sleep(0.01)
    younger = Membership(redis_client, namespace, "younger", ttl_ms=5_000)
    dying = Membership(redis_client, namespace, "dying", ttl_ms=100)
    for member in (younger, dying, older):
        member.join()
    time.sleep(0.3)
    assert [m.member_id for m in older.live_members()] == ["older", "younger"]
    younger.leave()
    assert [m.member_id for m in older.live_members()] == ["older"]
