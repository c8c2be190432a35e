"""The Prometheus metrics of a cache server, read from its counters at scrape time.

Every sample carries ``namespace`` and ``member``. Counters come from
:class:`regionbus.broker.stats.ServerStats` (the one place they are counted); gauges from the
server's live state.

Counters (``_total``) and gauges, with their labels besides those two:

- ``regionbus_operations_applied_total{region, kind}``: changes applied to Redis
  (duplicates not counted); kind ``put``, ``destroy``, ``invalidate``, ``clear``,
  ``destroy_region``.
- ``regionbus_duplicate_operations_total``: operations recognised as applied by EventID.
- ``regionbus_operation_errors_total``: operations refused with an error reply.
- ``regionbus_replies_total``: replies produced.
- ``regionbus_replies_dropped_total``: replies to a client whose principal's shared reply
  topic does not exist, dropped.
- ``regionbus_events_routed_total``: events queued to clients' subscription queues (one
  per client an event goes to). With ``metrics_client_labels``, one series per client
  instead (``{client}``; the series goes when the server forgets the client).
- ``regionbus_dead_letters_total{category}``: messages sent to ``{ns}.dead-letter``;
  category ``undecodable``, ``unexpected_type``, ``invalid_operation``, ``refused``,
  ``processing_failed``, ``unreadable`` or ``refused_by_recipient_topic`` (a client's
  topic refused a record for it: its clients miss those events).
- ``regionbus_bucket_primaries_gained_total``, ``..._lost_total`` (fenced included),
  ``..._fenced_total``: bucket takeovers and losses (failovers, handoffs).
- ``regionbus_bucket_primaries``, ``regionbus_bucket_secondaries`` (gauges): buckets this
  server is primary / secondary of.
- ``regionbus_buckets_without_primary`` (gauge): buckets of the namespace no server was
  primary of at this server's last election tick (every server tells the same, give or
  take a tick): above 0 for longer than a failover takes, operations on them wait.
- ``regionbus_subscription_backlog_events`` (gauge): events this server queued for its
  clients that they have not acked, summed over them (acks re-read a few clients per sync
  while served); ``regionbus_subscription_queues`` (gauge): the clients it counts.
- ``regionbus_subscription_queue_depth_top_events{client}`` (gauge): the same per client,
  for the ``metrics_top_clients`` deepest queues with events not acked (default 10), so the
  series stay few however large the fleet.
- ``regionbus_subscription_queue_depth_events{client}`` (gauge): every client's, only with
  ``metrics_client_labels`` (a series per client).
- ``regionbus_subscription_queue_capacity_events`` (gauge): ``maximum_message_count``, the
  depth at which a client's queue holds its writers (so an alert can divide by it).
- ``regionbus_durable_clients{state}`` (gauge): durable clients ``connected``, ``away`` or
  ``unregistering``; only bucket 0's primary (which handles client lifecycle) exports it,
  so a namespace has one series per state.
- ``regionbus_durable_clients_expired_total``: durable clients unregistered as reaper.
- ``regionbus_queue_full_waits_total``: holds of operations for a full queue.
- ``regionbus_clients_disconnected_total``: clients disconnected as unresponsive.
- ``regionbus_entries_expired_total``: entries this server expired as a bucket primary.
- ``regionbus_redis_outages_total``: Redis outages this server waited out (it stops
  applying, then resumes from the first unapplied operation; :mod:`regionbus.runtime.redis_outage`).
- ``regionbus_kafka_outages_total``: Kafka outages (no broker reachable) this server
  waited out (:mod:`regionbus.schemas.kafka_outage`).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Protocol

from regionbus.broker.client_registry import ClientRegistry
from regionbus.broker.config import ServerSettings
from regionbus.broker.stats import ServerStats
from regionbus.runtime.observability import Metric, MetricFamilies
from regionbus.schemas.errors import RegionBusError

log = logging.getLogger("regionbus.server")


class ServerView(Protocol):
    """What the metrics read of a cache server (:class:`regionbus.broker.server.CacheServer`)."""

    settings: ServerSettings
    stats: ServerStats
    clients: ClientRegistry

    @property
    def primary_buckets(self) -> tuple[int, ...]: ...

    @property
    def secondary_buckets(self) -> tuple[int, ...]: ...

    @property
    def buckets_without_primary(self) -> int: ...

    @property
    def handles_client_lifecycle(self) -> bool: ...

    @property
    def redis_outages(self) -> int: ...

    @property
    def kafka_outages(self) -> int: ...

    def queue_depths_events(self) -> dict[str, int]: ...

    def events_routed_by_client(self) -> dict[str, int]: ...


def server_metric_families(server: ServerView) -> list[Metric]:
    """The metric families of one scrape of a cache server (see the module's table).

    Args:
        server: The server; only read.

    Returns:
        The families, every sample labelled with ``namespace`` and ``member``.
    """
    stats = server.stats
    families = MetricFamilies(
        {"namespace": server.settings.namespace, "member": server.settings.member_id}
    )
    applied: dict[tuple[str, ...], int] = {
        (region, kind): count
        for region, by_kind in list(stats.operations_applied_by_region.items())
        for kind, count in list(by_kind.items())
    }
    metrics: list[Metric] = [
        families.counter(
            "operations_applied",
            "Changes applied to Redis by this server (duplicates not counted).",
            applied,
            ("region", "kind"),
        ),
        families.counter(
            "duplicate_operations",
            "Operations recognised as already applied by their EventID.",
            stats.duplicates,
        ),
        families.counter(
            "operation_errors", "Operations refused with an error reply.", stats.errors
        ),
        families.counter("replies", "Replies produced to clients.", stats.replies),
        families.counter(
            "replies_dropped",
            "Replies not produced: the client's shared reply topic does not exist.",
            stats.replies_dropped,
        ),
        *_client_families(server, families),
        families.counter(
            "dead_letters",
            "Messages sent to the dead-letter topic, by reason category.",
            {(c,): n for c, n in list(stats.dead_letters_by_category.items())},
            ("category",),
        ),
        families.counter(
            "bucket_primaries_gained",
            "Buckets this server became primary of (start, failover, handoff).",
            stats.buckets_gained,
        ),
        families.counter(
            "bucket_primaries_lost",
            "Buckets whose lease this server lost (fenced ones included).",
            stats.buckets_lost,
        ),
        families.counter(
            "bucket_primaries_fenced",
            "Buckets this server lost because another server had taken them over.",
            stats.buckets_fenced,
        ),
        families.gauge(
            "bucket_primaries",
            "Buckets this server is primary of.",
            len(server.primary_buckets),
        ),
        families.gauge(
            "bucket_secondaries",
            "Buckets this server is a secondary of (last election tick).",
            len(server.secondary_buckets),
        ),
        families.gauge(
            "buckets_without_primary",
            "Buckets of the namespace without a primary at the last election tick.",
            server.buckets_without_primary,
        ),
        families.counter(
            "durable_clients_expired",
            "Durable clients this server unregistered as reaper (away past their timeout).",
            stats.durable_clients_expired,
        ),
        families.counter(
            "queue_full_waits",
            "Times operations were held because a subscription queue was full.",
            stats.queue_full_waits,
        ),
        families.counter(
            "clients_disconnected",
            "Clients disconnected as unresponsive (queue full for the whole wait).",
            stats.clients_disconnected,
        ),
        families.counter(
            "entries_expired",
            "Entries this server expired as a bucket primary (time-to-live or idle timeout).",
            stats.entries_expired,
        ),
        families.counter(
            "redis_outages",
            "Redis outages this server waited out before applying again.",
            server.redis_outages,
        ),
        families.counter(
            "kafka_outages",
            "Kafka outages (no broker reachable) this server waited out.",
            server.kafka_outages,
        ),
    ]
    if server.handles_client_lifecycle:
        try:
            records = server.clients.all()
        except RegionBusError as exc:
            log.warning("metrics: cannot read the client registry: %s", exc)
        else:
            states: Counter[str] = Counter({"connected": 0, "away": 0, "unregistering": 0})
            for record in records.values():
                if record.durable:
                    state = (
                        "unregistering"
                        if record.reaping
                        else "connected"
                        if record.connected
                        else "away"
                    )
                    states[state] += 1
            metrics.append(
                families.gauge(
                    "durable_clients",
                    "Durable clients of the namespace by state (from bucket 0's primary).",
                    {(s,): n for s, n in states.items()},
                    ("state",),
                )
            )
    return metrics


def _client_families(server: ServerView, families: MetricFamilies) -> list[Metric]:
    """Routing and queue depth: totals and the deepest queues, or a series per client
    when ``metrics_client_labels`` asks for them."""
    settings = server.settings
    depths = server.queue_depths_events()
    routed_help = "Events queued to clients' subscription queues (one per client reached)."
    depth_help = "Events this server queued for a client that the client has not acked yet."
    metrics: list[Metric] = [
        families.gauge(
            "subscription_backlog_events",
            "Events this server queued for its clients that they have not acked, summed.",
            sum(depths.values()),
        ),
        families.gauge(
            "subscription_queues", "Clients whose queue depth this server counts.", len(depths)
        ),
        families.gauge(
            "subscription_queue_capacity_events",
            "A client queue's capacity (maximum_message_count): its writers are held there.",
            settings.maximum_message_count,
        ),
    ]
    top = sorted(((n, c) for c, n in depths.items() if n > 0), reverse=True)
    metrics.append(
        families.gauge(
            "subscription_queue_depth_top_events",
            f"{depth_help} The {settings.metrics_top_clients} deepest queues only.",
            {(c,): n for n, c in top[: settings.metrics_top_clients]},
            ("client",),
        )
    )
    if not settings.metrics_client_labels:
        metrics.append(families.counter("events_routed", routed_help, server.stats.events_routed))
        return metrics
    routed = server.events_routed_by_client()
    metrics.append(
        families.counter(
            "events_routed", routed_help, {(c,): n for c, n in routed.items()}, ("client",)
        )
    )
    metrics.append(
        families.gauge(
            "subscription_queue_depth_events",
            depth_help,
            {(c,): n for c, n in depths.items()},
            ("client",),
        )
    )
    return metrics


__all__ = ["server_metric_families"]
