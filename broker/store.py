"""The region store: authoritative region state in Redis, changed only through Lua scripts.

Layout (keys from :class:`regionbus.schemas.naming.RedisKeys`): per region and bucket a values hash
(key -> value bytes; a missing field is an invalid entry) and a meta hash
(key -> ``"<version>|<serializer>"``; a field here means the entry exists); per region a
version counter; per bucket the tracking hash (member:thread -> highest applied sequence id)
and the stored results of recent EventIDs, so a re-processed or retried operation is
recognised and its event re-emitted unchanged.

Redis errors are translated here, at this one boundary, into :class:`TransportError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import redis

from regionbus.broker.expiration_attributes import RegionExpiration
from regionbus.broker.lua_scripts import (
    PipelinedScript,
    apply_entries_source,
    execute_with_scripts,
    load_lua,
)
from regionbus.schemas.errors import TransportError
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import Entry, EventKind, OperationKind
from regionbus.schemas.naming import RedisKeys, bucket_role

APPLY_CALL_MAX_CHANGES: Final = 500
"""Most changes one ``apply_entries.lua`` call applies: a script blocks Redis while it
runs (lease renewals of every server included), so a poll batch of many put_all chunks
is cut into calls of a few milliseconds each, still in one round trip."""


_ENTRY_KEYS_CACHED: Final = 4096
"""Most (region, bucket) key lists :meth:`RegionStore.entry_args` keeps."""


class GatewayVersion(NamedTuple):
    """When and where an entry last changed, for gateway conflict resolution (SPEC §6).

    Attributes:
        timestamp_ms: The change's timestamp, ms since the Unix epoch.
        site_id: ``distributed_system_id`` of the site where the change was made.
    """

    timestamp_ms: int
    site_id: int


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What applying one change did.

    Attributes:
        status: ``"OK"`` (applied now), ``"DUP"`` (the EventID was applied before),
            ``"ERR"`` (refused; nothing changed), ``"STALE"`` (a gateway event that lost
            the conflict check; nothing changed) or ``"FENCED"`` (the caller is no longer
            the bucket's primary; nothing changed).
        event_kind: The resulting event kind (None when refused, or DUP with the stored
            result already pruned).
        version: Region version the change got (None as for ``event_kind``).
        error_type: Class name of the error for ``"ERR"``.
        old_value: Value before the change, when asked for and present (a recognised
            duplicate's too: it is kept with the result until the offsets are committed).
        old_serializer: The name of ``old_value``'s serializer.
    """

    status: str
    event_kind: EventKind | None = None
    version: int | None = None
    error_type: str | None = None
    old_value: bytes | None = None
    old_serializer: str | None = None


class Access(NamedTuple):
    """What a ``get`` of an entry of a region with an entry idle timeout records: the read
    counts as an access and pushes the entry's expiry back (Geode
    ``LocalRegion.updateStatsForGet``).

    Attributes:
        expiration: The region's expiration attributes.
        now_ms: Time of the read, ms since the Unix epoch.
    """

    expiration: RegionExpiration
    now_ms: int


class Snapshot(NamedTuple):
    """What :meth:`RegionStore.snapshot` read."""

    exists: bool
    entries: list[Entry]
    region_version: int


def _parse_result(raw: bytes | None) -> tuple[EventKind | None, int | None]:
    if not raw:
        return None, None
    kind, _, version = raw.decode().partition("|")
    return EventKind(kind), int(version)


def _to_apply_result(reply: Sequence[Any]) -> ApplyResult:
    status = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    if status == "ERR":
        error = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        return ApplyResult(status, error_type=error)
    kind, version = _parse_result(reply[1] or None)
    old = reply[2] if len(reply) > 2 and reply[2] else None
    old_serializer = reply[3] if len(reply) > 3 and reply[3] else None
    return ApplyResult(
        status,
        kind,
        version,
        old_value=old,
        old_serializer=old_serializer.decode() if isinstance(old_serializer, bytes) else None,
    )


def _to_entry(
    key: str, exists: Any, meta: bytes | None, value: bytes | None
) -> tuple[bool, Entry | None]:
    if not exists:
        return False, None
    if meta is None:
        return True, None
    version, _, serializer = meta.decode().partition("|")
    return True, Entry(key, int(version), value, serializer or None)


@contextmanager
def redis_errors() -> Iterator[None]:
    """Translate redis-py connection and response errors into :class:`TransportError`."""
    try:
        yield
    except redis.exceptions.RedisError as exc:
        raise TransportError(f"Redis: {type(exc).__name__}: {exc}") from exc


class RegionStore:
    """Reads and changes region state of one namespace in Redis.

    Args:
        client: A redis-py client created with ``decode_responses=False``.
        namespace: The site namespace.
        total_buckets: Number of buckets.
    """

    def __init__(self, client: redis.Redis, namespace: str, total_buckets: int) -> None:
        self.redis = client
        self.keys = RedisKeys(namespace)
        self.total_buckets = total_buckets
        self._entry_keys: dict[tuple[str, int], list[str]] = {}
        """The KEYS of ``apply_entry.lua`` per (region, bucket): the same for every change
        of that bucket (callers only read them)."""
        self._apply_entries = PipelinedScript(apply_entries_source())
        self._touch = PipelinedScript(load_lua("touch_entry.lua"))
        self._apply_region = client.register_script(load_lua("apply_region.lua"))
        self._prune = client.register_script(load_lua("prune_results.lua"))

    # --- regions -----------------------------------------------------------------------

    def create_region(self, region: str) -> bool:
        """Define a region (idempotent). Returns True when it was new.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            return bool(self.redis.sadd(self.keys.regions, region))

    def region_names(self) -> set[str]:
        """The names of every defined region.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            return {r.decode() for r in self.redis.smembers(self.keys.regions)}

    def region_exists(self, region: str) -> bool:
        """Whether the region is defined.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            return bool(self.redis.sismember(self.keys.regions, region))

    def epoch(self, bucket: int) -> int | None:
        """The bucket's current fencing epoch (the only valid one), None before any.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            current = self.redis.get(self.keys.epoch(bucket_role(bucket)))
        return None if current is None else int(current)

    def region_version(self, region: str) -> int:
        """The region's version counter now (0 before its first change).

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            return int(self.redis.get(self.keys.region_version(region)) or 0)

    # --- changes -----------------------------------------------------------------------

    def entry_args(
        self,
        kind: OperationKind,
        region: str,
        key: str,
        value: bytes | None,
        serializer: str | None,
        event_id: EventID,
        bucket: int,
        offset: int,
        want_old: bool,
        gateway_version: GatewayVersion | None = None,
        from_gateway: bool = False,
        epoch: int | None = None,
        expiration: RegionExpiration | None = None,
        now_ms: int = 0,
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of ``apply_entry.lua`` for one operation (see the script), for
        :meth:`run_batch`. The KEYS list is shared by every change of the same region and
        bucket: read it, never change it.

        ``gateway_version`` (multi-site members only) is stored with the entry;
        ``from_gateway`` makes the script refuse the change (status ``"STALE"``) when the
        stored version is from another site and newer (SPEC §6 conflict resolution).
        ``epoch`` is the caller's fencing epoch of the bucket (:mod:`regionbus.runtime.leases`); the
        script refuses the change (status ``"FENCED"``) when it is no longer current. None
        applies unfenced (tools, tests). ``expiration`` (regions with entry expiration) makes
        a create or update schedule the entry's expiry from ``now_ms`` (ms since the Unix
        epoch), and a destroy or invalidate unschedule it (:mod:`regionbus.broker.expiration`).
        """
        keys = self._entry_keys.get((region, bucket))
        if keys is None:
            if len(self._entry_keys) >= _ENTRY_KEYS_CACHED:
                self._entry_keys.clear()  # region names come from clients: keep it bounded
            k = self.keys
            keys = self._entry_keys[(region, bucket)] = [
                k.regions,
                k.region_values(region, bucket),
                k.region_meta(region, bucket),
                k.region_version(region),
                k.tracking(bucket),
                k.results(bucket),
                k.results_index(bucket),
                k.epoch(bucket_role(bucket)),
                k.region_gateway_versions(region, bucket),
                k.region_expiry(region, bucket),
                k.region_entry_times(region, bucket),
            ]
        args: list[Any] = [
            kind.value,
            region,
            key,
            value if value is not None else b"",
            serializer or "",
            f"{event_id.member}:{event_id.thread}",
            event_id.sequence,
            str(event_id),
            offset,
            "1" if want_old else "0",
            "" if epoch is None else epoch,
            gateway_version.timestamp_ms if gateway_version is not None else "",
            gateway_version.site_id if gateway_version is not None else 0,
            "1" if from_gateway else "0",
            expiration.entry_time_to_live.timeout_ms if expiration else 0,
            expiration.entry_idle_timeout.timeout_ms if expiration else 0,
            now_ms,
            "1" if expiration and expiration.action.is_destroy else "0",
        ]
        return keys, args

    def run_batch(
        self,
        batch: Sequence[tuple[list[str], list[Any]] | tuple[str, str, int, Access | None]],
    ) -> list[ApplyResult | tuple[bool, Entry | None]]:
        """Apply entry operations and read entries in order, in one pipelined round trip.

        Each run of consecutive changes is one call of ``apply_entries.lua`` (every change
        as ``apply_entry.lua`` alone would apply it) of at most
        :data:`APPLY_CALL_MAX_CHANGES`, so a poll batch of puts costs one Redis command, not
        one per put; a read between changes sees the changes before it.

        Args:
            batch: Items in processing order: ``(keys, args)`` from :meth:`entry_args` for a
                change, or ``(region, key, bucket, access)`` for a read; an
                :class:`Access` (regions with an entry idle timeout) records the read as an
                access of the entry.

        Returns:
            Per item, in order: an :class:`ApplyResult` for a change; ``(region_exists,
            entry)`` as :meth:`get` for a read.

        Raises:
            TransportError: Redis failed (some changes may have been applied; re-processing
                the same operations is safe: their EventIDs are recognised).
        """
        runs: list[list[tuple[list[str], list[Any]]] | tuple[str, str, int, Access | None]] = []
        for item in batch:
            if isinstance(item[0], list):
                if (
                    not runs
                    or not isinstance(runs[-1], list)
                    or len(runs[-1]) >= APPLY_CALL_MAX_CHANGES
                ):
                    runs.append([])
                changes = runs[-1]
                assert isinstance(changes, list)
                changes.append(item)
            else:
                runs.append(item)

        def build(pipe: redis.client.Pipeline) -> None:
            for run in runs:
                if isinstance(run, list):
                    keys = [k for change_keys, _ in run for k in change_keys]
                    args = [a for _, change_args in run for a in change_args]
                    self._apply_entries.queue(pipe, keys, args)
                    continue
                region, key, bucket, access = run
                pipe.sismember(self.keys.regions, region)
                pipe.hget(self.keys.region_meta(region, bucket), key)
                pipe.hget(self.keys.region_values(region, bucket), key)
                if access is not None:
                    self._touch_args(region, key, bucket, access, pipe)

        with redis_errors():
            replies = execute_with_scripts(self.redis, build, (self._apply_entries, self._touch))
        out: list[ApplyResult | tuple[bool, Entry | None]] = []
        i = 0
        for run in runs:
            if isinstance(run, list):
                out.extend(_to_apply_result(reply) for reply in replies[i])
                i += 1
            else:
                out.append(_to_entry(str(run[1]), replies[i], replies[i + 1], replies[i + 2]))
                i += 3 if run[3] is None else 4
        return out

    def _touch_args(
        self, region: str, key: str, bucket: int, access: Access, pipe: redis.client.Pipeline
    ) -> None:
        k = self.keys
        expiration = access.expiration
        self._touch.queue(
            pipe,
            [
                k.region_meta(region, bucket),
                k.region_values(region, bucket),
                k.region_expiry(region, bucket),
                k.region_entry_times(region, bucket),
            ],
            [
                key,
                expiration.entry_time_to_live.timeout_ms,
                expiration.entry_idle_timeout.timeout_ms,
                access.now_ms,
                "1" if expiration.action.is_destroy else "0",
            ],
        )

    def apply_region(
        self,
        kind: OperationKind,
        region: str,
        event_id: EventID,
        bucket: int,
        offset: int,
        epoch: int | None = None,
    ) -> ApplyResult:
        """Clear, destroy or invalidate a region over all its buckets, atomically (status
        ``FENCED`` and nothing done when ``epoch`` is not the bucket's current fencing
        epoch). An invalidate keeps every key, drops every value, and gives every entry
        the operation's new region version.

        Raises:
            TransportError: Redis failed.
        """
        k = self.keys
        keys = [k.regions, k.region_version(region), k.tracking(bucket), k.results(bucket)]
        keys += [k.results_index(bucket), k.epoch(bucket_role(bucket))]
        for b in range(self.total_buckets):
            keys += [k.region_values(region, b), k.region_meta(region, b)]
            keys += [k.region_gateway_versions(region, b), k.region_expiry(region, b)]
            keys.append(k.region_entry_times(region, b))
        args = [
            kind.value,
            region,
            f"{event_id.member}:{event_id.thread}",
            event_id.sequence,
            str(event_id),
            offset,
            "" if epoch is None else epoch,
        ]
        with redis_errors():
            return _to_apply_result(self._apply_region(keys=keys, args=args))

    def prune_results(self, below_offsets: Mapping[int, int]) -> int:
        """Forget stored results of operations below committed offsets of buckets, in one
        Redis round trip.

        Args:
            below_offsets: ``{bucket: committed {ns}.ops offset}``.

        Returns:
            How many results were dropped, over every bucket.

        Raises:
            TransportError: Redis failed.
        """
        if not below_offsets:
            return 0
        with redis_errors():
            pipe = self.redis.pipeline(transaction=False)
            for bucket, offset in below_offsets.items():
                keys = [self.keys.results(bucket), self.keys.results_index(bucket)]
                self._prune(keys=keys, args=[offset], client=pipe)
            return sum(int(n) for n in pipe.execute())

    # --- reads -------------------------------------------------------------------------

    def gateway_version(self, region: str, key: str, bucket: int) -> GatewayVersion | None:
        """The stored gateway version of an entry (or of its tombstone), if any.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            raw = self.redis.hget(self.keys.region_gateway_versions(region, bucket), key)
        if raw is None:
            return None
        timestamp_ms, _, site_id = raw.decode().partition("|")
        return GatewayVersion(int(timestamp_ms), int(site_id))

    def get(self, region: str, key: str, bucket: int) -> tuple[bool, Entry | None]:
        """Read one entry.

        Returns:
            ``(region_exists, entry)``; ``entry`` is None when absent, and has value None
            when invalid.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            pipe = self.redis.pipeline(transaction=True)
            pipe.sismember(self.keys.regions, region)
            pipe.hget(self.keys.region_meta(region, bucket), key)
            pipe.hget(self.keys.region_values(region, bucket), key)
            exists, meta, value = pipe.execute()
        return _to_entry(key, exists, meta, value)

    def snapshot(
        self,
        region: str,
        bucket: int,
        keys: Sequence[str] | None = None,
        key_filter: Callable[[str], bool] | None = None,
        with_values: bool = True,
    ) -> Snapshot:
        """Read the entries of one bucket that a registration covers.

        One owner processes a bucket's operations in order, so nothing changes the bucket
        between the two reads (metadata, then the values of the keys that qualify).

        Args:
            region: Region name.
            bucket: The bucket.
            keys: Read only these keys (a KEYS registration); None reads the whole bucket.
            key_filter: Keep only keys it accepts (a REGEX registration), applied before
                any value is read.
            with_values: Read values too (policy KEYS_VALUES); else entries carry none.

        Returns:
            Whether the region exists, the entries, and the region's version counter at
            the read (every later change of this bucket gets a higher version).

        Raises:
            TransportError: Redis failed.
        """
        meta_key = self.keys.region_meta(region, bucket)
        with redis_errors():
            pipe = self.redis.pipeline(transaction=True)
            pipe.sismember(self.keys.regions, region)
            pipe.get(self.keys.region_version(region))
            if keys is not None:
                pipe.hmget(meta_key, list(keys) or [""])
                exists, version_counter, metas = pipe.execute()
                found = [(k, m) for k, m in zip(keys, metas, strict=False) if m]
            else:
                pipe.hgetall(meta_key)
                exists, version_counter, all_metas = pipe.execute()
                found = [(k.decode(), m) for k, m in all_metas.items()]
            if key_filter is not None:
                found = [(k, m) for k, m in found if key_filter(k)]
            values: list[bytes | None] = [None] * len(found)
            if with_values and found:
                values = self.redis.hmget(
                    self.keys.region_values(region, bucket), [k for k, _ in found]
                )
        entries = []
        for (key, meta), value in zip(found, values, strict=True):
            version, _, serializer = meta.decode().partition("|")
            entries.append(Entry(key, int(version), value, serializer or None))
        return Snapshot(bool(exists), entries, int(version_counter or 0))

    def entries(self, region: str) -> dict[str, Entry]:
        """Every entry of a region across all buckets (for tests, tools, verification).

        Raises:
            TransportError: Redis failed.
        """
        out: dict[str, Entry] = {}
        for bucket in range(self.total_buckets):
            found = self.snapshot(region, bucket).entries
            out.update((e.key, e) for e in found)
        return out
