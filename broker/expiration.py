"""Entry expiration, run by each bucket's primary (SPEC §1; Geode ``EntryExpiryTask``).

How it works:

- Where it is kept. Every create or update of an entry of a region with expiration records
  the entry's last-modified and last-accessed times and its expiry time in a per-bucket
  sorted set (``RedisKeys.region_expiry``), in the same Lua apply as the change
  (``apply_entry.lua``); a server ``get`` moves the idle deadline (``touch_entry.lua``:
  Geode's ``LocalRegion.updateStatsForGet`` counts a get, hit or miss of an existing entry,
  as an access). A destroy drops the schedule. Nothing ever scans a region.
- Who expires. Every ``expiration_interval_ms`` the server reads, for the buckets it is
  primary of, the entries due now (``ZRANGEBYSCORE``), and expires at most
  ``expiration_batch_size`` of them, earliest first; the rest wait for the next look.
  Each expiry is one Lua script (``expire_entry.lua``), fenced by the bucket's epoch, that
  reads the schedule again, so a change or get since the look wins. The loop runs it between
  poll batches, so an expiration takes its place in the bucket's order of changes.
- What it tells. An expiration is a server-originated change: its event has an EventID of
  this server (member id, a thread id unique to this run of the server, a sequence per
  bucket from 0) and ``expiration=True`` (Geode ``Operation.EXPIRE_DESTROY`` /
  ``EXPIRE_INVALIDATE``, whose ``isExpiration()`` listeners can read as
  ``EntryEvent.is_expiration``). It reaches server listeners, ``{ns}.events`` and the
  subscription queues of interested clients as an ordinary destroy or invalidate; gateway
  senders never get it and async event queues get an expiration destroy only with
  ``forward_expiration_destroy`` (:mod:`broker.gateway_queues`, Geode
  ``AbstractGatewaySender.checkForDistribution``).

Limits, said plainly: an expiration is not an operation of ``{ns}.ops``, so a primary that
dies between the Redis change and the delivery of its events loses those events (clients
then keep the expired entry until their next change of it or a re-registration); entries
written before their region got expiration attributes are scheduled at their next create,
update or get; a client's hit in its own local cache is not a server access (as in Geode).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from importlib import resources
from typing import Any, NamedTuple

from broker.config import ServerSettings
from broker.expiration_attributes import RegionExpiration
from broker.gateway_queues import GatewayEnqueuer
from broker.notifier import CacheClientNotifier
from broker.outbox import Outbox
from broker.ownership import BucketOwnership
from broker.plugins import ServerPlugins
from broker.stats import ServerStats
from broker.store import RegionStore, redis_errors
from runtime.leases import now_ms
from schemas.eventid import EventID
from schemas.messages import Event, EventKind
from schemas.naming import bucket_role

log = logging.getLogger("regionbus.server.expiration")


class _Due(NamedTuple):
    at_ms: int
    region: str
    bucket: int
    key: str


class EntryExpiration:
    """Expires the due entries of the buckets this server is primary of.

    Args:
        settings: The server's settings (``region_expiration``, ``expiration_interval_ms``,
            ``expiration_batch_size``, ``member_id``).
        store: The region store (its Redis and key names).
        ownership: The buckets held and their fencing epochs.
        plugins: Server listeners (they hear expirations, as Geode's do).
        notifier: Distribution to subscription queues and ``{ns}.events``.
        gateways: Queues for gateway senders and async event queues.
        outbox: The server's producer.
        stats: The server's counters (``entries_expired``).
    """

    def __init__(
        self,
        settings: ServerSettings,
        store: RegionStore,
        ownership: BucketOwnership,
        plugins: ServerPlugins,
        notifier: CacheClientNotifier,
        gateways: GatewayEnqueuer,
        outbox: Outbox,
        stats: ServerStats,
    ) -> None:
        self._regions: dict[str, RegionExpiration] = {
            r: e for r, e in settings.region_expiration.items() if e.enabled
        }
        self._interval_s = settings.expiration_interval_ms / 1000
        self._batch_size = settings.expiration_batch_size
        self._member = settings.member_id
        # A thread id of this run of the server: its sequence ids restart at 0, and a server
        # restarted with the same member id must not look like a duplicate of its last run.
        self._thread = now_ms()
        self._sequences: dict[int, Iterator[int]] = {}
        self._store = store
        self._ownership = ownership
        self._plugins = plugins
        self._notifier = notifier
        self._gateways = gateways
        self._outbox = outbox
        self._stats = stats
        self._expire = store.redis.register_script(
            resources.files("broker").joinpath("lua", "expire_entry.lua").read_text()
        )
        self._next_look = time.monotonic()

    def __bool__(self) -> bool:
        return bool(self._regions)

    def tick(self, now_monotonic: float) -> int:
        """Expire what is due, when ``expiration_interval_ms`` has passed since the last look.

        Args:
            now_monotonic: ``time.monotonic()`` of the loop.

        Returns:
            How many entries expired.

        Raises:
            TransportError: Redis failed (nothing of a failed round trip is told; its entries
                are looked at again).
        """
        if not self._regions or now_monotonic < self._next_look:
            return 0
        self._next_look = now_monotonic + self._interval_s
        owned = dict(self._ownership.owned)
        if not owned:
            return 0
        now = now_ms()
        due = self._due(owned, now)
        if not due:
            return 0
        return self._expire_all(due, owned, now)

    def _due(self, owned: dict[int, int], now: int) -> list[_Due]:
        """The earliest ``expiration_batch_size`` entries due by ``now``, over every region
        with expiration and every bucket held: one pipelined round trip."""
        keys = self._store.keys
        looked = [(region, bucket) for region in self._regions for bucket in sorted(owned)]
        with redis_errors():
            pipe = self._store.redis.pipeline(transaction=False)
            for region, bucket in looked:
                pipe.zrangebyscore(
                    keys.region_expiry(region, bucket),
                    "-inf",
                    now,
                    start=0,
                    num=self._batch_size,
                    withscores=True,
                )
            replies = pipe.execute()
        due = [
            _Due(int(score), region, bucket, member.decode())
            for (region, bucket), found in zip(looked, replies, strict=True)
            for member, score in found
        ]
        due.sort()
        return due[: self._batch_size]

    def _expire_all(self, due: list[_Due], owned: dict[int, int], now: int) -> int:
        keys = self._store.keys
        with redis_errors():
            pipe = self._store.redis.pipeline(transaction=False)
            for item in due:
                region, bucket, key = item.region, item.bucket, item.key
                action = "DESTROY" if self._regions[region].action.is_destroy else "INVALIDATE"
                self._expire(
                    keys=[
                        keys.regions,
                        keys.region_values(region, bucket),
                        keys.region_meta(region, bucket),
                        keys.region_version(region),
                        keys.epoch(bucket_role(bucket)),
                        keys.region_expiry(region, bucket),
                        keys.region_entry_times(region, bucket),
                    ],
                    args=[
                        region,
                        key,
                        now,
                        action,
                        owned[bucket],
                        "1" if self._plugins.has_listeners(region) else "0",
                    ],
                    client=pipe,
                )
            replies = pipe.execute()
        expired = 0
        fenced: set[int] = set()
        for item, reply in zip(due, replies, strict=True):
            status = _text(reply[0])
            if status == "FENCED":
                fenced.add(item.bucket)
            elif status == "OK":
                kind, _, version = _text(reply[1]).partition("|")
                self._tell(item, EventKind(kind), int(version), reply[2] or None, now)
                expired += 1
        for bucket in fenced:
            self._ownership.fenced(bucket)
        if expired:
            self._stats.entries_expired += expired
            self._outbox.send()
        return expired

    def _tell(
        self, item: _Due, kind: EventKind, version: int, old_value: bytes | None, now: int
    ) -> None:
        """Distribute one expiration as the server's own destroy or invalidate."""
        sequence = self._sequences.setdefault(item.bucket, itertools.count())
        event = Event(
            event_id=EventID(self._member, self._thread, next(sequence), item.bucket),
            kind=kind,
            region=item.region,
            version=version,
            timestamp_ms=now,
            originator=self._member,
            key=item.key,
            expiration=True,
        )
        self._plugins.after_entry(event, old_value)
        self._notifier.entry_event(event, item.bucket)
        if self._gateways:
            self._gateways.enqueue(event, item.bucket, self._outbox.produce)


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


__all__ = ["EntryExpiration"]
