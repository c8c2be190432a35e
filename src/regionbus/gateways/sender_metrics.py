"""The metric families of a gateway sender (a scrape of ``GatewaySender``'s endpoint)."""

from __future__ import annotations

from regionbus.gateways.processor import ProcessorStats
from regionbus.runtime.observability import Metric, MetricFamilies


def sender_metric_families(
    labels: dict[str, str], stats: ProcessorStats, is_primary: bool
) -> list[Metric]:
    """The metric families of one scrape of a gateway sender, read from its stats.

    Every sample carries ``namespace`` and ``member`` (the worker's), and the worker's id:
    ``sender``, ``receiver`` or ``queue``. Counters end in ``_total``.

    Gateway sender (``{ns}.gw.<sender>``):

    - ``regionbus_gateway_sender_batches_sent_total``: batches the remote Kafka took (first
      sends and resends).
    - ``regionbus_gateway_sender_batches_acked_total``: batches the remote receiver acked
      (then removed from the queue).
    - ``regionbus_gateway_sender_batches_resent_total``: batches sent again, flagged possible
      duplicate, after no ack within ``ack_timeout_ms``.
    - ``regionbus_gateway_sender_events_acked_total``, ``..._events_failed_total`` (listed in
      an ack as failed), ``..._events_filtered_total`` (``before_transmit`` said no).
    - ``regionbus_gateway_sender_unreachable_retries_total``: waits of ``retry_interval_ms``
      because the remote Kafka could not be reached.
    - ``regionbus_gateway_sender_backlog_events`` (gauge): queued events not yet acked
      (only while primary).
    - ``regionbus_gateway_sender_batches_in_flight`` (gauge): batches sent and not acked
      yet (at most ``max_batches_in_flight``).
    - ``regionbus_gateway_sender_primary`` (gauge): 1 while this worker is the primary.
    - ``regionbus_gateway_sender_batch_round_trip_seconds`` (histogram, kept by the sender
      itself while its endpoint is configured): from a batch's last send to the receiver's
      ack of it, read by the ack thread.

    Args:
        labels: ``{"namespace": ..., "member": ..., "sender": ...}`` of the worker.
        stats: Its counters; only read.
        is_primary: Whether it is the primary sender now.
    """
    families = MetricFamilies(labels)
    prefix = "gateway_sender_"
    metrics: list[Metric] = [
        families.counter(
            prefix + "batches_sent",
            "Batches the remote site's Kafka took (first sends and resends).",
            stats.batches_sent,
        ),
        families.counter(
            prefix + "batches_acked",
            "Batches the remote receiver acked (then removed from the queue).",
            stats.batches_dispatched,
        ),
        families.counter(
            prefix + "batches_resent",
            "Batches sent again, flagged possible duplicate, after no ack in time.",
            stats.batches_redispatched,
        ),
        families.counter(
            prefix + "events_acked", "Events in acked batches.", stats.events_dispatched
        ),
        families.counter(
            prefix + "events_failed",
            "Events the remote site listed as failed in an ack (logged, dropped).",
            stats.events_failed,
        ),
        families.counter(
            prefix + "events_filtered",
            "Events a before_transmit filter left out.",
            stats.events_filtered,
        ),
        families.counter(
            prefix + "unreachable_retries",
            "Waits because the remote site's Kafka could not be reached.",
            stats.unreachable_retries,
        ),
        families.gauge(
            prefix + "batches_in_flight",
            "Batches sent to the remote site and not acked yet.",
            stats.batches_in_flight,
        ),
        families.gauge(
            prefix + "primary", "1 while this worker is the primary sender.", is_primary
        ),
    ]
    backlog = stats.backlog_events
    if backlog is not None:
        metrics.append(
            families.gauge(
                prefix + "backlog_events",
                "Queued events not yet acked by the remote site (primary only).",
                backlog,
            )
        )
    return metrics


__all__ = ["sender_metric_families"]
