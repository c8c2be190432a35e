"""Entry changes: one pipelined round trip applies a poll batch's puts, destroys and
invalidates (``apply_entries.lua``), with the reads between them in order, and forgets
the stored results of operations already committed (``prune_results.lua``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from regionbus.broker.expiration_attributes import RegionExpiration
from regionbus.broker.lua_scripts import load_lua
from regionbus.broker.store.base import StoreBase
from regionbus.broker.store.results import (
    Access,
    ApplyResult,
    GatewayVersion,
    to_apply_result,
    to_entry,
)
from regionbus.runtime.redis_scripts import PipelinedScript
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import Entry, OperationKind
from regionbus.schemas.naming import bucket_role

APPLY_CALL_MAX_CHANGES: Final = 500
"""Most changes one ``apply_entries.lua`` call applies: a script blocks Redis while it
runs (lease renewals of every server included), so a poll batch of many put_all chunks
is cut into calls of a few milliseconds each, still in one round trip."""

APPLY_ENTRIES: Final = PipelinedScript(load_lua("apply_entries.lua"))
TOUCH_ENTRY: Final = PipelinedScript(load_lua("touch_entry.lua"))
PRUNE_RESULTS: Final = PipelinedScript(load_lua("prune_results.lua"))
SCRIPTS: Final = (APPLY_ENTRIES, TOUCH_ENTRY, PRUNE_RESULTS)

_ENTRY_KEYS_CACHED: Final = 4096
"""Most (region, bucket) key lists :meth:`EntryChanges.entry_args` keeps."""


_Run = list[tuple[list[str], list[Any]]] | tuple[str, str, int, "Access | None"]
"""A run of consecutive changes of one slot (one script call), or one read."""


class EntryChanges(StoreBase):
    """Applies entry operations (the store's part for them; see :class:`StoreBase` for
    the arguments)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._entry_keys: dict[tuple[str, int], list[str]] = {}
        """The KEYS of ``apply_entry.lua`` per (region, bucket): the same for every change
        of that bucket (callers only read them)."""

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
        expected_value: bytes | None = None,
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of ``apply_entry.lua`` for one operation (see the script), for
        :meth:`run_batch`. The KEYS list is shared by every change of the same region and
        bucket: read it, never change it.

        ``gateway_version`` (multi-site members only) is stored with the entry;
        ``from_gateway`` makes the script refuse the change (status ``"STALE"``) when the
        stored version is from another site and newer (docs/behaviour.md §6 conflict resolution).
        ``epoch`` is the caller's fencing epoch of the bucket (:mod:`regionbus.runtime.leases`); the
        script refuses the change (status ``"FENCED"``) when it is no longer current. None
        applies unfenced (tools, tests). ``expiration`` (regions with entry expiration) makes
        a create or update schedule the entry's expiry from ``now_ms`` (ms since the Unix
        epoch), and a destroy or invalidate unschedule it (:mod:`regionbus.broker.expiration`).
        ``expected_value`` is the value a ``REPLACE`` or ``REMOVE`` needs the entry to
        hold (None: any value for a replace, an invalid entry for a remove).
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
            "0" if expected_value is None else "1",
            b"" if expected_value is None else expected_value,
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
                        APPLY_ENTRIES.queue(pipe, keys, args)
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

        replies = self._execute(build, written.values())
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
        TOUCH_ENTRY.queue(
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
                PRUNE_RESULTS.queue(pipe, keys, [offset])

        return sum(int(n) for n in self.execute(build))


__all__ = ["APPLY_CALL_MAX_CHANGES", "SCRIPTS", "EntryChanges"]
