"""The latency histograms of a cache server: where an operation's time goes on the server.

Kept only while the server's metrics endpoint is configured (``metrics_port`` set): the
loop then pays one histogram observe per batch applied and one per change queued to
subscribers, and nothing when it is not.

- ``regionbus_operation_batch_apply_seconds``: one apply of a batch of entry operations
  (:meth:`regionbus.broker.entry_ops.EntryOperations.apply`): the Redis round trip of its
  Lua scripts, then the server listeners, routing and replies of its changes. Once per
  batch (a region with server writers applies its changes one at a time, each a batch).
- ``regionbus_put_to_queued_seconds``: per entry change queued to at least one client's
  subscription queue, from the Kafka timestamp of the operation's record (set by the
  writer's producer, or the gateway receiver's for a change from another site) to the
  hand-over of the batch's queue records to the server's producer (for a queue held full,
  the moment they were parked instead).
- ``regionbus_durable_marker_seconds``: per marker, from the Kafka timestamp of a durable
  client's ready-for-events record to the hand-over of the marker for its queue. The
  client's replay ends at the last bucket's marker, so this is the servers' share of a
  replay: the replay itself is read by the client, which times it whole
  (``regionbus_client_replay_seconds``).

The last two compare this server's wall clock with a stamp of another process (the
writer's producer): they are only as right as the hosts' clocks agree (NTP), and a negative
difference counts as 0. The apply is timed on the monotonic clock.
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE
from confluent_kafka import Message as KafkaMessage

from regionbus.runtime.leases import wall_clock_ms
from regionbus.runtime.observability import MetricsEndpoint


class ServerLatency:
    """The histograms, and the stamps of the batch in hand waiting for its send.

    Args:
        endpoint: The server's metrics endpoint (its registry holds the histograms).
        labels: ``{"namespace": ..., "member": ...}`` of the server.
    """

    def __init__(self, endpoint: MetricsEndpoint, labels: Mapping[str, str]) -> None:
        self.apply = endpoint.histogram(
            "operation_batch_apply_seconds",
            "Time to apply one batch of entry operations: the Redis round trip, then the "
            "listeners, routing and replies of its changes.",
            labels,
        )
        self._queued = endpoint.histogram(
            "put_to_queued_seconds",
            "Per change queued to subscribers: from its operation record's Kafka timestamp "
            "to the hand-over of its subscription-queue records to the producer.",
            labels,
        )
        self._marker = endpoint.histogram(
            "durable_marker_seconds",
            "Per durable-replay marker: from the client's ready-for-events record's Kafka "
            "timestamp to the hand-over of the marker for its queue.",
            labels,
        )
        self.record_ms = 0
        """Kafka timestamp (ms since the Unix epoch) of the record being processed; 0 when
        it has none."""
        self.queued_from_ms: list[int] = []
        """Record timestamps of the changes queued to subscribers since the last send."""
        self.markers_from_ms: list[int] = []
        """Record timestamps of the markers queued since the last send."""

    def reading(self, message: KafkaMessage) -> None:
        """Note the Kafka timestamp of the record whose items are processed next."""
        kind, stamp_ms = message.timestamp()
        self.record_ms = 0 if kind == TIMESTAMP_NOT_AVAILABLE else stamp_ms

    def sent(self) -> None:
        """The batch's records were handed to the producer: observe what waited for it."""
        if not (self.queued_from_ms or self.markers_from_ms):
            return
        now_ms = wall_clock_ms()
        for histogram, stamps in (
            (self._queued, self.queued_from_ms),
            (self._marker, self.markers_from_ms),
        ):
            for stamp_ms in stamps:
                histogram.observe(max(0, now_ms - stamp_ms) / 1000)
            stamps.clear()


__all__ = ["ServerLatency"]
