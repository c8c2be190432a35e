"""Gateway repair: make two sites' regions equal again after they diverged, moving only
what differs (``regionbus gateway repair``).

WAN delivery leaves two sites equal while every event reaches the other site. A partition
longer than the gateway queue's retention, or a queue lost with its disk, breaks that:
events were deleted unsent, and nothing will send them again. Neither Geode nor
MirrorMaker 2 repairs such sites; Cassandra does, with Merkle-tree anti-entropy repair,
and this is that, for regions.

Per region and bucket (the trees' steps: `regionbus.gateways.repair_trees`):

1. **Digest, at each site** (both at once). A Lua script (``lua/repair_digest.lua``)
   walks the bucket's entries in Redis a step at a time and keeps the leaves of a Merkle
   tree there: leaf = the first ``leaf_bits`` bits of SHA-1(key); leaf digest = XOR of
   SHA-1(the run's salt, key, gateway version) over the leaf's entries. Unless set,
   ``leaf_bits`` is sized to the bucket: about four leaves per entry of the larger site
   (:func:`leaf_bits_for`). An entry's gateway version (``<timestamp
   ms>|<site id>``, written at every change on a site with a ``distributed_system_id``)
   names the change that made it, so two sites hold the same entry exactly when they
   hold the same version.
2. **Descend the tree.** A binary tree built over the leaves in Redis
   (``lua/repair_tree.lua``), a level at a time (``lua/repair_nodes.lua``): one site's
   digests of the level's nodes go to the other, whose Redis answers which of its own
   differ, one bit a node; the roots first, then only the children of nodes that differ,
   down to the leaves. Of two children only the left one's digest is read: a node's digest
   is the XOR of its children's, so the right one's is the parent's XOR the left's. A
   bucket whose roots agree costs one 4-byte digest; a differing key, about 4 bytes a level
   below the levels it shares with other differences.
3. **Read the differing leaves' entries** at both sites (``lua/repair_entries.lua``: the
   keys and versions of those leaves only), and each key's tombstone (the gateway version
   a destroy leaves) where one site no longer has the key.
4. **Decide each key** as WAN delivery would have: the change with the later timestamp
   wins, then the higher site id (the servers' conflict check, docs/behaviour.md §6). A
   destroy whose tombstone is newer than the other site's entry wins as a destroy. With a
   ``GatewayConflictResolver``, it then runs as the losing site's gateway receiver would
   run it: on each change whose key the losing site last changed at another site than the
   change's own (`regionbus.gateways.filters.resolve_conflict`'s rule), seeing the losing
   site's value; it may disallow the change (that site keeps its entry) or change its
   value.
5. **Apply at the site that lost**, through its cache servers like a gateway receiver:
   an operation keeping the winning change's timestamp and origin site, with both sites
   in ``sites_reached`` (so no gateway sends it back), and an EventID of this run's own
   member (``repair-<run>``). The servers check the version again atomically, so a change
   made meanwhile at the losing site is never overwritten by an older one, and running a
   repair twice changes nothing the second time. The site's clients, listeners and CQs
   hear each change as they hear a gateway's.

What moves between the sites (``RepairReport.bytes_moved``, the bytes of the answers read
from each site's Redis): the tree nodes compared, the keys and versions of the differing
leaves, the tombstones asked for, and the winning values with their serializer.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

from regionbus.clients.pool import Pool
from regionbus.gateways.filters import (
    GatewayConflictResolver,
    TimestampedEntryEvent,
    conflicts,
    consult,
)
from regionbus.gateways.repair_trees import (
    MAX_LEAF_BITS,
    RepairSite,
    SiteReader,
    differing_leaves,
    leaf_bits_for,
)
from regionbus.schemas.errors import ConfigurationError, ServerTimeoutError
from regionbus.schemas.messages import EventID, EventKind, Operation, OperationKind, Reply
from regionbus.schemas.redis_values import GatewayVersion

APPLY_WINDOW = 500
"""Operations sent before their replies are waited for."""


@dataclass(frozen=True)
class KeyDecision:
    """What the repair decided for one key that differed.

    Attributes:
        region: The region.
        key: The key.
        winner_site_id: The site whose change won.
        action: ``"put"`` (the winner's value goes to the other site), ``"destroy"`` (the
            winner destroyed it) or ``"invalidate"``.
        version: The winning change's gateway version.
        loser_version: The losing site's gateway version (None: it had no trace of the key).
    """

    region: str
    key: str
    winner_site_id: int
    action: str
    version: GatewayVersion
    loser_version: GatewayVersion | None


@dataclass
class RepairReport:
    """What one repair run compared, found and did.

    Attributes:
        run_id: The run's id (its EventIDs' member is ``repair-<run_id>``).
        buckets_compared: Region buckets compared.
        buckets_differing: Of those, the ones whose tree roots differed.
        leaves_differing: Leaves whose digests differed.
        entries_read: Entries read from the differing leaves, both sites together.
        decisions: One per key that differed (the first ``max_decisions`` kept; every
            one is counted in ``keys_differing``).
        keys_differing: Keys whose state differed.
        applied: Changes the losing sites' servers applied.
        refused: Changes refused as older by the losing site's servers (it changed the
            key again after it was read: its newer change reaches the other site by WAN
            or by the next repair).
        failed: Changes the losing site's servers answered with an error (e.g. a region
            it does not define), or whose conflict resolver raised; ``errors`` keeps the
            first ten.
        disallowed: Changes the conflict resolver disallowed (the losing site keeps its
            entry, and the next run finds the key again).
        errors: ``"<key>: <error type>: <message>"`` of the first failed changes.
        bytes_moved: Bytes that crossed between the sites: tree nodes, the differing
            leaves' keys and versions, the winning values.
        bytes_by_step: ``bytes_moved`` by step: ``"tree"`` (the nodes' digests and the
            answers naming the differing ones), ``"entries"`` (the differing leaves' keys
            and versions, and the tombstones asked for), ``"values"`` (the winning values
            and their serializers).
        seconds: The run's duration.
        seconds_by_step: ``seconds`` by step: ``"digest"`` (the leaves and the tree built
            at both sites), ``"tree"`` (the descent), ``"entries"``, ``"apply"`` (values
            read and the changes applied).
    """

    run_id: str
    buckets_compared: int = 0
    buckets_differing: int = 0
    leaves_differing: int = 0
    entries_read: int = 0
    decisions: list[KeyDecision] = field(default_factory=list)
    keys_differing: int = 0
    applied: int = 0
    refused: int = 0
    failed: int = 0
    disallowed: int = 0
    errors: list[str] = field(default_factory=list)
    bytes_moved: int = 0
    bytes_by_step: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    seconds_by_step: dict[str, float] = field(default_factory=dict)


@contextmanager
def _step(report: RepairReport, name: str) -> Iterator[None]:
    """Adds the block's duration to ``report.seconds_by_step[name]``."""
    began = time.monotonic()
    try:
        yield
    finally:
        spent = time.monotonic() - began
        report.seconds_by_step[name] = report.seconds_by_step.get(name, 0.0) + spent


def _wins(a: GatewayVersion, b: GatewayVersion | None) -> bool:
    """Whether change ``a`` wins over ``b`` by the servers' rule: later timestamp, then
    higher site id (a site's own later change always replaces its earlier one)."""
    if b is None:
        return True
    return (a.timestamp_ms, a.site_id) > (b.timestamp_ms, b.site_id)


class GatewayRepair:
    """Compares and repairs the regions of two sites (see the module docstring).

    Args:
        a: One site.
        b: The other.
        total_buckets: Buckets of both sites (they must agree: a key is in the same
            bucket at both).
        leaf_bits: Leaves per bucket, as bits (1 to ``MAX_LEAF_BITS``); None (default):
            sized to each bucket by :func:`leaf_bits_for`.
        dry_run: Compare and decide, change nothing.
        apply_timeout_ms: Longest wait for the servers' answers to one window of changes.
        max_decisions: Most decisions the report lists (all are counted).
        conflict_resolver: Run on each conflicting change as the losing site's gateway
            receiver runs it (module docstring, step 4); None: the servers' rule alone.

    Raises:
        ConfigurationError: the two sites have the same id, or ``leaf_bits`` is not 1 to
            ``MAX_LEAF_BITS``.
    """

    def __init__(
        self,
        a: RepairSite,
        b: RepairSite,
        total_buckets: int,
        *,
        leaf_bits: int | None = None,
        dry_run: bool = False,
        apply_timeout_ms: int = 30_000,
        max_decisions: int = 1000,
        conflict_resolver: GatewayConflictResolver | None = None,
    ) -> None:
        if a.site_id == b.site_id:
            raise ConfigurationError(f"both sites have distributed_system_id {a.site_id}")
        if leaf_bits is not None and not 1 <= leaf_bits <= MAX_LEAF_BITS:
            raise ConfigurationError(f"leaf_bits must be 1 to {MAX_LEAF_BITS}, not {leaf_bits}")
        self.a, self.b = a, b
        self.total_buckets = total_buckets
        self.leaf_bits = leaf_bits
        self.dry_run = dry_run
        self.apply_timeout_ms = apply_timeout_ms
        self.max_decisions = max_decisions
        self.conflict_resolver = conflict_resolver
        self._sequences: dict[int, int] = {}

    def run(
        self, regions: Sequence[str], progress: Callable[[str], None] | None = None
    ) -> RepairReport:
        """Compare ``regions`` at both sites and (unless ``dry_run``) repair them.

        Returns:
            The run's :class:`RepairReport`.

        Raises:
            TransportError: Redis or Kafka failed (what was applied stays applied; run
                again).
            ServerTimeoutError: a site's servers did not answer a change in time.
        """
        began = time.monotonic()
        run_id = secrets.token_hex(6)
        report = RepairReport(run_id)
        self._sequences = {}
        readers = (SiteReader(self.a, run_id), SiteReader(self.b, run_id))
        pools: dict[int, Pool] = {}
        # The two sites' Lua steps run at once: each site's Redis works on its own half.
        both = ThreadPoolExecutor(2, thread_name_prefix=f"repair-{run_id}")
        try:
            for region in regions:
                for bucket in range(self.total_buckets):
                    decisions = self._bucket(readers, both, region, bucket, report)
                    if decisions and not self.dry_run:
                        with _step(report, "apply"):
                            self._apply(readers, pools, run_id, region, bucket, decisions, report)
                    report.bytes_by_step = dict(readers[0].received + readers[1].received)
                    report.bytes_moved = sum(report.bytes_by_step.values())
                if progress is not None:
                    progress(f"region {region}: {report.keys_differing} keys differed so far")
        finally:
            both.shutdown()
            for pool in pools.values():
                pool.close()
        report.seconds = time.monotonic() - began
        return report

    # --- compare -------------------------------------------------------------------------

    def _bucket(
        self,
        readers: tuple[SiteReader, SiteReader],
        both: ThreadPoolExecutor,
        region: str,
        bucket: int,
        report: RepairReport,
    ) -> list[KeyDecision]:
        report.buckets_compared += 1
        leaf_bits = self.leaf_bits
        try:
            with _step(report, "digest"):
                if leaf_bits is None:
                    counts = both.map(lambda r: r.entry_count(region, bucket), readers)
                    leaf_bits = leaf_bits_for(max(counts))
                bits = leaf_bits
                list(both.map(lambda r: r.digest(region, bucket, bits), readers))
            with _step(report, "tree"):
                leaves = differing_leaves(*readers, region, bucket, leaf_bits)
        finally:
            for reader in readers:
                reader.drop(region, bucket)
        if not leaves:
            return []
        report.buckets_differing += 1
        report.leaves_differing += len(leaves)
        with _step(report, "entries"):
            found = list(both.map(lambda r: r.entries(region, bucket, bits, leaves), readers))
            report.entries_read += sum(len(f) for f in found)
            return self._decide(readers, region, bucket, found, report)

    def _decide(
        self,
        readers: tuple[SiteReader, SiteReader],
        region: str,
        bucket: int,
        found: list[dict[str, GatewayVersion | None]],
        report: RepairReport,
    ) -> list[KeyDecision]:
        at_a, at_b = found
        only_a = sorted(set(at_a) - set(at_b))
        only_b = sorted(set(at_b) - set(at_a))
        gone_at_b = dict(zip(only_a, readers[1].tombstones(region, bucket, only_a), strict=True))
        gone_at_a = dict(zip(only_b, readers[0].tombstones(region, bucket, only_b), strict=True))
        decisions: list[KeyDecision] = []
        ids = (self.a.site_id, self.b.site_id)
        for key in sorted(set(at_a) | set(at_b)):
            if key in at_a and key in at_b:
                va, vb = at_a[key], at_b[key]
                if va == vb or va is None or vb is None:
                    continue  # equal, or a site keeps no versions: nothing to go by
                winner = 0 if _wins(va, vb) else 1
                versions = (va, vb)
                decisions.append(
                    KeyDecision(
                        region, key, ids[winner], "put", versions[winner], versions[1 - winner]
                    )
                )
            else:
                here = 0 if key in at_a else 1
                live = (at_a if here == 0 else at_b)[key]
                tomb = (gone_at_b if here == 0 else gone_at_a)[key]
                if live is None:
                    continue
                if tomb is not None and _wins(tomb, live):
                    decisions.append(KeyDecision(region, key, ids[1 - here], "destroy", tomb, live))
                else:
                    decisions.append(KeyDecision(region, key, ids[here], "put", live, tomb))
        report.keys_differing += len(decisions)
        room = self.max_decisions - len(report.decisions)
        report.decisions.extend(decisions[: max(room, 0)])
        return decisions

    # --- apply ---------------------------------------------------------------------------

    def _apply(
        self,
        readers: tuple[SiteReader, SiteReader],
        pools: dict[int, Pool],
        run_id: str,
        region: str,
        bucket: int,
        decisions: list[KeyDecision],
        report: RepairReport,
    ) -> None:
        by_site = {s.site.site_id: s for s in readers}
        for winner_id in by_site:
            mine = [d for d in decisions if d.winner_site_id == winner_id]
            if not mine:
                continue
            loser = next(s for s in readers if s.site.site_id != winner_id)
            puts = [d.key for d in mine if d.action == "put"]
            values = dict(zip(puts, by_site[winner_id].values(region, bucket, puts), strict=True))
            if self.conflict_resolver is not None:
                mine = self._resolve(self.conflict_resolver, mine, values, loser, bucket, report)
            pool = pools.get(loser.site.site_id)
            if pool is None:
                pool = Pool(loser.site.client_settings, f"gw-repair-{run_id}", f"repair-{run_id}")
                pools[loser.site.site_id] = pool
            ops: list[tuple[Operation, int]] = []
            for decision in mine:
                value, serializer = values.get(decision.key, (None, None))
                kind = OperationKind.PUT
                if decision.action == "destroy":
                    kind = OperationKind.DESTROY
                elif value is None:
                    kind = OperationKind.INVALIDATE
                ops.append(
                    (
                        self._operation(
                            pool, run_id, decision, kind, value, serializer, loser, bucket
                        ),
                        bucket,
                    )
                )
            for start in range(0, len(ops), APPLY_WINDOW):
                self._send(pool, ops[start : start + APPLY_WINDOW], report)

    @staticmethod
    def _resolve(
        resolver: GatewayConflictResolver,
        decisions: list[KeyDecision],
        values: dict[str, tuple[bytes | None, str | None]],
        loser: SiteReader,
        bucket: int,
        report: RepairReport,
    ) -> list[KeyDecision]:
        """The decisions ``resolver`` allows, of one winning site's over ``loser``; a value
        it changes replaces the winner's in ``values``."""
        keys = [d.key for d in decisions if conflicts(d.loser_version, d.version.site_id)]
        if not keys:
            return decisions
        region = decisions[0].region
        current = dict(zip(keys, loser.values(region, bucket, keys), strict=True))
        allowed: list[KeyDecision] = []
        for d in decisions:
            if d.key not in current or d.loser_version is None:
                allowed.append(d)
                continue
            old_value, old_serializer = current[d.key]
            new_value, serializer = values.get(d.key, (None, None))
            kind = EventKind.UPDATE if old_value is not None else EventKind.CREATE
            if d.action == "destroy":
                kind = EventKind.DESTROY
            elif new_value is None:
                kind = EventKind.INVALIDATE
            event = TimestampedEntryEvent(
                region=d.region,
                key=d.key,
                kind=kind,
                new_value=new_value,
                old_value=old_value,
                serializer=serializer or old_serializer,
                new_timestamp_ms=d.version.timestamp_ms,
                old_timestamp_ms=d.loser_version.timestamp_ms,
                new_distributed_system_id=d.version.site_id,
                old_distributed_system_id=d.loser_version.site_id,
            )
            try:
                allowed_here, value = consult(resolver, event)
            except Exception as exc:  # an application's hook: its failure is one key's
                report.failed += 1
                if len(report.errors) < 10:
                    report.errors.append(f"{d.key}: {type(exc).__name__}: {exc}")
                continue
            if not allowed_here:
                report.disallowed += 1
                continue
            if value != new_value:
                values[d.key] = (value, serializer or old_serializer)
            allowed.append(d)
        return allowed

    def _operation(
        self,
        pool: Pool,
        run_id: str,
        decision: KeyDecision,
        kind: OperationKind,
        value: bytes | None,
        serializer: str | None,
        loser: SiteReader,
        bucket: int,
    ) -> Operation:
        # The servers take a change as a duplicate when its EventID's sequence is not above
        # the last one of its member and thread: one thread per bucket, whose operations
        # go in order on the bucket's partition, numbered 1, 2, ... A run is a member of
        # its own, so its EventIDs never look like an earlier run's.
        sequence = self._sequences.get(bucket, 0) + 1
        self._sequences[bucket] = sequence
        return Operation(
            request_id=pool.next_request_id(),
            client_id=pool.client_id,
            kind=kind,
            region=decision.region,
            timestamp_ms=decision.version.timestamp_ms,
            event_id=EventID(f"repair-{run_id}", bucket, sequence, bucket),
            key=decision.key,
            value=value if kind is OperationKind.PUT else None,
            serializer=serializer,
            origin_site_id=decision.version.site_id,
            sites_reached=tuple(sorted({decision.winner_site_id, loser.site.site_id})),
            kafka_principal=pool.kafka_principal,
        )

    def _send(self, pool: Pool, ops: list[tuple[Operation, int]], report: RepairReport) -> None:
        deadline = time.monotonic() + self.apply_timeout_ms / 1000
        futures: list[Future[list[Reply]]] = pool.request_each(ops)
        for (op, _), future in zip(ops, futures, strict=True):
            try:
                reply = future.result(timeout=max(0.0, deadline - time.monotonic()))[-1]
            except TimeoutError as exc:
                raise ServerTimeoutError(
                    f"site {op.origin_site_id}'s servers did not answer a repair of {op.key!r}"
                ) from exc
            if reply.ok and reply.event_kind is not None:
                report.applied += 1
            elif reply.ok or reply.error_type == "EntryNotFoundError":
                report.refused += 1
            else:
                report.failed += 1
                if len(report.errors) < 10:
                    report.errors.append(f"{op.key}: {reply.error_type}: {reply.error_message}")


__all__ = [
    "GatewayRepair",
    "KeyDecision",
    "RepairReport",
    "RepairSite",
]
