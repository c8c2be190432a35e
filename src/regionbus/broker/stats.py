"""The counters of one cache server, read by its metrics at scrape time."""

from __future__ import annotations

from dataclasses import dataclass, field

from regionbus.schemas.messages import OperationKind


@dataclass
class ServerStats:
    """Counters of one server since it started; its Prometheus metrics are read from here
    at scrape time (:mod:`regionbus.broker.server_metrics`), so the two never disagree.

    Attributes:
        operations_applied: Changes applied to Redis (not counting duplicates).
        duplicates: Operations recognised as already applied by EventID.
        events_routed: Events produced into subscription queues.
        replies: Replies produced.
        replies_dropped: Replies not produced because the client has no reply topic.
        dead_letters: Messages sent to the dead-letter topic.
        errors: Operations refused with an error reply.
        durable_clients_expired: Durable clients unregistered by this server as the reaper.
        buckets_gained: Buckets this server became primary of (start, failover, handoff).
        buckets_lost: Buckets whose lease this server lost or was fenced out of.
        queue_full_waits: Times operations were held because a client's queue was full.
        clients_disconnected: Clients disconnected as unresponsive (queue full too long).
        entries_expired: Entries this server expired as a bucket primary (entry
            time-to-live or idle timeout, :mod:`regionbus.broker.expiration`).
        buckets_fenced: Of ``buckets_lost``, those another server had taken over (a write
            refused for a stale fencing epoch).
        operations_applied_by_region: ``{region: {kind: count}}`` of
            ``operations_applied``, kind the lower-case ``OperationKind`` (``put``,
            ``destroy``, ``invalidate``, ``clear``, ``destroy_region``).
        events_unaddressed: Events not queued because the client's shared queue topic
            did not exist (its principal's topics were never made, or were deleted).
        dead_letters_by_category: ``{category: count}`` of ``dead_letters``: ``undecodable``,
            ``unexpected_type``, ``invalid_operation``, ``refused`` (security),
            ``processing_failed`` (its handling raised an unexpected error) or
            ``unreadable`` (a record batch Kafka's client could not fetch or decompress).
    """

    operations_applied: int = 0
    duplicates: int = 0
    events_routed: int = 0
    replies: int = 0
    replies_dropped: int = 0
    dead_letters: int = 0
    errors: int = 0
    durable_clients_expired: int = 0
    buckets_gained: int = 0
    buckets_lost: int = 0
    queue_full_waits: int = 0
    clients_disconnected: int = 0
    buckets_fenced: int = 0
    entries_expired: int = 0
    operations_applied_by_region: dict[str, dict[str, int]] = field(default_factory=dict)
    events_unaddressed: int = 0
    dead_letters_by_category: dict[str, int] = field(default_factory=dict)

    def applied(self, region: str, kind: OperationKind) -> None:
        """Count one change applied to Redis (a duplicate is not one)."""
        self.operations_applied += 1
        by_kind = self.operations_applied_by_region.setdefault(region, {})
        name = kind.value.lower()
        by_kind[name] = by_kind.get(name, 0) + 1

    def dead_lettered(self, category: str) -> None:
        """Count one message sent to the dead-letter topic, by reason category."""
        self.dead_letters += 1
        self.dead_letters_by_category[category] = self.dead_letters_by_category.get(category, 0) + 1


__all__ = ["ServerStats"]
