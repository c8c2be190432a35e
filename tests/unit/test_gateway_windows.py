"""The pure logic of pipelined gateway batches: the sender's window of batches in flight
(acks commit only a contiguous prefix; resends start at the first unacked batch) and the
receiver's check that a run's batches are applied in sequence."""

from __future__ import annotations

import json

from regionbus.gateways.batch_sequence import METADATA_LIMIT, BatchSequencer
from regionbus.gateways.protocol import GatewayAck, GatewayBatch
from regionbus.gateways.sender_window import BatchWindow, InFlightBatch
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import Event, EventKind


def _event(seq: int) -> Event:
    return Event(EventID("m", 1, seq, 0), EventKind.UPDATE, "r", seq, 1, "c", f"k{seq}", b"1")


def _window(batches: int, capacity: int = 10) -> BatchWindow:
    window = BatchWindow("run", capacity)
    for n in range(batches):
        window.new_batch([_event(n)], [b"raw"], {0: n + 1})
    return window


def _sent(batches: int) -> tuple[BatchWindow, list[InFlightBatch]]:
    """A window of ``batches`` batches, each sent once at t=100 s."""
    window = BatchWindow("run", 10)
    entries = [window.new_batch([_event(n)], [b"raw"], {0: n + 1}) for n in range(batches)]
    for entry in entries:
        entry.sends, entry.sent_at = 1, 100.0
    return window, entries


def test_acks_out_of_order_complete_only_the_contiguous_prefix() -> None:
    window = _window(3)
    assert window.acked(GatewayAck("run-2", "r", 1))
    assert window.pop_completed() == []
    assert window.acked_through == 0
    assert window.acked(GatewayAck("run-1", "r", 1))
    done = window.pop_completed()
    assert [e.sequence for e in done] == [1, 2]
    assert done[-1].positions == {0: 2}
    assert window.acked_through == 2
    assert window.in_flight == 1


def test_an_ack_of_no_batch_in_flight_or_a_second_ack_is_ignored() -> None:
    window = _window(1)
    assert not window.acked(GatewayAck("old-run-1", "r", 1))
    assert window.acked(GatewayAck("run-1", "r", 1))
    assert not window.acked(GatewayAck("run-1", "r", 1))


def test_an_entry_with_nothing_to_send_completes_in_its_turn() -> None:
    window = _window(1)
    window.new_batch([], [], {0: 5})  # e.g. every event filtered out
    assert window.pop_completed() == []
    window.acked(GatewayAck("run-1", "r", 1))
    assert [e.positions for e in window.pop_completed()] == [{0: 1}, {0: 5}]


def test_an_overdue_ack_resends_every_unacked_batch_from_the_first() -> None:
    window, _ = _sent(3)
    window.acked(GatewayAck("run-2", "r", 1))
    assert window.to_resend(now=100.5, ack_timeout_s=1.0) == ([], False)
    again, overdue = window.to_resend(now=101.0, ack_timeout_s=1.0)
    assert overdue and [e.sequence for e in again] == [1, 3]


def test_a_failed_send_resends_from_it_not_from_the_batches_the_remote_took() -> None:
    window, entries = _sent(3)
    entries[1].failed = True
    again, overdue = window.to_resend(now=100.1, ack_timeout_s=1.0)
    assert not overdue and [e.sequence for e in again] == [2, 3]


def test_a_batch_with_nothing_to_send_takes_no_sequence_number() -> None:
    """The receiver admits a run's batch only after the one numbered before it: a number
    given to a batch never sent would stall the next one until the ack timeout."""
    window = _window(1)
    empty = window.new_batch([], [], {0: 5})
    after = window.new_batch([_event(5)], [b"raw"], {0: 6})
    assert (empty.sequence, after.sequence) == (1, 2)
    sequencer = BatchSequencer()
    sequencer.applied(_batch("run", 1, 0))
    assert sequencer.admits(_batch("run", after.sequence, window.acked_through))


def test_the_window_has_room_below_its_capacity_only() -> None:
    window = _window(2, capacity=2)
    assert not window.wait_for_room(0.01)
    window.acked(GatewayAck("run-1", "r", 1))
    assert window.wait_for_room(0.01)
    assert window.peak_in_flight == 2
    window.close()
    assert not window.wait_for_room(0.01)


def _batch(run: str, sequence: int, acked_through: int, sender: str = "to-b") -> GatewayBatch:
    return GatewayBatch(
        f"{run}-{sequence}",
        sender,
        1,
        "ns.gwack.1.to-b",
        False,
        (),
        False,
        sequence,
        acked_through,
    )


def test_a_batch_waits_for_the_one_before_it_unless_that_one_was_acked() -> None:
    sequencer = BatchSequencer()
    assert sequencer.admits(_batch("a", 1, 0))
    sequencer.applied(_batch("a", 1, 0))
    assert sequencer.admits(_batch("a", 2, 0))
    assert not sequencer.admits(_batch("a", 3, 0))  # 2 lost on the way
    assert sequencer.admits(_batch("a", 3, 2))  # the sender had 2's ack
    assert sequencer.admits(_batch("a", 1, 0))  # a resend of an applied one
    assert not sequencer.admits(_batch("b", 2, 0))  # another run's, 1 not seen
    assert sequencer.admits(GatewayBatch("x", "s", 1, "t", False, ()))  # not numbered


def test_what_was_applied_survives_a_restart_through_the_commit_metadata() -> None:
    sequencer = BatchSequencer()
    sequencer.applied(_batch("a", 1, 0))
    sequencer.applied(_batch("a", 2, 0))
    restarted = BatchSequencer(sequencer.to_metadata())
    assert restarted.admits(_batch("a", 3, 0))
    assert not restarted.admits(_batch("a", 4, 0))
    assert not BatchSequencer("not json").admits(_batch("a", 3, 0))
    assert not BatchSequencer(None).admits(_batch("a", 3, 0))


def test_the_metadata_keeps_the_senders_heard_from_last_within_its_limit() -> None:
    sequencer = BatchSequencer()
    for n in range(200):
        sequencer.applied(_batch("r" * 20, 1, 0, sender=f"sender-{n:03d}"))
    text = sequencer.to_metadata()
    assert len(text) <= METADATA_LIMIT
    kept = json.loads(text)
    assert "1/sender-199" in kept and "1/sender-000" not in kept
