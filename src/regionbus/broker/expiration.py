"""Entry expiration: each bucket's primary finds the due entries, and expires them through
``{ns}.ops`` like any change (docs/behaviour.md §1; Geode ``EntryExpiryTask``).

How it works:

- Where it is kept. Every create or update of an entry of a region with expiration records
  the entry's last-modified and last-accessed times and its expiry time in a per-bucket
  sorted set (``RedisKeys.region_expiry``), in the same Lua apply as the change
  (``apply_entry.lua``); a server ``get`` moves the idle deadline (``touch_entry.lua``:
  Geode's ``LocalRegion.updateStatsForGet`` counts a get, hit or miss of an existing entry,
  as an access). A destroy drops the schedule. Nothing ever scans a region.
- Who finds them. Every ``expiration_interval_ms`` the server reads, for the buckets it is
  primary of, the entries due now (``ZRANGEBYSCORE``), at most ``expiration_batch_size``,
  earliest first; the rest wait for the next look. It claims them (``claim_expiry.lua``,
  fenced by the bucket's epoch, so only the primary does): each gets the sequence id of its
  EventID from a counter of the bucket, and the claim is kept in Redis until it is applied.
- How they travel. For each claimed entry the primary produces an ``EXPIRE_DESTROY`` or
  ``EXPIRE_INVALIDATE`` operation (Geode ``Operation.EXPIRE_DESTROY`` /
  ``EXPIRE_INVALIDATE``) to the bucket's partition of ``{ns}.ops``, in sequence order, with
  the EventID ``((expiry), 1, sequence id, bucket)``: one EventID thread per bucket,
  whichever server is primary, and a primary that takes over an entry claimed but not yet
  expired keeps its sequence id, so the operation it produces again has the same EventID.
  The operation's ``timestamp_ms`` is the expiry time it claims.
- How they apply. Read in the bucket's order like any operation, an expiration is applied
  by ``expire_entry.lua``, fenced by the epoch: only the claimed expiration takes effect
  (same sequence id, expiry time and producing member), only while the entry's schedule is
  still that expiry time (a create, update or get since wins and nothing happens), and its
  result is stored under its EventID as an entry change's is. Then it is distributed as a
  change is, and the offset is committed only after its events were delivered
  (:mod:`regionbus.broker.ownership`).
- What it tells. An expiration is a server-originated change: its event has that EventID,
  the producing server as originator and ``expiration=True``, which listeners read as
  ``EntryEvent.is_expiration`` (Geode ``Operation.isExpiration()``). It reaches server
  listeners, ``{ns}.events`` and the subscription queues of interested clients as an
  ordinary destroy or invalidate; gateway senders never get it and async event queues get
  an expiration destroy only with ``forward_expiration_destroy``
  (:mod:`regionbus.broker.gateway_queues`, Geode ``AbstractGatewaySender.checkForDistribution``).

High availability: a primary that dies after producing an expiration, or after applying
it but before delivering its events, loses nothing. Its successor reads the bucket again
from the committed offset: an expiration not applied yet is applied then; one applied
already is recognised by its EventID (status ``DUP``) and its events are delivered again,
flagged ``possible_duplicate``, which clients' message tracking drops if they had them.
An expiration the successor claims and produces again carries the same EventID: whichever
copy comes first applies, the other is a duplicate or changes nothing. An expiration that
reaches the bucket after a later one of the same bucket was applied (its event would look
like a duplicate to clients) changes nothing and its entry is claimed again with a new
sequence id.

Who may expire: only a bucket's primary claims, and an ``EXPIRE_*`` operation takes effect
only when it is the expiration claimed in Redis by the member that produced it. With
security on, an ``EXPIRE_*`` operation from any principal but the servers' is refused and
dead-lettered at the front door (:mod:`regionbus.broker.security`); the servers sign theirs.
Validation
dead-letters an expiration whose EventID is not in the expirations' thread, and any other
operation whose EventID is (:mod:`regionbus.broker.validation`): one with a high sequence id there
would make every later expiration of its bucket look like a duplicate.

Limits, said plainly: with security off, the server cannot tell who produced an operation,
so a client that guesses a pending claim (its sequence id, expiry time and producing
member) can make that claimed, already due expiration happen a moment early, and nothing
more; a claim whose operation was never applied and whose entry was destroyed meanwhile
stays in Redis (a few bytes); entries written before their
region got expiration attributes are scheduled at their next create, update or get; a
client's hit in its own local cache is not a server access (as in Geode); an expiration's
event is timestamped with its expiry time, not with when it was applied; each expiration
is applied with a Redis round trip of its own (not pipelined with its neighbours).
"""

from __future__ import annotations

import logging
import time
from typing import Final

from regionbus.broker.config import ServerSettings
from regionbus.broker.distribution import Distribution
from regionbus.broker.expiration_attributes import RegionExpiration
from regionbus.broker.outbox import Outbox
from regionbus.broker.ownership import BucketOwnership
from regionbus.broker.security import SecurityGuard
from regionbus.broker.stats import ServerStats
from regionbus.broker.store import DueExpiry, RegionStore
from regionbus.runtime.leases import wall_clock_ms
from regionbus.schemas.codec import encode, encode_batches
from regionbus.schemas.eventid import EXPIRY_MEMBER, EXPIRY_THREAD, EventID
from regionbus.schemas.messages import Event, Operation, OperationKind

log = logging.getLogger("regionbus.server.expiration")

_PRODUCE_AGAIN_AFTER_S: Final = 10.0
"""An expiration produced this long ago and not applied yet is produced again (with the
same EventID): Kafka may not have taken it."""


class EntryExpiration:
    """Finds and claims the due entries of the buckets this server is primary of, produces
    their expirations to ``{ns}.ops``, and applies the expirations read there.

    Args:
        settings: The server's settings (``region_expiration``, ``expiration_interval_ms``,
            ``expiration_batch_size``, ``member_id``).
        store: The region store (its Redis and key names).
        ownership: The buckets held and their fencing epochs.
        distribution: What follows each applied expiration (server listeners, which hear
            expirations as Geode's do; routing; gateways).
        outbox: The server's producer.
        stats: The server's counters (``entries_expired``).
        security: Signs the expirations produced when security is on (None when off).
    """

    def __init__(
        self,
        settings: ServerSettings,
        store: RegionStore,
        ownership: BucketOwnership,
        distribution: Distribution,
        outbox: Outbox,
        stats: ServerStats,
        security: SecurityGuard | None = None,
    ) -> None:
        self._regions: dict[str, RegionExpiration] = {
            r: e for r, e in settings.region_expiration.items() if e.enabled
        }
        self._interval_s = settings.expiration_interval_ms / 1000
        self._batch_size = settings.expiration_batch_size
        self._member = settings.member_id
        self._store = store
        self._ownership = ownership
        self._distribution = distribution
        self._outbox = outbox
        self._stats = stats
        self._security = security
        self._next_look = time.monotonic()
        self._in_flight: dict[tuple[int, str, str], tuple[int, float]] = {}
        """``{(bucket, region, key): (expiry ms, monotonic time produced)}`` of the
        expirations produced here and not applied yet: not produced again at every look."""

    def __bool__(self) -> bool:
        return bool(self._regions)

    # --- finding, claiming, producing --------------------------------------------------

    def tick(self, now_monotonic: float) -> int:
        """Produce the expirations of what is due, when ``expiration_interval_ms`` has
        passed since the last look.

        Args:
            now_monotonic: ``time.monotonic()`` of the loop.

        Returns:
            How many expirations were produced.

        Raises:
            TransportError: Redis failed (nothing was produced for what the failed round
                trip claimed; the claims are taken again at the next look).
        """
        if not self._regions or now_monotonic < self._next_look:
            return 0
        self._next_look = now_monotonic + self._interval_s
        owned = dict(self._ownership.owned)
        self._in_flight = {k: v for k, v in self._in_flight.items() if k[0] in owned}
        if not owned:
            return 0
        due = [
            d
            for d in self._store.due_expiries(
                self._regions, owned, wall_clock_ms(), self._batch_size
            )
            if not self._produced(d, now_monotonic)
        ]
        if not due:
            return 0
        claimed = self._claim_all(due, owned)
        for item, _ in claimed:
            self._in_flight[(item.bucket, item.region, item.key)] = (item.at_ms, now_monotonic)
        self._produce(claimed)
        return len(claimed)

    def _produced(self, item: DueExpiry, now_monotonic: float) -> bool:
        """Whether this expiry was produced here lately and is still to be applied."""
        known = self._in_flight.get((item.bucket, item.region, item.key))
        return (
            known is not None
            and known[0] == item.at_ms
            and now_monotonic - known[1] < _PRODUCE_AGAIN_AFTER_S
        )

    def _claim_all(
        self, due: list[DueExpiry], owned: dict[int, int]
    ) -> list[tuple[DueExpiry, int]]:
        """Claim the due entries (:meth:`RegionStore.claim_expiries`); a bucket found fenced
        is given up.

        Returns:
            ``(entry, sequence id)`` of each entry claimed, by bucket and sequence id (the
            order they must be applied in).
        """
        claims = self._store.claim_expiries(due, owned, self._member)
        for bucket in claims.fenced:
            self._ownership.fenced(bucket)
        return claims.claimed

    def _produce(self, claimed: list[tuple[DueExpiry, int]]) -> None:
        """Produce the claimed expirations to their buckets' partitions of ``{ns}.ops``, in
        order, as few Kafka messages as possible (signed as the servers' when security is
        on)."""
        ops_topic = self._outbox.topics.ops
        framed: dict[int, list[bytes]] = {}
        for item, sequence in claimed:
            destroys = self._regions[item.region].action.is_destroy
            op = Operation(
                request_id=0,
                client_id=self._member,
                kind=OperationKind.EXPIRE_DESTROY if destroys else OperationKind.EXPIRE_INVALIDATE,
                region=item.region,
                timestamp_ms=item.at_ms,
                event_id=EventID(EXPIRY_MEMBER, EXPIRY_THREAD, sequence, item.bucket),
                key=item.key,
            )
            framed.setdefault(item.bucket, []).append(encode(op))
        for bucket, items in framed.items():
            for value in encode_batches(items):
                headers = None
                if self._security is not None:
                    headers = self._security.server_headers(ops_topic, bucket, value)
                self._outbox.produce(ops_topic, value, None, partition=bucket, headers=headers)

    # --- applying ----------------------------------------------------------------------

    def apply(self, op: Operation, bucket: int, offset: int) -> None:
        """The handler of ``EXPIRE_DESTROY`` and ``EXPIRE_INVALIDATE`` (read at ``offset`` of
        partition ``bucket``): apply the expiration if it is still due and claimed, then
        distribute its event as a change's (again, flagged ``possible_duplicate``, when its
        EventID was applied before). There is no reply: a server asked.

        Raises:
            TransportError: Redis failed (the operation is read again from the committed
                offset; its EventID is recognised if it was applied).
        """
        if op.event_id is None or op.key is None:
            return  # validation refuses it before it gets here
        epoch = self._ownership.owned.get(bucket)
        if epoch is None:
            return
        if op.client_id == self._member:
            # Another server's copy of a claim this server took over leaves its own pending.
            self._in_flight.pop((bucket, op.region, op.key), None)
        result = self._store.expire_entry(
            region=op.region,
            key=op.key,
            expiry_ms=op.timestamp_ms,
            destroy=op.kind is OperationKind.EXPIRE_DESTROY,
            event_id=op.event_id._replace(bucket=bucket),
            producer=op.client_id,
            bucket=bucket,
            offset=offset,
            epoch=epoch,
            want_old=self._distribution.wants_old_value(op.region),
        )
        status = result.status
        if status == "FENCED":
            self._ownership.fenced(bucket)
            return
        if status not in ("OK", "DUP"):
            if status in ("UNCLAIMED", "STALE"):
                log.info(
                    "%s of %r in %r (%s, from %s) changed nothing: %s",
                    op.kind.value,
                    op.key,
                    op.region,
                    op.event_id,
                    op.client_id,
                    status,
                )
            return
        if result.event_kind is None or result.version is None:
            return  # a duplicate whose stored result was pruned: its event went out then
        event = Event(
            event_id=op.event_id._replace(bucket=bucket),
            kind=result.event_kind,
            region=op.region,
            version=result.version,
            timestamp_ms=op.timestamp_ms,
            originator=op.client_id,
            key=op.key,
            possible_duplicate=status == "DUP",
            expiration=True,
        )
        if status == "OK":
            self._stats.entries_expired += 1
        else:
            self._stats.duplicates += 1
        self._distribution.entry_changed(
            event,
            bucket,
            result.old_value,
            result.old_serializer,
            duplicate=status != "OK",
        )


__all__ = ["EXPIRY_MEMBER", "EXPIRY_THREAD", "EntryExpiration"]
