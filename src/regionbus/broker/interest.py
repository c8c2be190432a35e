"""The interest registry: which client wants which entries, and routing events by it.

Each server keeps the registry in memory for routing and in Redis for failover and
durable clients. A registration is installed bucket by bucket, in the order of that
bucket's operations, so routing in a bucket starts exactly where its bulk-load snapshot
was taken (invariant 3 of ARCHITECTURE.md). The server routes to the **union** of a
client's registrations; a client gets values when any matching registration has
``receive_values=True`` (docs/behaviour.md §3).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

import redis

from regionbus.broker.audiences import (
    RegexRegistration,
    RegionRegistrations,
    Registration,
    Route,
)
from regionbus.broker.audiences import build as build_audiences
from regionbus.broker.audiences import route as route_audiences
from regionbus.runtime.redis_connect import redis_errors
from regionbus.schemas.errors import InvalidInterestError
from regionbus.schemas.interest_regex import compile_interest_regex
from regionbus.schemas.messages import InterestKind, InterestSpec
from regionbus.schemas.naming import RedisKeys

log = logging.getLogger("regionbus.interest")


_NOBODY = Route((), {})


def _field(region: str, kind: InterestKind, item: str) -> str:
    return f"{region}\x00{kind.value}\x00{item}"


class InterestTable:
    """Which client wants which entries, in memory: the routing half of the registry.

    A registration is active in the buckets it was installed in (one by one, in each
    bucket's operation order), or in every bucket when loaded after a failover. A client
    is routed the **union** of its registrations, with values when any matching one wants
    them (docs/behaviour.md §3).
    """

    def __init__(self) -> None:
        self._regions: dict[str, RegionRegistrations] = {}
        self._regex_counts: dict[str, int] = {}
        """``{client id: regex registrations}`` over every region."""

    def add(
        self,
        client_id: str,
        region: str,
        spec: InterestSpec,
        buckets: Iterable[int],
        keys: Iterable[str] = (),
    ) -> None:
        """Activate a registration in ``buckets`` (merging with what the client has).

        Args:
            client_id: The subscriber.
            region: Region name.
            spec: The registration (its ``keys`` are ignored: ``keys`` says which).
            buckets: Where it routes from now on.
            keys: For a KEYS spec, the keys to add.

        Raises:
            InvalidInterestError: a REGEX spec whose pattern does not compile.
        """
        ri = self._regions.setdefault(region, RegionRegistrations())
        ri.audiences = None
        if spec.kind is InterestKind.ALL_KEYS:
            _activate(ri.all_keys, client_id, spec, buckets)
        elif spec.kind is InterestKind.REGEX:
            pattern = compile_interest_regex(spec.regex)
            reg = ri.regexes.get((client_id, pattern.pattern))
            if reg is None:
                reg = RegexRegistration(spec.receive_values, spec.durable, set(), pattern)
                ri.regexes[(client_id, pattern.pattern)] = reg
                self._regex_counts[client_id] = self._regex_counts.get(client_id, 0) + 1
                ri.patterns_of.setdefault(client_id, set()).add(pattern.pattern)
            reg.receive_values = reg.receive_values or spec.receive_values
            reg.durable = reg.durable or spec.durable
            reg.buckets.update(buckets)
        else:
            bucket_set = set(buckets)
            indexed = ri.keys_of.setdefault(client_id, set())
            for key in keys:
                _activate(ri.keys.setdefault(key, {}), client_id, spec, bucket_set)
                indexed.add(key)
            if not indexed:
                del ri.keys_of[client_id]  # no keys: no registration to count or forget

    def remove(self, client_id: str, region: str, spec: InterestSpec) -> None:
        """Remove a registration in every bucket: the keys of a KEYS spec, the all-keys
        registration, or the spec's pattern."""
        ri = self._regions.get(region)
        if ri is None:
            return
        ri.audiences = None
        if spec.kind is InterestKind.ALL_KEYS:
            ri.all_keys.pop(client_id, None)
        elif spec.kind is InterestKind.REGEX:
            if ri.regexes.pop((client_id, spec.regex or ""), None) is not None:
                self._uncount_regex(client_id)
                _unindex(ri.patterns_of, client_id, (spec.regex or "",))
        else:
            for key in spec.keys:
                if key in ri.keys:
                    ri.keys[key].pop(client_id, None)
                    if not ri.keys[key]:
                        del ri.keys[key]
            _unindex(ri.keys_of, client_id, spec.keys)

    def drop_client(self, client_id: str, *, keep_durable: bool = False) -> None:
        """Forget a client's registrations (all, or all but the durable ones)."""
        for ri in self._regions.values():
            ri.audiences = None
            reg = ri.all_keys.get(client_id)
            if reg is not None and not (keep_durable and reg.durable):
                del ri.all_keys[client_id]
            dropped_keys: list[str] = []
            for key in ri.keys_of.get(client_id, ()):
                by_client = ri.keys.get(key, {})
                reg = by_client.get(client_id)
                if reg is not None and keep_durable and reg.durable:
                    continue
                if reg is not None:
                    del by_client[client_id]
                    if not by_client:
                        del ri.keys[key]
                dropped_keys.append(key)
            _unindex(ri.keys_of, client_id, dropped_keys)
            dropped_patterns: list[str] = []
            for pattern in ri.patterns_of.get(client_id, ()):
                regex_reg = ri.regexes.get((client_id, pattern))
                if regex_reg is not None and keep_durable and regex_reg.durable:
                    continue
                if regex_reg is not None:
                    del ri.regexes[(client_id, pattern)]
                    self._uncount_regex(client_id)
                dropped_patterns.append(pattern)
            _unindex(ri.patterns_of, client_id, dropped_patterns)

    def _uncount_regex(self, client_id: str) -> None:
        left = self._regex_counts.get(client_id, 0) - 1
        if left > 0:
            self._regex_counts[client_id] = left
        else:
            self._regex_counts.pop(client_id, None)

    def keys_of(self, client_id: str) -> int:
        """How many keys a client holds registered here, over every region."""
        return sum(len(ri.keys_of.get(client_id, ())) for ri in self._regions.values())

    def new_keys(self, client_id: str, region: str, keys: Iterable[str]) -> int:
        """How many of ``keys`` the client does not hold registered on the region yet."""
        ri = self._regions.get(region)
        held = ri.keys_of.get(client_id, set()) if ri is not None else set()
        return sum(1 for key in set(keys) if key not in held)

    def regexes_of(self, client_id: str) -> int:
        """How many regex registrations a client holds, over every region."""
        return self._regex_counts.get(client_id, 0)

    def has_regex(self, client_id: str, region: str, pattern: str) -> bool:
        """Whether the client already holds this regex registration on the region."""
        ri = self._regions.get(region)
        return ri is not None and (client_id, pattern) in ri.regexes

    def audiences(self, region: str, key: str, bucket: int) -> Route:
        """Who a change of one entry reaches, as audiences of clients that share a
        registration and the clients routed alone (`regionbus.broker.audiences`): every
        client with a registration active in that bucket that matches the key, once, with
        ``receive_values`` if any of its matching registrations wants values.

        Args:
            region: Region name.
            key: Entry key.
            bucket: The bucket the change was applied in.
        """
        ri = self._regions.get(region)
        if ri is None:
            return _NOBODY
        if ri.audiences is None:
            ri.audiences = build_audiences(region, ri)
        return route_audiences(ri.audiences, ri, key, bucket)

    def clients_of_region(self, region: str) -> set[str]:
        """Every client with any interest in the region (receives region clear/destroy)."""
        ri = self._regions.get(region)
        return ri.clients() if ri else set()

    def forget_region(self, region: str) -> None:
        """Drop the routing of a destroyed region."""
        ri = self._regions.pop(region, None)
        for client_id, _ in ri.regexes if ri is not None else ():
            self._uncount_regex(client_id)

    def clear(self) -> None:
        """Forget everything."""
        self._regions.clear()
        self._regex_counts.clear()


def _unindex(index: dict[str, set[str]], client_id: str, items: Iterable[str]) -> None:
    """Take ``items`` out of a client's registrations in a region's ``index``, dropping the
    client's entry when nothing is left."""
    mine = index.get(client_id)
    if mine is None:
        return
    mine.difference_update(items)
    if not mine:
        del index[client_id]


def _activate(
    table: dict[str, Registration], client_id: str, spec: InterestSpec, buckets: Iterable[int]
) -> None:
    reg = table.get(client_id)
    if reg is None:
        table[client_id] = Registration(spec.receive_values, spec.durable, set(buckets))
        return
    reg.receive_values = reg.receive_values or spec.receive_values
    reg.durable = reg.durable or spec.durable
    reg.buckets.update(buckets)


def drop_stored(client: redis.Redis, key: str, *, keep_durable: bool) -> None:
    """Delete a client's stored registrations (a hash of JSON records with a ``durable``
    flag: interest, continuous queries), or all but the durable ones.

    Raises:
        TransportError: Redis failed.
    """
    with redis_errors():
        if not keep_durable:
            client.delete(key)
            return
        stored = client.hgetall(key)
        gone = [f for f, v in stored.items() if not _is_durable(v)]
        if gone:
            client.hdel(key, *gone)


def _is_durable(raw: bytes) -> bool:
    try:
        record = json.loads(raw)
    except ValueError:
        return False
    return isinstance(record, dict) and bool(record.get("durable"))


class InterestRegistry:
    """The interest registry of one server: an :class:`InterestTable` for routing, persisted
    in Redis for failover and durable clients.

    Args:
        client: redis-py client (``decode_responses=False``).
        namespace: The site namespace.
        total_buckets: Number of buckets (registrations loaded from Redis are active in all).
    """

    def __init__(self, client: redis.Redis, namespace: str, total_buckets: int) -> None:
        self._redis = client
        self._keys = RedisKeys(namespace)
        self._all_buckets = frozenset(range(total_buckets))
        self.table = InterestTable()
        self._unsaved: dict[str, dict[str, str]] = {}
        """Per client, the registration records not yet written (:meth:`save`)."""

    # --- changes -----------------------------------------------------------------------

    def register(
        self, client_id: str, region: str, spec: InterestSpec, bucket: int, keys: Iterable[str]
    ) -> None:
        """Install a registration for one bucket; it is persisted by the next :meth:`save`
        (at the end of the batch, before its reply is sent and its offset committed).

        Args:
            client_id: The subscriber (its queue is its partition of the shared
                ``{ns}.queues[.<principal>]``).
            region: Region name.
            spec: The registration.
            bucket: The bucket whose operations are routed by it from now on.
            keys: For a KEYS spec, the keys of this bucket.

        Raises:
            InvalidInterestError: a REGEX spec whose pattern does not compile.
            TransportError: Redis failed.
        """
        keys = list(keys)
        self.table.add(client_id, region, spec, (bucket,), keys)
        record = json.dumps({"receive_values": spec.receive_values, "durable": spec.durable})
        if spec.kind is InterestKind.ALL_KEYS:
            stored = {_field(region, spec.kind, ""): record}
        elif spec.kind is InterestKind.REGEX:
            stored = {_field(region, spec.kind, spec.regex or ""): record}
        else:
            stored = {_field(region, spec.kind, key): record for key in keys}
        if stored:
            # Written at the end of the batch: a client registers in every bucket, and a
            # storm of clients registering at once made one round trip per registration,
            # holding every other client's operations behind them.
            self._unsaved.setdefault(client_id, {}).update(stored)

    def save(self) -> None:
        """Write the registrations made since the last save, in one round trip.

        Raises:
            TransportError: Redis failed (they stay unsaved; the operations that made them
                are not committed, so they are made again after the outage).
        """
        if not self._unsaved:
            return
        with redis_errors():
            pipe = self._redis.pipeline(transaction=False)
            for client_id, stored in self._unsaved.items():
                pipe.hset(self._keys.interest(client_id), mapping=stored)  # type: ignore[arg-type]
            pipe.execute()
        self._unsaved.clear()

    def unregister(self, client_id: str, region: str, spec: InterestSpec) -> None:
        """Remove a registration (all its buckets) from memory and Redis.

        KEYS removes those keys, ALL_KEYS the all-keys registration, REGEX that pattern.

        Raises:
            TransportError: Redis failed.
        """
        self.table.remove(client_id, region, spec)
        if spec.kind is InterestKind.ALL_KEYS:
            fields = [_field(region, spec.kind, "")]
        elif spec.kind is InterestKind.REGEX:
            fields = [_field(region, spec.kind, spec.regex or "")]
        else:
            fields = [_field(region, spec.kind, key) for key in spec.keys]
        unsaved = self._unsaved.get(client_id, {})
        for field in fields:
            unsaved.pop(field, None)
        if fields:
            with redis_errors():
                self._redis.hdel(self._keys.interest(client_id), *fields)

    def drop_client(self, client_id: str, *, keep_durable: bool = False) -> None:
        """Forget a client's registrations (all, or all but the durable ones).

        Raises:
            TransportError: Redis failed.
        """
        self.table.drop_client(client_id, keep_durable=keep_durable)
        if keep_durable and client_id in self._unsaved:
            self.save()  # its durable registrations outlive it
        self._unsaved.pop(client_id, None)
        drop_stored(self._redis, self._keys.interest(client_id), keep_durable=keep_durable)

    def load(self, client_ids: Iterable[str]) -> int:
        """Forget what is in memory and load the persisted registrations of these clients,
        active in every bucket (at start, and when taking buckets over).

        Returns:
            How many registrations were loaded.

        Raises:
            TransportError: Redis failed.
        """
        self.save()
        self.table.clear()
        count = 0
        for client_id in client_ids:
            with redis_errors():
                stored = self._redis.hgetall(self._keys.interest(client_id))
            for raw_field, raw_value in stored.items():
                region, kind_name, item = raw_field.decode().split("\x00", 2)
                record = json.loads(raw_value)
                kind = InterestKind(kind_name)
                spec = InterestSpec(
                    kind,
                    regex=item if kind is InterestKind.REGEX else None,
                    receive_values=bool(record["receive_values"]),
                    durable=bool(record["durable"]),
                )
                keys = (item,) if kind is InterestKind.KEYS else ()
                try:
                    self.table.add(client_id, region, spec, self._all_buckets, keys)
                except InvalidInterestError as exc:
                    # Persisted before the pattern check existed (or by a hostile writer):
                    # refusing to start would make every restart fail on it.
                    log.error("skipped a stored registration of client %s: %s", client_id, exc)
                    continue
                count += 1
        return count

    # --- routing -----------------------------------------------------------------------

    def clients_of_region(self, region: str) -> set[str]:
        """Every client with any interest in the region (receives region clear/destroy)."""
        return self.table.clients_of_region(region)

    def forget_region(self, region: str) -> None:
        """Drop in-memory routing of a destroyed region (Redis records are left for durables)."""
        self.table.forget_region(region)


__all__ = ["InterestRegistry", "InterestTable", "drop_stored"]
