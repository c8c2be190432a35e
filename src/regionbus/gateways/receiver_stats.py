"""The gateway receiver's counters and their metric families (a scrape of
``GatewayReceiver``'s endpoint)."""

from __future__ import annotations

from dataclasses import dataclass

from regionbus.runtime.observability import Metric, MetricFamilies


@dataclass
class ReceiverStats:
    """Counters of one receiver since it started.

    Attributes:
        batches_acked: Batches applied and acked (resent copies included).
        events_applied: Events applied now.
        duplicates: Events the servers recognised as already applied (by EventID).
        conflicts_refused: Events refused by the timestamp / site-id rule at apply.
        conflicts_disallowed: Events a conflict resolver disallowed.
        events_failed: Events reported failed in an ack.
        loops_dropped: Events that had already reached this site (not applied again).
        possible_duplicate_batches: Batches received flagged possible duplicate.
        dead_letters: Undecodable batches sent to the dead-letter topic.
        acks_not_sent: Batches applied whose ack could not be written (its ack topic is
            not this site's, or does not exist).
        batches_kept_for_region: Tries of a batch kept unacked because a region it names
            is not defined here (``keep_batch_until_region_exists``).
        batches_out_of_sequence: Batches not applied because the one before them in their
            sender's run was neither applied here nor acked (lost on the way; the sender
            resends both), :mod:`regionbus.gateways.batch_sequence`.
        batch_sizes: Sizes of the batches acked, in order (the last 10,000).
    """

    batches_acked: int = 0
    events_applied: int = 0
    duplicates: int = 0
    conflicts_refused: int = 0
    conflicts_disallowed: int = 0
    events_failed: int = 0
    loops_dropped: int = 0
    possible_duplicate_batches: int = 0
    dead_letters: int = 0
    acks_not_sent: int = 0
    batches_kept_for_region: int = 0
    batches_out_of_sequence: int = 0

    def __post_init__(self) -> None:
        self.batch_sizes: list[int] = []


def receiver_metric_families(labels: dict[str, str], stats: ReceiverStats) -> list[Metric]:
    """The metric families of one scrape of a gateway receiver, read from its stats.

    Every sample carries ``namespace`` and ``member`` (the worker's), and the worker's id:
    ``sender``, ``receiver`` or ``queue``. Counters end in ``_total``.

    Gateway receiver (``{ns}.gwr.<receiver>``):

    - ``regionbus_gateway_receiver_batches_acked_total``: batches applied and acked.
    - ``regionbus_gateway_receiver_possible_duplicate_batches_total``: batches received
      flagged possible duplicate (resends).
    - ``regionbus_gateway_receiver_events_applied_total``, ``..._duplicate_events_total``
      (already applied, by EventID), ``..._conflicts_refused_total`` (older than the entry),
      ``..._conflicts_disallowed_total`` (by the resolver), ``..._events_failed_total``,
      ``..._loops_dropped_total``, ``..._dead_letters_total``, ``..._acks_not_sent_total``,
      ``..._batches_out_of_sequence_total``.

    Args:
        labels: ``{"namespace": ..., "member": ..., "receiver": ...}`` of the worker.
        stats: Its counters; only read.
    """
    families = MetricFamilies(labels)
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
        families.counter(
            prefix + "batches_out_of_sequence",
            "Batches left unapplied because the one before them was lost on the way (the "
            "sender resends both).",
            stats.batches_out_of_sequence,
        ),
    ]


__all__ = ["ReceiverStats", "receiver_metric_families"]
