"""Membership and leases in Redis: who is alive, since when, and who holds a role.

A *role* is anything exactly one server must do at a time: the primary of a bucket, the
durable-client reaper, a serial gateway sender. Its holder keeps a lease (``SET NX PX``)
whose value names the holder and a **fencing epoch** taken from ``INCR`` on the role's
epoch counter. Only the current epoch is valid: Lua scripts that change state for a role
compare the epoch they are given with the counter and refuse a stale one, so a holder
that was paused past its lease (and replaced) can change nothing when it wakes up.

Members register their start time; when a role is free, callers prefer the longest-lived
live member (docs/behaviour.md §4: the failover target is the longest-lived secondary).

Redis errors are translated into :class:`TransportError` at this boundary.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from regionbus.runtime.redis_connect import REDIS_ERRORS, redis_errors
from regionbus.runtime.redis_replication import ReplicaWait
from regionbus.runtime.redis_scripts import PipelinedScript, execute_with_scripts
from regionbus.schemas.errors import TransportError
from regionbus.schemas.naming import RedisKeys
from regionbus.schemas.redis_values import format_lease, parse_lease

_ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if current then
  local holder, epoch = string.match(current, '^(.*)|(%d+)$')
  if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(epoch)
  end
  return -1
end
local epoch = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. epoch, 'PX', ARGV[2])
return epoch
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] and redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_RENEW_SCRIPT = PipelinedScript(_RENEW)

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class Member(NamedTuple):
    """A live member: its id and start time (ms since the Unix epoch)."""

    member_id: str
    started_at_ms: int


class LeaseHolder(NamedTuple):
    """The current holder of a role and its fencing epoch."""

    member_id: str
    epoch: int


def wall_clock_ms() -> int:
    """Wall-clock time in ms since the Unix epoch: a stamp (an event's time, a member's
    start), never a measure of how long something took or is allowed to take: the wall
    clock may step (NTP, a VM resumed, skew between servers). Durations are timed on
    ``time.monotonic()`` or on Redis's clock."""
    return time.time_ns() // 1_000_000


class Membership:
    """This server's entry in the namespace's member list.

    Args:
        client: Redis connection.
        namespace: Site namespace.
        member_id: This member's id.
        ttl_ms: A member whose heartbeat is older than this is not live.
    """

    def __init__(self, client: Any, namespace: str, member_id: str, ttl_ms: int) -> None:
        self._redis = client
        self._keys = RedisKeys(namespace)
        self.member_id = member_id
        self.ttl_ms = ttl_ms
        self.started_at_ms = wall_clock_ms()

    def join(self) -> None:
        """Register with this process's start time and a first heartbeat.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors("cannot join the member list"):
            pipe = self._redis.pipeline()
            pipe.hset(self._keys.members, self.member_id, self.started_at_ms)
            pipe.set(self._keys.member_alive(self.member_id), 1, px=self.ttl_ms)
            pipe.execute()

    def heartbeat(self) -> None:
        """Prolong this member's liveness by ``ttl_ms``, registering it again if it had
        been removed as dead (its heartbeat lapsed while it was paused or Redis was down:
        another member's :meth:`live_members` then dropped it from the member list).

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors("member heartbeat failed"):
            pipe = self._redis.pipeline()
            pipe.hset(self._keys.members, self.member_id, self.started_at_ms)
            pipe.set(self._keys.member_alive(self.member_id), 1, px=self.ttl_ms)
            pipe.execute()

    def leave(self) -> None:
        """Remove this member (a clean stop); failures are ignored, the TTL covers them."""
        try:
            pipe = self._redis.pipeline()
            pipe.hdel(self._keys.members, self.member_id)
            pipe.delete(self._keys.member_alive(self.member_id))
            pipe.execute()
        except REDIS_ERRORS:
            pass

    def live_members(self) -> list[Member]:
        """Live members, longest-lived first (ties by id); dead entries are removed.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors("cannot read the member list"):
            registered = self._redis.hgetall(self._keys.members)
            ids = [k.decode() for k in registered]
            pipe = self._redis.pipeline()
            for member_id in ids:
                pipe.exists(self._keys.member_alive(member_id))
            alive = pipe.execute()
            dead = [m for m, a in zip(ids, alive, strict=True) if not a]
            if dead:
                self._redis.hdel(self._keys.members, *dead)
        members = [
            Member(m, int(registered[m.encode()])) for m, a in zip(ids, alive, strict=True) if a
        ]
        return sorted(members, key=lambda m: (m.started_at_ms, m.member_id))


class Lease:
    """One role's lease, as seen by one member.

    Args:
        client: Redis connection.
        namespace: Site namespace.
        role: Role name, e.g. ``"bucket:3"`` or ``"reaper"``.
        member_id: The member that wants or holds the role.
        ttl_ms: Lease time to live; the holder must renew well within it.
        replica_wait: Makes an acquisition wait for replicas (the fencing epoch it takes
            survives a Redis failover, so no later holder gets the same epoch); None waits
            for none.
    """

    def __init__(
        self,
        client: Any,
        namespace: str,
        role: str,
        member_id: str,
        ttl_ms: int,
        replica_wait: ReplicaWait | None = None,
    ) -> None:
        keys = RedisKeys(namespace)
        self._redis = client
        self.role = role
        self.member_id = member_id
        self.ttl_ms = ttl_ms
        self.lease_key = keys.lease(role)
        self.epoch_key = keys.epoch(role)
        self.epoch: int | None = None
        self._replica_wait = replica_wait
        self._acquire = PipelinedScript(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    @property
    def held(self) -> bool:
        """Whether this member believes it holds the role (until a renew says otherwise)."""
        return self.epoch is not None

    def try_acquire(self) -> int | None:
        """Take the role if it is free (or already ours).

        Returns:
            The fencing epoch now held, or None when another member holds the role.

        Raises:
            TransportError: Redis failed.
        """
        try:
            (epoch,) = execute_with_scripts(
                self._redis,
                lambda pipe: self._acquire.queue(
                    pipe, [self.lease_key, self.epoch_key], [self.member_id, self.ttl_ms]
                ),
                (self._acquire,),
                replica_wait=self._replica_wait,
                written_keys=[self.epoch_key],
            )
            epoch = int(epoch)
        except REDIS_ERRORS as exc:
            raise TransportError(f"lease {self.role}: acquire failed: {exc}") from exc
        except TransportError as exc:  # the replicas did not confirm the new epoch
            raise TransportError(f"lease {self.role}: acquire failed: {exc}") from exc
        self.epoch = epoch if epoch >= 0 else None
        return self.epoch

    def renew(self) -> bool:
        """Prolong the lease; False (and no longer held) if it lapsed or was taken over.

        Raises:
            TransportError: Redis failed (the lease is then considered lost).
        """
        if self.epoch is None:
            return False
        try:
            with redis_errors(f"lease {self.role}: renew failed"):
                ok = self._renew(
                    keys=[self.lease_key, self.epoch_key],
                    args=[format_lease(self.member_id, self.epoch), self.ttl_ms, self.epoch],
                )
        except TransportError:
            self.epoch = None
            raise
        if not ok:
            self.epoch = None
        return bool(ok)

    def _queue_renew(self, pipe: Any) -> None:
        """Queue this lease's renewal on ``pipe`` (it is held)."""
        assert self.epoch is not None
        _RENEW_SCRIPT.queue(
            pipe,
            [self.lease_key, self.epoch_key],
            [format_lease(self.member_id, self.epoch), self.ttl_ms, self.epoch],
        )

    def release(self) -> None:
        """Give the role up (a clean stop), so a successor need not wait for the TTL."""
        if self.epoch is None:
            return
        with contextlib.suppress(*REDIS_ERRORS):
            self._release(keys=[self.lease_key], args=[format_lease(self.member_id, self.epoch)])
        self.epoch = None

    def holder(self) -> LeaseHolder | None:
        """The current holder, or None when the role is free.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors(f"lease {self.role}: read failed"):
            raw = self._redis.get(self.lease_key)
        if raw is None:
            return None
        return LeaseHolder(*parse_lease(raw))


def renew_leases(client: Any, leases: Sequence[Lease]) -> list[bool]:
    """Renew many held leases in one Redis round trip (a pipeline of the renew script),
    as :meth:`Lease.renew` renews one: a lease that lapsed or was taken over is no longer
    held. A server renews every bucket lease it holds each quarter of the TTL; one call
    per lease made that timer grow with the buckets (at 113 buckets, 113 round trips
    every 1.25 s).

    Args:
        client: The Redis client the leases were made with (``redis.Redis`` or
            ``RedisCluster``: a lease's two keys share a hash slot).
        leases: The leases to renew; one not held is not sent and comes back False.

    Returns:
        Per lease, in order: whether it was renewed.

    Raises:
        TransportError: Redis failed; every lease given is then no longer held (as one
            failed :meth:`Lease.renew` each).
    """
    held = [lease for lease in leases if lease.epoch is not None]
    if not held:
        return [False] * len(leases)

    def build(pipe: Any) -> None:
        for lease in held:
            lease._queue_renew(pipe)

    try:
        with redis_errors("leases: renew failed"):
            replies = execute_with_scripts(client, build, (_RENEW_SCRIPT,))
    except TransportError:
        for lease in held:
            lease.epoch = None
        raise
    renewed = {id(lease): bool(reply) for lease, reply in zip(held, replies, strict=True)}
    for lease in held:
        if not renewed[id(lease)]:
            lease.epoch = None
    return [renewed.get(id(lease), False) for lease in leases]
