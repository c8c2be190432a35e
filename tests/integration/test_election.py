"""Leases with fencing epochs and the member list, against a real Redis."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from regionbus.runtime.leases import Lease, Membership, renew_leases

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


class _Pipelines:
    """The Redis client, counting the pipelines run; any other call is refused (a command
    sent alone would be one more round trip)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.executed = 0

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        pipe = self._client.pipeline(*args, **kwargs)
        execute = pipe.execute

        def counted(*a: Any, **k: Any) -> Any:
            self.executed += 1
            return execute(*a, **k)

        pipe.execute = counted
        return pipe

    def script_load(self, source: str) -> Any:
        return self._client.script_load(source)


def test_many_leases_are_renewed_in_one_round_trip_and_a_lapsed_one_is_no_longer_held(
    redis_client: redis.Redis, namespace: str
) -> None:
    """A server renews every bucket lease it holds each quarter of the TTL: one Redis call
    per lease made that grow with the buckets."""
    mine = [Lease(redis_client, namespace, f"bucket:{b}", "m1", ttl_ms=5_000) for b in range(64)]
    for lease in mine:
        assert lease.try_acquire() == 1
    lapsing = Lease(redis_client, namespace, "bucket:64", "m1", ttl_ms=200)
    assert lapsing.try_acquire() == 1
    never = Lease(redis_client, namespace, "bucket:65", "m1", ttl_ms=5_000)
    time.sleep(0.4)
    taker = Lease(redis_client, namespace, "bucket:64", "m2", ttl_ms=5_000)
    assert taker.try_acquire() == 2
    # The scripts are loaded by the first call (NOSCRIPT, then the pipeline again).
    renew_leases(redis_client, mine[:1])
    counting = _Pipelines(redis_client)
    renewed = renew_leases(counting, [*mine, lapsing, never])
    assert renewed == [True] * 64 + [False, False]
    assert counting.executed == 1
    assert all(lease.held for lease in mine)
    assert not lapsing.held and not never.held
    # Unrenewed, they would have under 4,600 ms left after the 400 ms sleep.
    assert all(int(redis_client.pttl(lease.lease_key)) > 4_700 for lease in mine)
    assert taker.renew(), "the new holder keeps the role"


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
