"""The region store: authoritative region state in Redis, changed only through Lua scripts.

Layout (keys from :class:`regionbus.schemas.naming.RedisKeys`, all of one bucket in one
Redis Cluster hash slot; ``docs/redis-cluster.md`` says why): per region and bucket a values
hash (key -> value bytes; a missing field is an invalid entry), a meta hash (key ->
``"<version>|<serializer>"``; a field here means the entry exists), a version counter and,
for regions with expiration, the expiry schedule; per bucket a copy of the region names,
the tracking hash (member:thread -> highest applied sequence id) and the stored results of
recent EventIDs, so a re-processed or retried operation is recognised and its event
re-emitted unchanged.

The same code runs on one Redis and on a Redis Cluster (a redis-py ``RedisCluster``
client): every Lua call's keys are in one bucket's slot, a poll batch makes one call per
slot it touches, and a region operation is applied bucket by bucket.

The parts, one module each, share one connection (:mod:`.base`): entry changes
(:mod:`.entries`), regions and region-wide operations (:mod:`.regions`), entry expiry
(:mod:`.expiry`) and reads (:mod:`.reads`); :mod:`.results` reads the scripts' replies.
Redis errors are translated at this one boundary into :class:`TransportError`
(:func:`regionbus.runtime.redis_connect.redis_errors`).
"""

from __future__ import annotations

from regionbus.broker.store import entries, expiry, regions
from regionbus.broker.store.base import StoreBase
from regionbus.broker.store.entries import APPLY_CALL_MAX_CHANGES, EntryChanges
from regionbus.broker.store.expiry import Claims, DueExpiry, ExpiryStore
from regionbus.broker.store.reads import EntryReads
from regionbus.broker.store.regions import RegionChanges
from regionbus.broker.store.results import Access, ApplyResult, GatewayVersion, Snapshot


class RegionStore(EntryChanges, RegionChanges, ExpiryStore, EntryReads):
    """Reads and changes region state of one namespace in Redis: every part of the store
    on one connection (its arguments are :class:`StoreBase`'s)."""

    scripts = entries.SCRIPTS + regions.SCRIPTS + expiry.SCRIPTS


__all__ = [
    "APPLY_CALL_MAX_CHANGES",
    "Access",
    "ApplyResult",
    "Claims",
    "DueExpiry",
    "GatewayVersion",
    "RegionStore",
    "Snapshot",
    "StoreBase",
]
