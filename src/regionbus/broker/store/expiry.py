"""Entry expiry in Redis: the due entries of a bucket's schedule, their claims by the
bucket's primary (``claim_expiry.lua``) and the expirations applied (``expire_entry.lua``).
When and by whom they run is :mod:`regionbus.broker.expiration`'s."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

from regionbus.broker.lua_scripts import load_lua
from regionbus.broker.store.base import StoreBase
from regionbus.broker.store.results import ApplyResult, to_apply_result
from regionbus.runtime.redis_connect import redis_errors
from regionbus.runtime.redis_scripts import PipelinedScript
from regionbus.schemas.eventid import EventID
from regionbus.schemas.naming import bucket_role

CLAIM_EXPIRY: Final = PipelinedScript(load_lua("claim_expiry.lua"))
EXPIRE_ENTRY: Final = PipelinedScript(load_lua("expire_entry.lua"))
SCRIPTS: Final = (CLAIM_EXPIRY, EXPIRE_ENTRY)


class DueExpiry(NamedTuple):
    """An entry whose scheduled expiry has come.

    Attributes:
        at_ms: Its expiry time, ms since the Unix epoch.
        region: Region name.
        bucket: Its bucket.
        key: Its key.
    """

    at_ms: int
    region: str
    bucket: int
    key: str


class Claims(NamedTuple):
    """What :meth:`ExpiryStore.claim_expiries` did.

    Attributes:
        claimed: ``(entry, sequence id)`` of each entry claimed, by bucket and sequence id
            (the order they must be applied in).
        fenced: The buckets whose epoch was no longer current (another server is primary):
            nothing of theirs was claimed.
    """

    claimed: list[tuple[DueExpiry, int]]
    fenced: set[int]


class ExpiryStore(StoreBase):
    """Reads, claims and applies entry expirations (the store's part for them; see
    :class:`StoreBase` for the arguments)."""

    def due_expiries(
        self, regions: Iterable[str], buckets: Iterable[int], now_ms: int, limit: int
    ) -> list[DueExpiry]:
        """The earliest ``limit`` entries due by ``now_ms`` over the regions and buckets
        given, earliest first: one pipelined round trip.

        Raises:
            TransportError: Redis failed.
        """
        looked = [(region, bucket) for region in regions for bucket in sorted(buckets)]
        with redis_errors():
            pipe = self.redis.pipeline(transaction=False)
            for region, bucket in looked:
                pipe.zrangebyscore(
                    self.keys.region_expiry(region, bucket),
                    "-inf",
                    now_ms,
                    start=0,
                    num=limit,
                    withscores=True,
                )
            replies = pipe.execute()
        due = [
            DueExpiry(int(score), region, bucket, member.decode())
            for (region, bucket), found in zip(looked, replies, strict=True)
            for member, score in found
        ]
        due.sort()
        return due[:limit]

    def claim_expiries(
        self, due: Iterable[DueExpiry], epochs: Mapping[int, int], member: str
    ) -> Claims:
        """Claim due entries for ``member``, fenced by each bucket's epoch: one script per
        bucket and region, in one round trip. An entry whose schedule changed since it was
        read, or that is claimed already, gets no new claim (a claim taken over keeps its
        sequence id).

        Args:
            due: The entries (from :meth:`due_expiries`).
            epochs: ``{bucket: the caller's fencing epoch}`` of every bucket in ``due``.
            member: The claiming server's member id.

        Raises:
            TransportError: Redis failed (nothing claimed is lost: the claims are kept in
                Redis and taken again at the next look).
        """
        keys = self.keys
        groups: dict[tuple[int, str], list[DueExpiry]] = {}
        for item in due:
            groups.setdefault((item.bucket, item.region), []).append(item)

        def build(pipe: Any) -> None:
            for (bucket, region), items in groups.items():
                args: list[Any] = [epochs[bucket], member]
                for item in items:
                    args += [item.key, item.at_ms]
                CLAIM_EXPIRY.queue(
                    pipe,
                    [
                        keys.epoch(bucket_role(bucket)),
                        keys.expiry_sequence(bucket),
                        keys.region_expiry_claims(region, bucket),
                        keys.region_expiry(region, bucket),
                    ],
                    args,
                )

        replies = self.execute(build, {bucket for bucket, _ in groups})
        claims = Claims([], set())
        for ((bucket, _), items), reply in zip(groups.items(), replies, strict=True):
            if not isinstance(reply, list):  # FENCED
                claims.fenced.add(bucket)
                continue
            claims.claimed.extend(
                (item, int(seq)) for item, seq in zip(items, reply, strict=True) if seq
            )
        claims.claimed.sort(key=lambda c: (c[0].bucket, c[1]))
        return claims

    def expire_entry(
        self,
        *,
        region: str,
        key: str,
        expiry_ms: int,
        destroy: bool,
        event_id: EventID,
        producer: str,
        bucket: int,
        offset: int,
        epoch: int,
        want_old: bool,
    ) -> ApplyResult:
        """Apply one claimed expiration (``expire_entry.lua``; see the script).

        Args:
            region, key: The entry.
            expiry_ms: The expiry time claimed (the operation's ``timestamp_ms``).
            destroy: Destroy the entry (else invalidate it).
            event_id: The expiration's EventID, its thread widened with ``bucket``.
            producer: The member that produced the expiration (its claim's holder).
            bucket: The entry's bucket.
            offset: The operation's offset in the bucket's partition of ``{ns}.ops``.
            epoch: The caller's fencing epoch of ``bucket``.
            want_old: Return the value before the expiration.

        Returns:
            The result; its status is also ``"UNCLAIMED"`` (not the claimed expiration),
            ``"STALE"`` (the entry's schedule moved since) or ``"GONE"`` (no entry): then
            nothing changed.

        Raises:
            TransportError: Redis failed (the operation is read again from the committed
                offset; its EventID is recognised if it was applied).
        """
        keys = self.keys
        (reply,) = self.execute(
            lambda pipe: EXPIRE_ENTRY.queue(
                pipe,
                [
                    keys.regions(bucket),
                    keys.region_values(region, bucket),
                    keys.region_meta(region, bucket),
                    keys.region_version(region, bucket),
                    keys.epoch(bucket_role(bucket)),
                    keys.region_expiry(region, bucket),
                    keys.region_entry_times(region, bucket),
                    keys.region_expiry_claims(region, bucket),
                    keys.tracking(bucket),
                    keys.results(bucket),
                    keys.results_index(bucket),
                ],
                [
                    region,
                    key,
                    expiry_ms,
                    "DESTROY" if destroy else "INVALIDATE",
                    epoch,
                    "1" if want_old else "0",
                    producer,
                    f"{event_id.member}:{event_id.thread}",
                    event_id.sequence,
                    str(event_id),
                    offset,
                ],
            ),
            [bucket],
        )
        return to_apply_result(reply)


__all__ = ["SCRIPTS", "Claims", "DueExpiry", "ExpiryStore"]
