"""Which buckets this server processes, from where, and how far it has committed.

A bucket is one partition of ``{ns}.ops`` (bucket 0 also brings ``{ns}.control``). The
election (:mod:`regionbus.broker.buckets`) says which buckets this server is primary of; this part
assigns their partitions to the server's consumer from the committed offsets, drops them
at once when a lease is lost or a write is fenced, hands them over cleanly, and commits.

Commits (ARCHITECTURE.md): every ``message_sync_interval_s`` the positions of the
operations processed so far are noted with the outbox's mark, and committed once every
message produced before the mark is delivered, so after a failover the new primary
re-processes a bounded window whose EventIDs Redis recognises. The loop goes on meanwhile
(a flush would stop it for a produce round trip each time: the latency of whatever
arrives then). A message Kafka did not take makes the server go back to the committed
offsets instead of committing past it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from regionbus.broker.buckets import BucketElection
from regionbus.broker.outbox import Outbox
from regionbus.broker.stats import ServerStats
from regionbus.broker.store import RegionStore
from regionbus.schemas.naming import Topics
from regionbus.schemas.record_guard import Polled, UnreadableRecords
from regionbus.schemas.transport import assign_from, committed_offsets

log = logging.getLogger("regionbus.server")

_COMMITTED_TIMEOUT_S = 10.0
_FINAL_FLUSH_S = 30.0


class _Checkpoint(NamedTuple):
    """Positions to commit once every message produced before ``mark`` is delivered."""

    mark: int
    positions: dict[tuple[str, int], int]
    epochs: dict[int, int]


class BucketOwnership:
    """The buckets this server is primary of, its consumer's assignment and its commits.

    Args:
        consumer: The server's consumer of ``{ns}.ops`` and ``{ns}.control`` (``assign()``
            only, never group rebalancing), created with ``on_commit`` = `on_commit`.
        election: The bucket election.
        outbox: What must be delivered before a commit.
        store: The region store (stored apply results are pruned at each commit).
        topics: The namespace's topic names.
        stats: The server's counters (buckets gained, lost, fenced).
        member_id: This server, for logs.
        lease_ttl_ms: The bucket lease (the loop no longer waits on a flush bounded by it:
            commits wait for delivery reports instead, see :meth:`commit_settled`).
    """

    def __init__(
        self,
        consumer: Consumer,
        election: BucketElection,
        outbox: Outbox,
        store: RegionStore,
        topics: Topics,
        stats: ServerStats,
        member_id: str,
        lease_ttl_ms: int,
    ) -> None:
        self._consumer = consumer
        self.election = election
        self._outbox = outbox
        self._store = store
        self._topics = topics
        self._stats = stats
        self._member_id = member_id
        self.owned: dict[int, int] = {}
        """``{bucket: fencing epoch}`` of the buckets this server processes."""
        self._positions: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}
        self._failures_handled = 0
        self._commit_in_flight = False
        self._checkpoint: _Checkpoint | None = None

    # --- which partitions --------------------------------------------------------------

    def partitions(self, bucket: int) -> list[TopicPartition]:
        """The partitions a bucket's primary reads: its ``{ns}.ops`` partition, and for
        bucket 0 the control topic (client connections)."""
        partitions = [TopicPartition(self._topics.ops, bucket)]
        if bucket == 0:
            partitions.append(TopicPartition(self._topics.control, 0))
        return partitions

    def bucket_of(self, topic: str, partition: int) -> int:
        """The bucket a partition belongs to (the control topic goes with bucket 0)."""
        return partition if topic == self._topics.ops else 0

    def consumed(self, topic: str, partition: int, offset: int) -> bool:
        """Note that a message was read; False when its bucket is not this server's any
        more (a message still in the consumer's buffer), which must then be skipped."""
        if self.bucket_of(topic, partition) not in self.owned:
            return False
        self._positions[(topic, partition)] = offset + 1
        return True

    # --- the election ------------------------------------------------------------------

    def elect(self) -> list[int]:
        """Take part in the bucket election and act on what changed for this server.

        Returns:
            The buckets this server just became primary of (the caller reloads what other
            primaries persisted: clients and interest).

        Raises:
            TransportError: Redis is unavailable (the caller pauses every bucket).
        """
        result = self.election.tick()
        for bucket in result.lost:
            self.drop(bucket)
        gained = self._take(result.gained) if result.gained else []
        for bucket, receiver in result.to_hand_over.items():
            self.hand_over(bucket, receiver)
        return gained

    def drop_lost(self) -> None:
        """Stop processing, at once, the buckets whose lease the renewing thread lost."""
        for bucket in self.election.take_lost():
            self.drop(bucket)

    def read_again(self, messages: Iterable[Polled]) -> None:
        """Have the consumer deliver these messages (polled, not processed) again: the loop
        stopped its tick early to do its other work. Messages of buckets no longer held
        are left to the bucket's new primary.

        Raises:
            KafkaException: a seek failed (the caller rewinds to the committed offsets).
        """
        first: dict[tuple[str, int], int] = {}
        for message in messages:
            topic: str | None
            partition: int | None
            offset: int | None
            if isinstance(message, UnreadableRecords):
                topic, partition, offset = message.topic, message.partition, message.first_offset
            elif message.error():
                continue
            else:
                topic, partition, offset = message.topic(), message.partition(), message.offset()
            if topic is None or partition is None or offset is None:
                continue
            if self.bucket_of(topic, partition) in self.owned:
                where = (topic, partition)
                first[where] = min(offset, first.get(where, offset))
        for (topic, partition), offset in first.items():
            self._consumer.seek(TopicPartition(topic, partition, offset))

    def stop_every_bucket(self) -> None:
        """Drop and release every bucket (the election itself failed)."""
        for bucket in list(self.owned):
            self.drop(bucket)
            self.election.release(bucket)

    def _take(self, gained: dict[int, int]) -> list[int]:
        """Consume each gained bucket from its committed offset (the re-processing window
        is bounded by ``message_sync_interval_s``; re-applied EventIDs are recognised).
        The loop waits for Kafka's answer (up to ``_COMMITTED_TIMEOUT_S``: a group
        coordinator still loading answers within seconds), as leases are renewed on their
        own thread; while Kafka cannot say, the buckets are given back, to be taken again
        later."""
        wanted = [tp for bucket in gained for tp in self.partitions(bucket)]
        try:
            committed = committed_offsets(self._consumer, wanted, _COMMITTED_TIMEOUT_S)
            assignment = [
                TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)) for tp in committed
            ]
            assign_from(self._consumer, assignment, _COMMITTED_TIMEOUT_S, incremental=True)
        except KafkaException as exc:
            log.warning("cannot read the committed offsets, giving buckets back: %s", exc)
            for bucket in gained:
                self.election.release(bucket)
            return []
        self._stats.buckets_gained += len(gained)
        for tp in committed:
            if tp.offset >= 0:
                self._committed[(tp.topic, tp.partition)] = tp.offset
        self.owned.update(gained)
        return list(gained)

    def drop(self, bucket: int) -> None:
        """Stop processing a bucket at once (lease lost or fenced): nothing more of it is
        applied or committed here."""
        if bucket not in self.owned:
            return
        del self.owned[bucket]
        self._stats.buckets_lost += 1
        self._checkpoint = None
        partitions = self.partitions(bucket)
        self._forget_positions(partitions)
        self._consumer.incremental_unassign(partitions)
        log.warning("%s stopped processing bucket %d", self._member_id, bucket)

    def hand_over(self, bucket: int, receiver: str) -> None:
        """Pass a bucket to a less loaded server cleanly: stop consuming it, flush and commit
        what was processed, then release the lease with a handoff note."""
        partitions = self.partitions(bucket)
        self._consumer.incremental_unassign(partitions)
        self.sync(wait=True)
        del self.owned[bucket]
        self._forget_positions(partitions)
        self.election.hand_over(bucket, receiver)

    def fenced(self, bucket: int) -> None:
        """A write of this bucket was refused for a stale fencing epoch: another server
        took it over; stop and release it."""
        if bucket not in self.owned:
            return
        self._stats.buckets_fenced += 1
        log.warning(
            "%s was fenced out of bucket %d (another server took it over)",
            self._member_id,
            bucket,
        )
        self.drop(bucket)
        self.election.release(bucket)

    def still_primary(self, bucket: int) -> bool:
        """Check the bucket's fencing epoch before a write that no Lua script checks (the
        interest registry): a primary paused past its lease must not undo what its
        successor wrote. On a stale epoch the bucket is dropped and False returned.

        Raises:
            TransportError: Redis failed.
        """
        if bucket not in self.owned:
            return False
        if self._store.epoch(bucket) == self.owned[bucket]:
            return True
        self.fenced(bucket)
        return False

    def reconcile_with_leases(self) -> None:
        """After a Redis outage: give up buckets whose lease this server no longer holds
        (and leases of buckets it never started), so a lease that lapsed meanwhile is lost
        here rather than through a fenced write. The caller runs the election next."""
        held = self.election.owned
        for bucket, epoch in list(self.owned.items()):
            if held.get(bucket) != epoch:
                self.drop(bucket)
        for bucket in held:
            if bucket not in self.owned:
                self.election.release(bucket)

    # --- offsets -----------------------------------------------------------------------

    def rewind_to_committed(self) -> None:
        """Consume every bucket held here again from its committed offset.

        Raises:
            KafkaException: the committed offsets could not be read.
        """
        self._checkpoint = None
        partitions = [tp for bucket in self.owned for tp in self.partitions(bucket)]
        if not partitions:
            return
        assigned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        # A handoff that failed half way may have unassigned its partitions already.
        self._consumer.incremental_unassign(
            [tp for tp in partitions if (tp.topic, tp.partition) in assigned]
        )
        unknown = [tp for tp in partitions if (tp.topic, tp.partition) not in self._committed]
        committed = {
            (tp.topic, tp.partition): tp.offset
            for tp in (
                committed_offsets(self._consumer, unknown, _COMMITTED_TIMEOUT_S) if unknown else []
            )
        }
        assignment = []
        for tp in partitions:
            where = (tp.topic, tp.partition)
            self._positions.pop(where, None)
            offset = self._committed.get(where, committed.get(where, -1))
            assignment.append(TopicPartition(tp.topic, tp.partition, max(offset, 0)))
        self._consumer.incremental_assign(assignment)

    def restart_from_the_start(self, topics: Iterable[str]) -> None:
        """Read the partitions held here of topics that were recreated from their start
        (what was committed on the lost topic means nothing on the new one)."""
        renewed = set(topics)
        self._checkpoint = None
        held = [
            tp for bucket in self.owned for tp in self.partitions(bucket) if tp.topic in renewed
        ]
        if not held:
            return
        assigned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        self._consumer.incremental_unassign(
            [tp for tp in held if (tp.topic, tp.partition) in assigned]
        )
        self._forget_positions(held)
        # The consumer's metadata still names the old topic: asked again before the fetch.
        assign_from(
            self._consumer,
            [TopicPartition(tp.topic, tp.partition, 0) for tp in held],
            _COMMITTED_TIMEOUT_S,
            incremental=True,
        )

    def sync(self, *, wait: bool = False) -> None:
        """Note the positions processed so far, to be committed once everything produced
        until now is delivered (:meth:`commit_settled`), and prune the stored apply
        results below the commit.

        Args:
            wait: Flush for up to 30 s and commit synchronously (stop, handoff); otherwise
                the positions are committed, asynchronously, by this or a later call of
                :meth:`commit_settled` once the outbox has settled them, so neither a slow
                broker nor a produce round trip stops the loop.
        """
        if wait:
            self._checkpoint = None
            remaining = self._outbox.flush(_FINAL_FLUSH_S)
            if self._rewound_after_failures() or remaining:
                if remaining:
                    log.debug("not committing yet: %d messages undelivered", remaining)
                return
            self._commit(dict(self._positions), wait=True)
            return
        if self._checkpoint is None:
            self._checkpoint = _Checkpoint(
                self._outbox.mark(), dict(self._positions), dict(self.owned)
            )
        self.commit_settled()

    def commit_settled(self) -> None:
        """Commit the positions :meth:`sync` noted once every message produced before them
        is delivered (cheap when not: the loop calls it at every turn); go back to the
        committed offsets instead when a delivery failed."""
        checkpoint = self._checkpoint
        if checkpoint is None or self._commit_in_flight:
            return
        if self._rewound_after_failures():
            return
        if not self._outbox.settled(checkpoint.mark):
            return
        self._checkpoint = None
        # Only buckets still held under the same epoch: another primary may have committed
        # further since.
        positions = {
            where: position
            for where, position in checkpoint.positions.items()
            if self.owned.get(self.bucket_of(*where))
            == checkpoint.epochs.get(self.bucket_of(*where))
        }
        self._commit(positions, wait=False)

    def _rewound_after_failures(self) -> bool:
        """When a delivery failed since the last look, go back to the committed offsets
        (the operations are processed again) and say so."""
        failures = self._outbox.delivery_failures
        if failures == self._failures_handled:
            return False
        log.warning(
            "%d messages were not delivered: processing again from the committed offsets",
            failures - self._failures_handled,
        )
        try:
            self.rewind_to_committed()
        except KafkaException as exc:
            log.warning("rewinding to the committed offsets failed (will retry): %s", exc)
            return True
        self._failures_handled = failures
        return True

    def _commit(self, positions: dict[tuple[str, int], int], *, wait: bool) -> None:
        offsets = [
            TopicPartition(topic, partition, position)
            for (topic, partition), position in positions.items()
            if self._committed.get((topic, partition)) != position
        ]
        if not offsets or (self._commit_in_flight and not wait):
            return
        try:
            if not wait:
                self._commit_in_flight = True
                self._consumer.commit(offsets=offsets, asynchronous=True)
                return
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            self._commit_in_flight = False
            log.warning("offset commit failed (will retry): %s", exc)
            return
        self._record_committed(offsets)

    def on_commit(self, error: KafkaError | None, offsets: list[TopicPartition]) -> None:
        """librdkafka's answer to an asynchronous commit (served by the consumer's poll)."""
        self._commit_in_flight = False
        if error is not None:
            log.warning("offset commit failed (will retry): %s", error)
            return
        self._record_committed([tp for tp in offsets if tp.error is None])

    def _record_committed(self, offsets: list[TopicPartition]) -> None:
        """Note committed offsets of buckets still held, and prune the stored results of
        operations below them (no failover can process those again)."""
        held = [tp for tp in offsets if self.bucket_of(tp.topic, tp.partition) in self.owned]
        for tp in held:
            self._committed[(tp.topic, tp.partition)] = tp.offset
        self._store.prune_results(
            {tp.partition: tp.offset for tp in held if tp.topic == self._topics.ops}
        )

    def _forget_positions(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self._positions.pop((tp.topic, tp.partition), None)
            self._committed.pop((tp.topic, tp.partition), None)


__all__ = ["BucketOwnership"]
