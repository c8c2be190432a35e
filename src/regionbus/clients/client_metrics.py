"""A client cache's own Prometheus endpoint, when ``ClientSettings.metrics_port`` is set.

Every sample carries ``namespace`` and ``client`` (the client id). Counters (``_total``)
read from the subscription queue's counters at scrape time
(:class:`regionbus.clients.queue_records.SubscriptionStats`):

- ``regionbus_client_events_received_total``: events read from the queue (duplicates
  included); ``..._events_delivered_total`` handed to regions; ``..._duplicates_dropped_total``
  (message tracking); ``..._events_replayed_total`` (durable replay, before their bucket's
  marker); ``..._events_conflated_total``; ``..._markers_total``;
  ``..._messages_undecodable_total``; ``..._messages_forged_total`` (unsigned or forged,
  security on); ``..._cq_events_delivered_total``.
- ``regionbus_client_replaying`` (gauge): 1 while a durable client's queue is before its
  markers.

Histograms, in seconds, observed on the queue's thread only while the endpoint is
configured:

- ``regionbus_client_put_to_listener_seconds``: per live event handed to a region, from the
  event's timestamp (the writer's clock when it made the change; the origin site's for a
  change from another site) to the call of the region's listeners. It compares two hosts'
  wall clocks: only as right as they agree (NTP); a negative difference counts as 0.
  Replayed events are not in it (they waited on purpose while the client was away).
- ``regionbus_client_replay_seconds``: per durable reconnection, from
  ``ready_for_events`` to the last bucket's marker read (monotonic clock).

``/healthz``: live unless the queue's reader has not turned within ``liveness_timeout_s``
(a listener that never returns). ``/readyz``: the queue is read and live (a durable client
past its replay), and Kafka is reachable.
"""

from __future__ import annotations

from typing import Protocol

from regionbus.clients.queue_records import SubscriptionStats
from regionbus.clients.settings import ClientSettings
from regionbus.clients.subscription import SubscriptionQueue
from regionbus.schemas.health import OK, Probe
from regionbus.schemas.kafka_outage import KafkaOutage
from regionbus.schemas.metrics_endpoint import (
    REPLAY_BUCKETS_S,
    Metric,
    MetricFamilies,
    MetricsEndpoint,
)


class _Cache(Protocol):
    """What the metrics read of a client cache (:class:`regionbus.clients.ClientCache`)."""

    client_id: str
    subscription: SubscriptionQueue | None

    @property
    def closed(self) -> bool: ...


class ClientMetrics:
    """The endpoint of one client cache, its histograms and its probes.

    Args:
        cache: The client cache; only read.
        settings: Its settings (``metrics_port``, ``metrics_host``, ``namespace``).
        kafka_outage: Its Kafka outage tracker (readiness).
    """

    def __init__(self, cache: _Cache, settings: ClientSettings, kafka_outage: KafkaOutage) -> None:
        self._cache = cache
        self._kafka_outage = kafka_outage
        labels = {"namespace": settings.namespace, "client": cache.client_id}
        self._families = MetricFamilies(labels)
        self.endpoint = MetricsEndpoint(
            settings.metrics_port, self._collect, address=settings.metrics_host, health=self
        )
        self.put_to_listener = self.endpoint.histogram(
            "client_put_to_listener_seconds",
            "Per live event: from its timestamp (the writer's change) to its region's "
            "listener call.",
            labels,
        )
        self.replay = self.endpoint.histogram(
            "client_replay_seconds",
            "Per durable reconnection: from ready_for_events to the last marker read.",
            labels,
            REPLAY_BUCKETS_S,
        )

    def _collect(self) -> list[Metric]:
        subscription = self._cache.subscription
        stats = subscription.stats if subscription is not None else SubscriptionStats()
        counter = self._families.counter
        prefix = "client_"
        return [
            counter(
                prefix + "events_received", "Events read from the queue.", stats.events_received
            ),
            counter(
                prefix + "events_delivered", "Events handed to regions.", stats.events_delivered
            ),
            counter(
                prefix + "duplicates_dropped",
                "Events dropped as already seen (message tracking).",
                stats.duplicates_dropped,
            ),
            counter(
                prefix + "events_replayed",
                "Events delivered as durable replay (before their bucket's marker).",
                stats.replayed,
            ),
            counter(
                prefix + "events_conflated",
                "Updates not delivered: a newer one of the key came with them.",
                stats.conflated,
            ),
            counter(prefix + "markers", "Durable-replay markers read.", stats.markers),
            counter(
                prefix + "messages_undecodable",
                "Queue messages that could not be decoded (skipped).",
                stats.undecodable,
            ),
            counter(
                prefix + "messages_forged",
                "Queue messages dropped: not signed by a cache server (security on).",
                stats.forged,
            ),
            counter(
                prefix + "cq_events_delivered",
                "CQ events handed to continuous queries.",
                stats.cq_events_delivered,
            ),
            self._families.gauge(
                prefix + "replaying",
                "1 while a durable client's queue is before its markers.",
                int(subscription is not None and subscription.replaying),
            ),
        ]

    def liveness(self) -> Probe:
        """``/healthz``: the queue's reader turned within ``liveness_timeout_s`` (or does
        not run yet: a durable client before ``ready_for_events``, or no queue)."""
        subscription = self._cache.subscription
        if subscription is None or not subscription.started:
            return OK
        return subscription.loop.liveness()

    def readiness(self) -> Probe:
        """``/readyz``: open, Kafka reachable, the queue read and past its replay."""
        if self._cache.closed:
            return Probe(False, "closed")
        live = self.liveness()
        if not live.ok:
            return live
        if self._kafka_outage.ongoing:
            return Probe(False, "waiting: Kafka unreachable")
        subscription = self._cache.subscription
        if subscription is not None and not subscription.started:
            return Probe(False, "queue not read yet (ready_for_events not called)")
        if subscription is not None and subscription.replaying:
            return Probe(False, "replaying the durable queue")
        return OK


__all__ = ["ClientMetrics"]
