"""Bucket primaries and secondaries: which server processes which bucket (docs/behaviour.md §4).

The leases this server holds are renewed, and its member entry heartbeated, by
:meth:`BucketElection.renew_held` on a thread of their own (:meth:`keep_leases`), so a loop
busy with work cannot let them lapse; a lease it cannot renew is lost at once, and the
loop learns it from :meth:`take_lost` before it processes anything more. Every server runs
:meth:`BucketElection.tick` from its loop: from one pipelined read of every bucket's lease,
handoff note and secondaries:

- **failover**: a bucket whose lease lapsed is taken by the longest-lived live secondary
  of that bucket (docs/behaviour.md §4); with no live secondary (redundancy 0, or none left), by the
  live member with the fewest primaries, so failover completes even when redundancy
  cannot be restored;
- **redundancy**: a bucket with fewer than ``redundancy`` live secondaries gets the live
  non-primary member with the fewest secondaries (a Lua script adds it only while the set
  is short, so racing servers cannot over-fill it); a new server thereby restores
  redundancy after a failover;
- **balance**: a server holding two or more primaries more than another (and more than
  ``floor(buckets / members)``) hands buckets over cleanly: the caller flushes and commits the
  bucket first, then the lease is released with a handoff note naming the receiver.

Each lease carries a fencing epoch (:mod:`regionbus.runtime.leases`) that the region scripts check.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from regionbus.runtime.leases import Lease, Member, Membership, renew_leases
from regionbus.runtime.redis_connect import redis_errors
from regionbus.runtime.redis_replication import ReplicaWait
from regionbus.schemas.errors import TransportError
from regionbus.schemas.naming import RedisKeys, bucket_role
from regionbus.schemas.redis_values import parse_lease

log = logging.getLogger("regionbus.server")

# Add ARGV[1] to the secondaries set KEYS[1] only while it has fewer than ARGV[2] members.
_ADD_SECONDARY = """
if redis.call('SCARD', KEYS[1]) < tonumber(ARGV[2]) then
  return redis.call('SADD', KEYS[1], ARGV[1])
end
return 0
"""


@dataclass(frozen=True)
class BucketView:
    """One bucket as the last tick saw it.

    Attributes:
        bucket: The bucket.
        primary: Member id of the primary, or None while the lease is free.
        epoch: The primary's fencing epoch (0 when free).
        secondaries: Live secondaries, longest-lived first.
    """

    bucket: int
    primary: str | None
    epoch: int
    secondaries: tuple[str, ...]


@dataclass
class TickResult:
    """What a tick changed for this server.

    Attributes:
        gained: Buckets this server became primary of (with their epochs).
        lost: Buckets whose lease this server lost (another may hold them already).
        to_hand_over: Buckets the caller should flush, commit and then pass to
            :meth:`BucketElection.hand_over` (``bucket -> receiving member``).
    """

    gained: dict[int, int] = field(default_factory=dict)
    lost: set[int] = field(default_factory=set)
    to_hand_over: dict[int, str] = field(default_factory=dict)


def choose_taker(
    handoff: str | None,
    live_secondaries: list[str],
    live: set[str],
    primaries_of: dict[str, int],
    rank: dict[str, int],
) -> str | None:
    """Who should take a free bucket.

    Args:
        handoff: The member a clean handoff named, if any.
        live_secondaries: The bucket's live secondaries, longest-lived first.
        live: Every live member.
        primaries_of: Primaries each live member holds now.
        rank: Each live member's age rank (0 = longest-lived).

    Returns:
        The handoff's receiver when it is live; else the longest-lived live secondary
        (docs/behaviour.md §4); else the live member with the fewest primaries (the older on a tie),
        so failover completes even when redundancy cannot be restored; None with no live
        member.
    """
    if handoff is not None and handoff in live:
        return handoff
    if live_secondaries:
        return live_secondaries[0]
    if not live:
        return None
    return min(live, key=lambda m: (primaries_of[m], rank[m]))


def secondary_candidates(
    view: BucketView,
    redundancy: int,
    live: set[str],
    secondaries_of: dict[str, int],
    rank: dict[str, int],
) -> list[str]:
    """The members that should become secondaries of a bucket short of ``redundancy``:
    live non-primary non-secondaries with the fewest secondaries (the older on a tie), as
    many as are missing; none for a bucket without a primary."""
    missing = redundancy - len(view.secondaries)
    if missing <= 0 or view.primary is None:
        return []
    candidates = sorted(
        (m for m in live if m != view.primary and m not in view.secondaries),
        key=lambda m: (secondaries_of[m], rank[m]),
    )
    return candidates[:missing]


def buckets_to_hand_over(
    me: str,
    owned: Iterable[int],
    primaries_of: dict[str, int],
    rank: dict[str, int],
    total_buckets: int,
) -> dict[int, str]:
    """Buckets ``me`` should hand over, and to whom, to even out the primaries.

    ``me`` gives buckets (highest number first) to the member with the fewest primaries
    while it holds more than ``floor(total_buckets / members)`` and at least two more than
    that member, so two servers never hand a bucket back and forth.

    Returns:
        ``{bucket: receiving member}``; empty with fewer than two members.
    """
    if len(primaries_of) < 2:
        return {}
    floor_share = total_buckets // len(primaries_of)
    counts = dict(primaries_of)
    mine = sorted(owned, reverse=True)
    out: dict[int, str] = {}
    while mine and counts[me] > floor_share:
        receiver = min(counts, key=lambda m: (counts[m], rank[m]))
        if counts[me] - counts[receiver] <= 1:
            break
        out[mine.pop(0)] = receiver
        counts[me] -= 1
        counts[receiver] += 1
    return out


def buckets_unready_reason(views: list[BucketView], total_buckets: int) -> str | None:
    """Why a server is not ready for its buckets' sake: no election tick yet, or buckets
    without a primary in the last one (a failover under way); None when every bucket has
    one (this server's readiness probe, :meth:`regionbus.broker.server.CacheServer.readiness`).

    Args:
        views: The buckets as the last tick saw them (:attr:`BucketElection.views`).
        total_buckets: The namespace's number of buckets.
    """
    if len(views) < total_buckets:
        return "no bucket election yet"
    free = [v.bucket for v in views if v.primary is None]
    if not free:
        return None
    shown = ", ".join(str(b) for b in free[:8]) + (", ..." if len(free) > 8 else "")
    return f"{len(free)} of {total_buckets} buckets have no primary ({shown})"


class BucketElection:
    """This server's view of, and part in, the bucket election.

    Args:
        client: Redis connection.
        namespace: Site namespace.
        member_id: This server's member id.
        total_buckets: Number of buckets.
        redundancy: Secondaries wanted per bucket (Geode ``subscription-redundancy``,
            default 0).
        lease_ttl_ms: Lease and member liveness time to live; a dead primary's buckets move
            after at most this long (plus one tick).
        replica_wait: Makes lease acquisitions wait for Redis replicas (see
            :class:`regionbus.runtime.leases.Lease`); None waits for none.
    """

    def __init__(
        self,
        client: Any,
        namespace: str,
        member_id: str,
        total_buckets: int,
        redundancy: int,
        lease_ttl_ms: int,
        replica_wait: ReplicaWait | None = None,
    ) -> None:
        self._redis = client
        self._keys = RedisKeys(namespace)
        self.member_id = member_id
        self.total_buckets = total_buckets
        self.redundancy = redundancy
        self.lease_ttl_ms = lease_ttl_ms
        self.membership = Membership(client, namespace, member_id, lease_ttl_ms)
        self._leases = {
            b: Lease(client, namespace, bucket_role(b), member_id, lease_ttl_ms, replica_wait)
            for b in range(total_buckets)
        }
        self._add_secondary = client.register_script(_ADD_SECONDARY)
        self.members: list[Member] = []
        self.views: list[BucketView] = []
        # The renewing thread and the loop both change leases' epochs.
        self._lock = threading.Lock()
        self._lost: set[int] = set()
        self._valid_until_s: dict[int, float] = {}
        """``{bucket: monotonic s}`` until which a held lease is surely still ours: the start
        of its last successful renewal (or acquisition) plus the TTL."""
        self._scan_after_s = 0.0
        """Monotonic s before which no held lease can lapse (the earliest of
        ``_valid_until_s`` at the last scan, lowered by an acquisition): until then
        :meth:`take_lost`, called before every message, need not look at every lease."""

    @property
    def owned(self) -> dict[int, int]:
        """Buckets this server is primary of, with its fencing epoch of each."""
        with self._lock:
            return {b: lease.epoch for b, lease in self._leases.items() if lease.epoch is not None}

    def renew_held(self) -> None:
        """Heartbeat this member and renew every lease it holds; a lease not renewed (lapsed,
        taken over, or Redis failed) is no longer held and is reported by :meth:`take_lost`.

        Raises:
            TransportError: the heartbeat failed (the leases were still tried).
        """
        with self._lock:
            held = [(bucket, lease) for bucket, lease in self._leases.items() if lease.held]
            started = time.monotonic()
            try:
                # One round trip for all of them: the renewal time stays flat in the buckets.
                renewed = renew_leases(self._redis, [lease for _, lease in held])
            except TransportError as exc:
                log.warning("%s: %s", self.member_id, exc)
                renewed = [False] * len(held)
            for (bucket, _), ok in zip(held, renewed, strict=True):
                if ok:
                    self._valid_until_s[bucket] = started + self.lease_ttl_ms / 1000
                else:
                    log.warning("%s lost the lease of bucket %d", self.member_id, bucket)
                    self._lost.add(bucket)
        self.membership.heartbeat()

    def keep_leases(self, stopping: threading.Event) -> None:
        """Run :meth:`renew_held` every quarter of the lease TTL until ``stopping`` is set
        (a thread of the server's own: the loop's work cannot delay it)."""
        interval_s = self.lease_ttl_ms / 4000
        while not stopping.wait(interval_s):
            try:
                self.renew_held()
            except TransportError as exc:
                log.warning("%s: member heartbeat failed: %s", self.member_id, exc)

    def take_lost(self) -> set[int]:
        """The buckets whose lease was lost since the last call: not renewed, or not renewed
        within its TTL (the renewing thread is stuck), which then counts as lost too. The
        caller must stop processing them at once."""
        now = time.monotonic()
        if not self._lost and now < self._scan_after_s:
            return set()
        with self._lock:
            earliest_s = math.inf
            for bucket, lease in self._leases.items():
                if not lease.held:
                    continue
                valid_until_s = self._valid_until_s.get(bucket, math.inf)
                earliest_s = min(earliest_s, valid_until_s)
                if valid_until_s < now:
                    log.warning(
                        "%s lost the lease of bucket %d: not renewed within its TTL",
                        self.member_id,
                        bucket,
                    )
                    lease.epoch = None
                    self._lost.add(bucket)
            self._scan_after_s = earliest_s
            lost, self._lost = self._lost, set()
        return lost

    def join(self) -> None:
        """Register this server in the member list.

        Raises:
            TransportError: Redis failed.
        """
        self.membership.join()

    def leave(self) -> None:
        """Release every lease and leave the member list (a clean stop)."""
        with self._lock:
            for lease in self._leases.values():
                lease.release()
        self.membership.leave()

    def release(self, bucket: int) -> None:
        """Give up one bucket without a handoff note (e.g. after being fenced)."""
        with self._lock:
            self._leases[bucket].release()

    def tick(self) -> TickResult:
        """Take part in failover, redundancy and balance (the leases held are renewed by
        :meth:`keep_leases`; those lost since the last call are in the result).

        Returns:
            What changed for this server.

        Raises:
            TransportError: Redis failed (the caller should treat its leases as lost).
        """
        result = TickResult()
        self.membership.heartbeat()
        result.lost = self.take_lost()
        self.members = self.membership.live_members()
        live = {m.member_id for m in self.members}
        rank = {m.member_id: i for i, m in enumerate(self.members)}
        holders, handoffs, secondaries = self._read_state()
        primaries_of: dict[str, int] = dict.fromkeys(live, 0)
        secondaries_of: dict[str, int] = dict.fromkeys(live, 0)
        for holder in holders:
            if holder is not None and holder[0] in primaries_of:
                primaries_of[holder[0]] += 1
        views = []
        for bucket in range(self.total_buckets):
            holder = holders[bucket]
            primary = holder[0] if holder is not None else None
            live_secondaries = sorted(
                (m for m in secondaries[bucket] if m in live and m != primary), key=rank.__getitem__
            )
            stale = [m for m in secondaries[bucket] if m not in live_secondaries]
            if stale:
                self._redis.srem(self._keys.secondaries(bucket), *stale)
            for m in live_secondaries:
                secondaries_of[m] += 1
            if holder is None:
                taker = choose_taker(handoffs[bucket], live_secondaries, live, primaries_of, rank)
                if taker == self.member_id:
                    epoch = self._acquire(bucket)
                    if epoch is not None:
                        log.info(
                            "%s is now primary of bucket %d (epoch %d)",
                            self.member_id,
                            bucket,
                            epoch,
                        )
                        result.gained[bucket] = epoch
                        primary = self.member_id
                        primaries_of[self.member_id] += 1
                        if self.member_id in live_secondaries:
                            live_secondaries.remove(self.member_id)
                            secondaries_of[self.member_id] -= 1
                            self._redis.srem(self._keys.secondaries(bucket), self.member_id)
            views.append(
                BucketView(
                    bucket,
                    primary,
                    holder[1] if holder is not None else 0,
                    tuple(live_secondaries),
                )
            )
        self.views = views
        self._restore_redundancy(views, live, secondaries_of, rank)
        if all(v.primary is not None for v in views):
            result.to_hand_over = buckets_to_hand_over(
                self.member_id, self.owned, primaries_of, rank, self.total_buckets
            )
        return result

    def hand_over(self, bucket: int, receiver: str) -> None:
        """Release a bucket (already flushed and committed by the caller) to ``receiver``.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors(f"handoff of bucket {bucket}"):
            self._redis.set(self._keys.handoff(bucket), receiver, px=self.lease_ttl_ms)
        self.release(bucket)
        log.info("%s handed bucket %d over to %s", self.member_id, bucket, receiver)

    # --- internals ---------------------------------------------------------------------

    def _acquire(self, bucket: int) -> int | None:
        with self._lock:
            started = time.monotonic()
            epoch = self._leases[bucket].try_acquire()
            if epoch is not None:
                valid_until_s = started + self.lease_ttl_ms / 1000
                self._valid_until_s[bucket] = valid_until_s
                self._scan_after_s = min(self._scan_after_s, valid_until_s)
                self._lost.discard(bucket)
            return epoch

    def _read_state(
        self,
    ) -> tuple[list[tuple[str, int] | None], list[str | None], list[list[str]]]:
        with redis_errors("cannot read the bucket election state"):
            pipe = self._redis.pipeline(transaction=False)
            for bucket in range(self.total_buckets):
                pipe.get(self._keys.lease(bucket_role(bucket)))
                pipe.get(self._keys.handoff(bucket))
                pipe.smembers(self._keys.secondaries(bucket))
            raw = pipe.execute()
        holders: list[tuple[str, int] | None] = []
        handoffs: list[str | None] = []
        secondaries: list[list[str]] = []
        for i in range(self.total_buckets):
            lease, handoff, members = raw[3 * i : 3 * i + 3]
            if lease is None:
                holders.append(None)
            else:
                member, epoch = parse_lease(lease)
                holders.append((member, epoch))
            handoffs.append(handoff.decode() if handoff is not None else None)
            secondaries.append([m.decode() for m in members])
        return holders, handoffs, secondaries

    def _restore_redundancy(
        self,
        views: list[BucketView],
        live: set[str],
        secondaries_of: dict[str, int],
        rank: dict[str, int],
    ) -> None:
        for view in views:
            chosen = secondary_candidates(view, self.redundancy, live, secondaries_of, rank)
            if self.member_id not in chosen:
                continue
            added = self._add_secondary(
                keys=[self._keys.secondaries(view.bucket)],
                args=[self.member_id, self.redundancy],
            )
            if added:
                secondaries_of[self.member_id] += 1
                log.info("%s is now a secondary of bucket %d", self.member_id, view.bucket)
