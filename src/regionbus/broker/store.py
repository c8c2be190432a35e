"""The region store: authoritative region state in Redis, changed only through Lua scripts.

Layout (keys from :class:`regionbus.schemas.naming.RedisKeys`, all of one bucket in one
Redis Cluster hash slot; ``docs/redis-cluster.md`` says why): per region and bucket a values
hash (key -> value bytes; a missing field is an invalid entry), a meta hash (key ->
``"<version>|<serializer>"``; a field here means the entry exists) and a version counter;
per bucket a copy of the region names, the tracking hash (member:thread -> highest applied
sequence id) and the stored results of recent EventIDs, so a re-processed or retried
operation is recognised and its event re-emitted unchanged.

The same code runs on one Redis and on a Redis Cluster (a redis-py ``RedisCluster``
client): every Lua call's keys are in one bucket's slot, a poll batch makes one call per
slot it touches, and a region operation is applied bucket by bucket.

Redis errors are translated here, at this one boundary, into :class:`TransportError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from redis.cluster import RedisCluster
from redis.crc import key_slot

from regionbus.broker.expiration_attributes import RegionExpiration
from regionbus.broker.lua_scripts import load_lua
from regionbus.broker.store_results import (
    Access,
    ApplyResult,
    GatewayVersion,
    Snapshot,
    text_of,
    to_apply_result,
    to_entry,
    version_of,
)
from regionbus.runtime.redis_connect import redis_errors
from regionbus.runtime.redis_replication import ReplicaWait
from regionbus.runtime.redis_scripts import PipelinedScript, execute_with_scripts
from regionbus.schemas.callbacks import region_event_kind
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import Entry, OperationKind
from regionbus.schemas.naming import RedisKeys, bucket_role, entry_version, region_bucket
from regionbus.schemas.redis_values import format_result, parse_gateway_version, parse_meta

APPLY_CALL_MAX_CHANGES: Final = 500
"""Most changes one ``apply_entries.lua`` call applies: a script blocks Redis while it
runs (lease renewals of every server included), so a poll batch of many put_all chunks
is cut into calls of a few milliseconds each, still in one round trip."""


_ENTRY_KEYS_CACHED: Final = 4096
"""Most (region, bucket) key lists :meth:`RegionStore.entry_args` keeps."""


_Run = list[tuple[list[str], list[Any]]] | tuple[str, str, int, "Access | None"]
"""A run of consecutive changes of one slot (one script call), or one read."""


class RegionStore:
    """Reads and changes region state of one namespace in Redis.

    Args:
        client: A redis-py client (``redis.Redis`` or ``RedisCluster``) created with
            ``decode_responses=False``.
        namespace: The site namespace.
        total_buckets: Number of buckets.
        replica_wait: Makes every change wait for replicas before it counts as applied
            (:mod:`regionbus.runtime.redis_replication`); None waits for none.
    """

    def __init__(
        self,
        client: Any,
        namespace: str,
        total_buckets: int,
        replica_wait: ReplicaWait | None = None,
    ) -> None:
        self.redis = client
        self.keys = RedisKeys(namespace)
        self.total_buckets = total_buckets
        self.replica_wait = replica_wait
        self.cluster = isinstance(client, RedisCluster)
        self._slots = [
            key_slot(self.keys.bucket_prefix(b).encode()) if self.cluster else 0
            for b in range(total_buckets)
        ]
        """Hash slot of each bucket on a Redis Cluster; all 0 on one Redis, where a script
        may take keys of several buckets."""
        self._slot_of_tracking = {
            self.keys.tracking(b): self._slots[b] for b in range(total_buckets)
        }
        self._entry_keys: dict[tuple[str, int], list[str]] = {}
        """The KEYS of ``apply_entry.lua`` per (region, bucket): the same for every change
        of that bucket (callers only read them)."""
        self._apply_entries = PipelinedScript(load_lua("apply_entries.lua"))
        self._touch = PipelinedScript(load_lua("touch_entry.lua"))
        self._region_begin = PipelinedScript(load_lua("region_begin.lua"))
        self._region_bucket_op = PipelinedScript(load_lua("region_bucket_op.lua"))
        self._region_finish = PipelinedScript(load_lua("region_finish.lua"))
        self._prune = PipelinedScript(load_lua("prune_results.lua"))
        self.scripts = (
            self._apply_entries,
            self._touch,
            self._region_begin,
            self._region_bucket_op,
            self._region_finish,
            self._prune,
        )
        """Every script this store queues (to load them all after a ``NOSCRIPT``)."""

    def execute(
        self, build: Callable[[Any], None], written_buckets: Iterable[int] = ()
    ) -> list[Any]:
        """Run what ``build`` queues in one pipeline, waiting for replicas of the buckets
        written (see :func:`regionbus.broker.lua_scripts.execute_with_scripts`).

        Raises:
            TransportError: Redis failed, or too few replicas confirmed the writes
                (:class:`regionbus.schemas.errors.ReplicationTimeoutError`).
        """
        with redis_errors():
            return execute_with_scripts(
                self.redis,
                build,
                self.scripts,
                replica_wait=self.replica_wait,
                written_keys=[self.keys.tracking(b) for b in written_buckets],
            )

    # --- regions -----------------------------------------------------------------------

    def create_region(self, region: str) -> bool:
        """Define a region (idempotent): its name goes into every bucket's copy of the
        region names, in one round trip. Calling it again completes a definition an outage
        interrupted.

        Returns:
            True when it was new in some bucket.

        Raises:
            TransportError: Redis failed.
        """
        buckets = range(self.total_buckets)

        def build(pipe: Any) -> None:
            for bucket in buckets:
                pipe.sadd(self.keys.regions(bucket), region)

        return any(self.execute(build, buckets))

    def region_names(self) -> set[str]:
        """The names of every defined region (in any bucket's copy).

        Raises:
            TransportError: Redis failed.
        """

        def build(pipe: Any) -> None:
            for bucket in range(self.total_buckets):
                pipe.smembers(self.keys.regions(bucket))

        return {r.decode() for names in self.execute(build) for r in names}

    def region_exists(self, region: str, bucket: int | None = None) -> bool:
        """Whether the region is defined, as the bucket's scripts see it.

        Args:
            region: Region name.
            bucket: The bucket whose copy of the region names to read; None reads the
                region's own bucket (:func:`regionbus.schemas.naming.region_bucket`).

        Raises:
            TransportError: Redis failed.
        """
        if bucket is None:
            bucket = region_bucket(region, self.total_buckets)
        with redis_errors():
            return bool(self.redis.sismember(self.keys.regions(bucket), region))

    def epoch(self, bucket: int) -> int | None:
        """The bucket's current fencing epoch (the only valid one), None before any.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            current = self.redis.get(self.keys.epoch(bucket_role(bucket)))
        return None if current is None else int(current)

    def region_version(self, region: str, bucket: int) -> int:
        """The version of the last change of the region in one bucket (0 before any):
        every later change of the bucket gets a higher one.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            return version_of(
                self.redis.hmget(self.keys.region_version(region, bucket), "gen", "n")
            )

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
                k.regions(bucket),
                k.region_values(region, bucket),
                k.region_meta(region, bucket),
                k.region_version(region, bucket),
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

        The items of each hash slot (each bucket's, on a Redis Cluster; all of them on one
        Redis) keep their order, and each run of consecutive changes among them is one call
        of ``apply_entries.lua`` (every change as ``apply_entry.lua`` alone would apply it)
        of at most :data:`APPLY_CALL_MAX_CHANGES`. So a poll batch of puts costs one Redis
        command per slot it touches, not one per put; a read between changes of its bucket
        sees the changes before it. Buckets are independent (each is ordered by its own
        partition of ``{ns}.ops``), so their items need no order between them.

        Args:
            batch: Items in processing order: ``(keys, args)`` from :meth:`entry_args` for a
                change, or ``(region, key, bucket, access)`` for a read; an
                :class:`Access` (regions with an entry idle timeout) records the read as an
                access of the entry.

        Returns:
            Per item, in order: an :class:`ApplyResult` for a change; ``(region_exists,
            entry)`` as :meth:`get` for a read.

        Raises:
            TransportError: Redis failed, or too few replicas confirmed the changes (some
                changes may have been applied; re-processing the same operations is safe:
                their EventIDs are recognised).
        """
        runs_of: dict[int, list[_Run]] = {}
        written: dict[int, str] = {}
        positions: list[tuple[int, int, int]] = []
        """Per item: its slot, its run among the slot's, its index in that run (-1: a read)."""
        for item in batch:
            if isinstance(item[0], list):
                tracking = item[0][4]
                slot = self._slot_of_tracking[tracking]
                written.setdefault(slot, tracking)
                runs = runs_of.setdefault(slot, [])
                last = runs[-1] if runs else None
                if not isinstance(last, list) or len(last) >= APPLY_CALL_MAX_CHANGES:
                    last = []
                    runs.append(last)
                positions.append((slot, len(runs) - 1, len(last)))
                last.append(item)
            else:
                slot = self._slots[item[2]]
                runs = runs_of.setdefault(slot, [])
                positions.append((slot, len(runs), -1))
                runs.append(item)
        first_reply: dict[tuple[int, int], int] = {}

        def build(pipe: Any) -> None:
            count = 0
            for slot, runs in runs_of.items():
                for index, run in enumerate(runs):
                    first_reply[(slot, index)] = count
                    if isinstance(run, list):
                        keys = [k for change_keys, _ in run for k in change_keys]
                        args = [a for _, change_args in run for a in change_args]
                        self._apply_entries.queue(pipe, keys, args)
                        count += 1
                        continue
                    region, key, bucket, access = run
                    pipe.sismember(self.keys.regions(bucket), region)
                    pipe.hget(self.keys.region_meta(region, bucket), key)
                    pipe.hget(self.keys.region_values(region, bucket), key)
                    count += 3
                    if access is not None:
                        self._touch_args(region, key, bucket, access, pipe)
                        count += 1

        with redis_errors():
            replies = execute_with_scripts(
                self.redis,
                build,
                self.scripts,
                replica_wait=self.replica_wait,
                written_keys=written.values(),
            )
        out: list[ApplyResult | tuple[bool, Entry | None]] = []
        for (slot, index, within), item in zip(positions, batch, strict=True):
            i = first_reply[(slot, index)]
            if within >= 0:
                out.append(to_apply_result(replies[i][within]))
            else:
                out.append(to_entry(str(item[1]), replies[i], replies[i + 1], replies[i + 2]))
        return out

    def _touch_args(self, region: str, key: str, bucket: int, access: Access, pipe: Any) -> None:
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
        """Clear, destroy or invalidate a region over all its buckets (status ``FENCED`` and
        nothing done when ``epoch`` is not the bucket's current fencing epoch). An
        invalidate keeps every key, drops every value, and gives every entry the
        operation's version.

        Three round trips, as a Redis Cluster runs no script over several slots:
        ``region_begin.lua`` in the region's bucket (fencing, duplicate check, the
        operation's generation), ``region_bucket_op.lua`` once per bucket (pipelined), and
        ``region_finish.lua`` (EventID and result recorded). Each bucket changes at once,
        not every bucket at the same instant: a read of another bucket meanwhile may see
        it before the operation. An operation interrupted on the way is completed, with the
        same version, when it is processed again (see the scripts).

        Args:
            kind: ``CLEAR``, ``DESTROY_REGION`` or ``INVALIDATE_REGION``.
            region: Region name.
            event_id: The operation's EventID (its thread widened with ``bucket``).
            bucket: The region's own bucket (:func:`regionbus.schemas.naming.region_bucket`).
            offset: The operation's offset in the bucket's partition of ``{ns}.ops``.
            epoch: The caller's fencing epoch of ``bucket``; None applies unfenced.

        Raises:
            TransportError: Redis failed, or too few replicas confirmed the changes.
        """
        k = self.keys
        tracking_field = f"{event_id.member}:{event_id.thread}"
        fence = "" if epoch is None else epoch
        (begun,) = self.execute(
            lambda pipe: self._region_begin.queue(
                pipe,
                [
                    k.regions(bucket),
                    k.tracking(bucket),
                    k.results(bucket),
                    k.epoch(bucket_role(bucket)),
                    k.region_version(region, bucket),
                ],
                [region, tracking_field, event_id.sequence, str(event_id), fence],
            ),
            [bucket],
        )
        if text_of(begun[0]) != "GO":
            return to_apply_result(begun)
        generation = int(begun[1])

        def each_bucket(pipe: Any) -> None:
            for b in range(self.total_buckets):
                self._region_bucket_op.queue(
                    pipe,
                    [
                        k.regions(b),
                        k.region_version(region, b),
                        k.region_values(region, b),
                        k.region_meta(region, b),
                        k.region_gateway_versions(region, b),
                        k.region_expiry(region, b),
                        k.region_entry_times(region, b),
                    ],
                    [kind.value, region, generation],
                )

        self.execute(each_bucket, range(self.total_buckets))
        result = format_result(region_event_kind(kind), entry_version(generation, 0))
        (finished,) = self.execute(
            lambda pipe: self._region_finish.queue(
                pipe,
                [
                    k.tracking(bucket),
                    k.results(bucket),
                    k.results_index(bucket),
                    k.epoch(bucket_role(bucket)),
                    k.region_version(region, bucket),
                ],
                [tracking_field, event_id.sequence, str(event_id), offset, fence, result],
            ),
            [bucket],
        )
        return to_apply_result(finished)

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

        def build(pipe: Any) -> None:
            for bucket, offset in below_offsets.items():
                keys = [self.keys.results(bucket), self.keys.results_index(bucket)]
                self._prune.queue(pipe, keys, [offset])

        return sum(int(n) for n in self.execute(build))

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
        return parse_gateway_version(raw)

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
            pipe.sismember(self.keys.regions(bucket), region)
            pipe.hget(self.keys.region_meta(region, bucket), key)
            pipe.hget(self.keys.region_values(region, bucket), key)
            exists, meta, value = pipe.execute()
        return to_entry(key, exists, meta, value)

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
            pipe.sismember(self.keys.regions(bucket), region)
            pipe.hmget(self.keys.region_version(region, bucket), "gen", "n")
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
            version, serializer = parse_meta(meta)
            entries.append(Entry(key, version, value, serializer))
        return Snapshot(bool(exists), entries, version_of(version_counter))

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
