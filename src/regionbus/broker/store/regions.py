"""Regions: their definition in every bucket's copy of the region names, their version
counters, and the region-wide operations (clear, destroy, invalidate) applied bucket by
bucket."""

from __future__ import annotations

from typing import Any, Final

from regionbus.broker.lua_scripts import load_lua
from regionbus.broker.store.base import StoreBase
from regionbus.broker.store.results import ApplyResult, text_of, to_apply_result, version_of
from regionbus.runtime.redis_connect import redis_errors
from regionbus.runtime.redis_scripts import PipelinedScript
from regionbus.schemas.callbacks import region_event_kind
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import OperationKind
from regionbus.schemas.naming import bucket_role, entry_version, region_bucket
from regionbus.schemas.redis_values import format_result

REGION_BEGIN: Final = PipelinedScript(load_lua("region_begin.lua"))
REGION_BUCKET_OP: Final = PipelinedScript(load_lua("region_bucket_op.lua"))
REGION_FINISH: Final = PipelinedScript(load_lua("region_finish.lua"))
SCRIPTS: Final = (REGION_BEGIN, REGION_BUCKET_OP, REGION_FINISH)


class RegionChanges(StoreBase):
    """Defines regions and applies region-wide operations (the store's part for them; see
    :class:`StoreBase` for the arguments)."""

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

    def region_state(self, region: str, bucket: int) -> tuple[bool, int]:
        """``(region_exists, version)`` in one bucket, read together in one round trip (a
        registration's: a storm of them is processed in a row).

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            pipe = self.redis.pipeline(transaction=True)
            pipe.sismember(self.keys.regions(bucket), region)
            pipe.hmget(self.keys.region_version(region, bucket), "gen", "n")
            exists, version = pipe.execute()
        return bool(exists), version_of(version)

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
            lambda pipe: REGION_BEGIN.queue(
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
                REGION_BUCKET_OP.queue(
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
            lambda pipe: REGION_FINISH.queue(
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


__all__ = ["SCRIPTS", "RegionChanges"]
