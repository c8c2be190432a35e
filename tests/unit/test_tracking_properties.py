"""Property tests (hypothesis) of client message tracking (docs/behaviour.md §2), against a plain
model.

The rule: per (member, thread, bucket) the tracker keeps the highest sequence id seen; an
event at or below it is a duplicate, dropped; entries idle longer than the tracking timeout
(Geode ``subscription-message-tracking-timeout``) are forgotten. Proved here for generated
streams: resent, duplicated, interleaved across threads and buckets, and reordered; and,
as a state machine, for any sequence of events, clock moves and expiry sweeps.

The server's own per-(member, thread) dedup runs inside Redis (``broker/lua/apply_entry.lua``)
with no pure-Python part; the integration tests cover it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from regionbus.clients.tracking import MessageTracker
from regionbus.schemas.eventid import EventID

TIMEOUT_S = 900.0
"""Geode's default ``subscription-message-tracking-timeout``."""

TrackingKey = tuple[str, int, int]


class Clock:
    """A settable clock, in seconds."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


KEYS = st.tuples(st.sampled_from(["m1", "m2", "ünï-member"]), st.integers(1, 3), st.integers(-1, 3))


@st.composite
def resent_streams(draw: st.DrawFn) -> tuple[list[EventID], list[EventID]]:
    """Per tracking key an in-order run of sequence ids (gaps allowed: other buckets took
    them), with resends of already-sent events spliced in (a new primary resending its
    window), the keys' runs interleaved arbitrarily. Returns (unique events, arrivals)."""
    keys = draw(st.lists(KEYS, min_size=1, max_size=4, unique=True))
    per_key: dict[TrackingKey, list[EventID]] = {}
    for member, thread, bucket in keys:
        start = draw(st.integers(0, 2**40))
        steps = draw(st.lists(st.integers(1, 3), min_size=1, max_size=12))
        sequences = [start + sum(steps[: i + 1]) for i in range(len(steps))]
        per_key[(member, thread, bucket)] = [EventID(member, thread, s, bucket) for s in sequences]
    arrivals_per_key: dict[TrackingKey, list[EventID]] = {}
    for key, events in per_key.items():
        arrivals: list[EventID] = []
        for index, event in enumerate(events):
            arrivals.append(event)
            if draw(st.booleans()):  # resend a window of what was already sent
                begin = draw(st.integers(0, index))
                arrivals.extend(events[begin : index + 1])
        arrivals_per_key[key] = arrivals
    cursors = dict.fromkeys(arrivals_per_key, 0)
    merged: list[EventID] = []
    while any(cursors[k] < len(arrivals_per_key[k]) for k in cursors):
        ready = sorted(k for k in cursors if cursors[k] < len(arrivals_per_key[k]))
        key = draw(st.sampled_from(ready))
        merged.append(arrivals_per_key[key][cursors[key]])
        cursors[key] += 1
    unique = [e for events in per_key.values() for e in events]
    return unique, merged


@settings(max_examples=200)
@given(resent_streams())
def test_in_order_streams_with_resends_deliver_every_event_exactly_once(
    streams: tuple[list[EventID], list[EventID]],
) -> None:
    unique, arrivals = streams
    tracker = MessageTracker(TIMEOUT_S, Clock())
    delivered = [e for e in arrivals if tracker.is_new(e)]
    assert sorted(delivered) == sorted(unique)  # nothing lost, nothing twice
    assert tracker.duplicates == len(arrivals) - len(unique)
    for key in {e.tracking_key for e in unique}:  # and per key in sequence order
        sequences = [e.sequence for e in delivered if e.tracking_key == key]
        assert sequences == sorted(sequences)


@settings(max_examples=200)
@given(st.lists(st.tuples(KEYS, st.integers(0, 20)), max_size=60))
def test_any_arrival_order_delivers_each_event_id_at_most_once_and_every_new_high(
    arrivals: list[tuple[TrackingKey, int]],
) -> None:
    """Reordered and duplicated at will: an event is delivered exactly when its sequence id
    is above every one seen before for its key (so at most once, and never a new high)."""
    tracker = MessageTracker(TIMEOUT_S, Clock())
    highest: dict[TrackingKey, int] = {}
    delivered: list[EventID] = []
    for (member, thread, bucket), sequence in arrivals:
        event = EventID(member, thread, sequence, bucket)
        expected_new = sequence > highest.get(event.tracking_key, -1)
        assert tracker.is_new(event) == expected_new, event
        if expected_new:
            highest[event.tracking_key] = sequence
            delivered.append(event)
    assert len(delivered) == len(set(delivered))
    assert len(tracker) == len(highest)


class TrackerMachine(RuleBasedStateMachine):
    """Any mix of events, clock moves and sweeps, checked against a model that knows, per
    key, the highest sequence id and when it was last touched.

    What the model fixes: a key touched within the timeout keeps its highest sequence id
    (duplicates dropped, new highs delivered); a new high is delivered whatever happened;
    once a key has been idle past the timeout the tracker may have forgotten it (sweeps are
    lazy), after which an old sequence id is new again (Geode behaves the same); an
    explicit :meth:`MessageTracker.expire` forgets exactly the keys idle past the timeout.
    """

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.tracker = MessageTracker(TIMEOUT_S, self.clock)
        self.model: dict[TrackingKey, tuple[int, float]] = {}
        self.dropped = 0

    @initialize(start_s=st.floats(0, 1e6))
    def start_clock(self, start_s: float) -> None:
        self.clock.now_s = start_s
        self.tracker = MessageTracker(TIMEOUT_S, self.clock)

    @rule(key=KEYS, sequence=st.integers(0, 30))
    def event_arrives(self, key: TrackingKey, sequence: int) -> None:
        event = EventID(key[0], key[1], sequence, key[2])
        now = self.clock.now_s
        seen = self.model.get(key)
        is_new = self.tracker.is_new(event)
        if seen is None or sequence > seen[0]:
            assert is_new, f"{event} is a new high but was dropped"
        elif now - seen[1] <= TIMEOUT_S:
            assert not is_new, f"{event} is a duplicate within the timeout but was delivered"
        # else: idle past the timeout, the tracker may or may not have forgotten the key
        if is_new:
            self.model[key] = (sequence, now)
        else:
            assert seen is not None
            self.model[key] = (seen[0], now)
            self.dropped += 1

    @rule(
        seconds=st.sampled_from(
            [0.0, 0.5, 61.0, TIMEOUT_S / 2 + 1, TIMEOUT_S - 1, TIMEOUT_S + 1, 5000.0]
        )
    )
    def time_passes(self, seconds: float) -> None:
        self.clock.now_s += seconds

    @rule()
    def sweep(self) -> None:
        now = self.clock.now_s
        self.tracker.expire()
        self.model = {k: v for k, v in self.model.items() if v[1] >= now - TIMEOUT_S}
        assert len(self.tracker) == len(self.model)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def resend_the_highest(self, data: st.DataObject) -> None:
        """A resend of the newest event of a key still within the timeout is dropped."""
        key = data.draw(st.sampled_from(sorted(self.model)))
        highest, last_s = self.model[key]
        if self.clock.now_s - last_s > TIMEOUT_S:
            return
        assert not self.tracker.is_new(EventID(key[0], key[1], highest, key[2]))
        self.model[key] = (highest, self.clock.now_s)
        self.dropped += 1

    @invariant()
    def duplicates_are_counted(self) -> None:
        assert self.tracker.duplicates == self.dropped

    @invariant()
    def the_tracker_never_holds_a_key_the_model_does_not(self) -> None:
        assert len(self.tracker) <= len(self.model)


TrackerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=30)
test_tracker_state_machine = TrackerMachine.TestCase
