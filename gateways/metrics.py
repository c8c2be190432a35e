"""The Prometheus metrics of the gateway workers, read from their stats at scrape time.

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
- ``regionbus_gateway_sender_primary`` (gauge): 1 while this worker is the primary.

Gateway receiver (``{ns}.gwr.<receiver>``):

- ``regionbus_gateway_receiver_batches_acked_total``: batches applied and acked.
- ``regionbus_gateway_receiver_possible_duplicate_batches_total``: batches received
  flagged possible duplicate (resends).
- ``regionbus_gateway_receiver_events_applied_total``, ``..._duplicate_events_total``
  (already applied, by EventID), ``..._conflicts_refused_total`` (older than the entry),
  ``..._conflicts_disallowed_total`` (by the resolver), ``..._events_failed_total``,
  ``..._loops_dropped_total``, ``..._dead_letters_total``, ``..._acks_not_sent_total``.

Async event queue (``{ns}.aeq.<queue>``):

- ``regionbus_async_event_queue_batches_dispatched_total``: batches the listener accepted.
- ``regionbus_async_event_queue_events_dispatched_total``: events in them.
- ``regionbus_async_event_queue_retries_total``: deliveries repeated (flagged possible
  duplicate) after the listener returned False or raised.
- ``regionbus_async_event_queue_backlog_events`` (gauge): queued events not yet accepted
  (only while primary).
- ``regionbus_async_event_queue_primary``, ``regionbus_async_event_queue_paused`` (gauges).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.observability import Metric, MetricFamilies

if TYPE_CHECKING:
    from gateways.async_event_queue import AsyncEventQueue
    from gateways.receiver import GatewayReceiver
    from gateways.sender import GatewaySender


def sender_metric_families(sender: GatewaySender) -> list[Metric]:
    """The metric families of one scrape of a gateway sender (see the module's list).

    Args:
        sender: The sender; only read.
    """
    s = sender.settings
    stats = sender.stats
    families = MetricFamilies(
        {"namespace": s.namespace, "member": s.member_id, "sender": s.sender_id}
    )
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
            prefix + "primary", "1 while this worker is the primary sender.", sender.is_primary
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


def receiver_metric_families(receiver: GatewayReceiver) -> list[Metric]:
    """The metric families of one scrape of a gateway receiver (see the module's list).

    Args:
        receiver: The receiver; only read.
    """
    s = receiver.settings
    stats = receiver.stats
    families = MetricFamilies(
        {"namespace": s.namespace, "member": s.member_id, "receiver": s.receiver_id}
    )
    prefix = "gateway_receiver_"
    return [
        families.counter(
            prefix + "batches_acked",
            "Batches applied to this site and acked (resent copies included).",
            stats.batches_acked,
        ),
        families.counter(
            prefix + "possible_duplicate_batches",
            "Batches received flagged possible duplicate (resends).",
            stats.possible_duplicate_batches,
        ),
        families.counter(
            prefix + "events_applied", "Events applied to this site.", stats.events_applied
        ),
        families.counter(
            prefix + "duplicate_events",
            "Events this site had already applied (recognised by EventID).",
            stats.duplicates,
        ),
        families.counter(
            prefix + "conflicts_refused",
            "Events refused as older than the entry's last change (timestamp, site id).",
            stats.conflicts_refused,
        ),
        families.counter(
            prefix + "conflicts_disallowed",
            "Events a GatewayConflictResolver disallowed.",
            stats.conflicts_disallowed,
        ),
        families.counter(
            prefix + "events_failed", "Events reported failed in an ack.", stats.events_failed
        ),
        families.counter(
            prefix + "loops_dropped",
            "Events that had already reached this site (loop prevention).",
            stats.loops_dropped,
        ),
        families.counter(
            prefix + "dead_letters",
            "Undecodable batches sent to the dead-letter topic.",
            stats.dead_letters,
        ),
        families.counter(
            prefix + "acks_not_sent",
            "Batches applied whose ack could not be written (not this site's ack topic, "
            "or no such topic).",
            stats.acks_not_sent,
        ),
    ]


def async_event_queue_metric_families(queue: AsyncEventQueue) -> list[Metric]:
    """The metric families of one scrape of an async event queue dispatcher (see the
    module's list).

    Args:
        queue: The dispatcher; only read.
    """
    s = queue.settings
    stats = queue.stats
    families = MetricFamilies(
        {"namespace": s.namespace, "member": s.member_id, "queue": s.queue_id}
    )
    prefix = "async_event_queue_"
    metrics: list[Metric] = [
        families.counter(
            prefix + "batches_dispatched",
            "Batches the AsyncEventListener accepted (returned True).",
            stats.batches_dispatched,
        ),
        families.counter(
            prefix + "events_dispatched",
            "Events in accepted batches.",
            stats.events_dispatched,
        ),
        families.counter(
            prefix + "retries",
            "Batches delivered again, flagged possible duplicate, after the listener "
            "returned False or raised.",
            stats.batches_redispatched,
        ),
        families.gauge(
            prefix + "primary", "1 while this worker is the queue's dispatcher.", queue.is_primary
        ),
        families.gauge(
            prefix + "paused", "1 while dispatching is paused.", queue.is_dispatching_paused
        ),
    ]
    backlog = stats.backlog_events
    if backlog is not None:
        metrics.append(
            families.gauge(
                prefix + "backlog_events",
                "Queued events the listener has not accepted yet (primary only).",
                backlog,
            )
        )
    return metrics


__all__ = [
    "async_event_queue_metric_families",
    "receiver_metric_families",
    "sender_metric_families",
]
