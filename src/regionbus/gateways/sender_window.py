"""The gateway sender's batches in flight: sent to the remote site, not yet acked.

Geode's serial sender does not wait for a batch's ack before it sends the next:
``GatewaySenderEventRemoteDispatcher.dispatchBatch`` returns once the batch is written to
the connection, and its ``AckReaderThread`` reads the acks and removes acked batches from
the queue (``handleSuccessBatchAck``); on a failed connection the processor re-peeks every
unacked event from the head of its queue and sends it again. Here the same: a bounded
:class:`BatchWindow` of ``max_batches_in_flight`` batches, acks read on their own thread,
and the queue's committed offsets (the batches' removal, invariant 5) advanced only over a
contiguous prefix of acked batches, so a batch never leaves the queue before every batch
queued ahead of it was acked too.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from regionbus.gateways.protocol import GatewayAck
from regionbus.schemas.messages import Event


@dataclass
class InFlightBatch:
    """One batch of a sender run, from its peek until the acks of it and of every batch
    before it are in.

    Attributes:
        sequence: Position in the run, from 1 (:attr:`GatewayBatch.sequence`).
        batch_id: ``"<run>-<sequence>"``.
        events: The events transmitted (after filters and conflation); empty when nothing
            is sent (every event filtered, or only undecodable messages were read): the
            entry then only carries its queue positions, removed in turn.
        raw: The events as queued (framed), sent as they are the first time.
        positions: ``{queue partition: offset past this batch}``, committed once this batch
            and every one before it are acked; None when the peek moved no position.
        sent_at: ``time.monotonic()`` of the last send (the ack timeout runs from it).
        sends: How many times it was handed to the producer.
        delivered: The remote Kafka took it at least once (a resend is then flagged
            possible duplicate).
        failed: Its last send was not taken by the remote Kafka: it is sent again.
        ack: The receiver's ack, once read.
    """

    sequence: int
    batch_id: str
    events: list[Event]
    raw: list[bytes]
    positions: dict[int, int] | None
    sent_at: float = 0.0
    sends: int = 0
    delivered: bool = False
    failed: bool = False
    ack: GatewayAck | None = None

    @property
    def done(self) -> bool:
        """Acked, or nothing to send."""
        return self.ack is not None or not self.events


@dataclass
class BatchWindow:
    """The batches of one sender run not yet removed from the queue, in queue order.

    Thread-safe: the dispatching thread adds and sends, the ack thread acks and pops.

    Args:
        run_id: The run's id (batch ids are ``"<run_id>-<sequence>"``).
        capacity: Most batches with events unacked at once (``max_batches_in_flight``).
    """

    run_id: str
    capacity: int
    closed: bool = False
    acked_through: int = 0
    """Sequence of the last batch of the contiguous acked prefix (0: none yet)."""
    peak_in_flight: int = 0
    """Most batches in flight at once in this run."""
    _entries: list[InFlightBatch] = field(default_factory=list)
    _next_sequence: int = 1
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def new_batch(
        self, events: list[Event], raw: list[bytes], positions: dict[int, int] | None
    ) -> InFlightBatch:
        """Append the next batch of the run (not sent yet) and return it.

        Only a batch with events is numbered: one with nothing to send (every event
        filtered, or only queue positions) is never sent, so a number of its own would be a
        gap the receiver waits on (``BatchSequencer.admits``) until an ack timeout. It
        carries the last number given, so completing it moves ``acked_through`` nowhere new.
        """
        with self._changed:
            if events:
                sequence = self._next_sequence
                self._next_sequence += 1
                batch_id = f"{self.run_id}-{sequence}"
            else:
                sequence = self._next_sequence - 1
                batch_id = f"{self.run_id}-{sequence}-nothing-to-send"
            entry = InFlightBatch(sequence, batch_id, events, raw, positions)
            self._entries.append(entry)
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight())
            return entry

    def _in_flight(self) -> int:
        return sum(1 for e in self._entries if not e.done)

    @property
    def in_flight(self) -> int:
        """Batches with events sent (or being sent) and not acked."""
        with self._changed:
            return self._in_flight()

    def idle(self) -> bool:
        """True when no batch is in flight (the sender may send a partial batch at once)."""
        with self._changed:
            return self._in_flight() == 0

    def wait_for_room(self, timeout_s: float) -> bool:
        """Wait until fewer than ``capacity`` batches are in flight; False on timeout or
        when the window is closed."""
        with self._changed:
            return (
                self._changed.wait_for(
                    lambda: self.closed or self._in_flight() < self.capacity, timeout_s
                )
                and not self.closed
            )

    def acked(self, ack: GatewayAck) -> InFlightBatch | None:
        """Record an ack; returns the batch it acks, None when it is for no batch in flight
        (a previous run's, or a second ack of a resent batch)."""
        with self._changed:
            for entry in self._entries:
                if entry.batch_id == ack.batch_id and entry.events:
                    if entry.ack is not None:
                        return None
                    entry.ack = ack
                    self._changed.notify_all()
                    return entry
            return None

    def pop_completed(self) -> list[InFlightBatch]:
        """Remove and return the leading batches that are done (acked, or empty), in
        order: their queue positions may be committed."""
        with self._changed:
            count = 0
            while count < len(self._entries) and self._entries[count].done:
                count += 1
            completed, self._entries = self._entries[:count], self._entries[count:]
            if completed:
                self.acked_through = completed[-1].sequence
                self._changed.notify_all()
            return completed

    def to_resend(self, now: float, ack_timeout_s: float) -> tuple[list[InFlightBatch], bool]:
        """The batches to send again, in order: every unacked one from the first whose
        send failed, or from the first unacked one when its ack is overdue (then True).

        Args:
            now: ``time.monotonic()``.
            ack_timeout_s: The sender's ``ack_timeout_ms``, in seconds.
        """
        with self._changed:
            unacked = [e for e in self._entries if not e.done]
            if not unacked:
                return [], False
            if unacked[0].sends and now - unacked[0].sent_at >= ack_timeout_s:
                return unacked, True
            failed = next((i for i, e in enumerate(unacked) if e.failed), None)
            if failed is None:
                return [], False
            return unacked[failed:], False

    def close(self) -> None:
        """End the run: nothing more is committed from it, waiters return."""
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    def wait_changed(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for an ack or a close."""
        with self._changed:
            self._changed.wait(timeout_s)


__all__ = ["BatchWindow", "InFlightBatch"]
