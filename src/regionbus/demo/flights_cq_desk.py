"""The flights demo's CQ desk: continuous queries instead of interest (docs/behaviour.md §9).

It holds no interest at all. Two continuous queries keep live result sets, as a delay desk
would:

- ``delayed``: ``SELECT * FROM /flights f WHERE f.dep_delay > 60``, every flight that left
  more than an hour late. A flight enters at its departure (query CREATE, base UPDATE: its
  scheduled value has no ``dep_delay``, which is UNDEFINED, so it was not in) and stays at
  its arrival (UPDATE); cancelled flights never enter.
- ``delayed-in-the-air``: the same flights while their status is ``departed``: they enter
  at departure and leave at arrival (DESTROY); diverted ones stay.

At the end each live result set (initial results, then the events) must equal the pandas
answer over the replayed rows, with the server's values, and the counts of query CREATE,
UPDATE and DESTROY must equal the transitions computed from the data with pandas
(:func:`expected_cq_outcomes`), not with the servers' evaluator.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import pandas as pd

from regionbus.clients import (
    ClientCache,
    ClientSettings,
    CqAttributes,
    CqEvent,
    CqListener,
    Operation,
)
from regionbus.demo.flights_data import flight_keys
from regionbus.demo.flights_desks import REGION, DeskResult, DeskSpec, EventCounts
from regionbus.demo.flights_verify import Check, compare

CQ_DESK_QUERIES: Final = {
    "delayed": f"SELECT * FROM /{REGION} f WHERE f.dep_delay > 60",
    "delayed-in-the-air": (
        f"SELECT * FROM /{REGION} f WHERE f.dep_delay > 60 AND f.status = 'departed'"
    ),
}
"""The CQ desk's continuous queries, by name."""


@dataclass(frozen=True)
class CqOutcome:
    """What a CQ of the desk ends with, or should.

    Attributes:
        keys: The keys in its result set at the end.
        counts: Its events by query operation (creates, updates, destroys).
    """

    keys: frozenset[str]
    counts: EventCounts

    @property
    def events(self) -> int:
        """Every event of the CQ."""
        return self.counts.creates + self.counts.updates + self.counts.destroys


def expected_cq_outcomes(flights: pd.DataFrame) -> dict[str, CqOutcome]:
    """The CQ desk's result sets and transitions computed from the rows with pandas.

    A departed flight (``dep_time``) with ``dep_delay > 60`` enters both result sets at
    departure; one that arrived (``arr_time``) then updates ``delayed`` and leaves
    ``delayed-in-the-air``.

    Args:
        flights: The replayed rows (:func:`regionbus.demo.flights_data.load_flights`).
    """
    keys = pd.Series(flight_keys(flights), index=flights.index)
    departed = flights["dep_time"].notna()
    arrived = departed & flights["arr_time"].notna()
    late = departed & (flights["dep_delay"] > 60)
    late_arrived = late & arrived
    return {
        "delayed": CqOutcome(
            frozenset(keys[late]),
            EventCounts(creates=int(late.sum()), updates=int(late_arrived.sum())),
        ),
        "delayed-in-the-air": CqOutcome(
            frozenset(keys[late & ~arrived]),
            EventCounts(creates=int(late.sum()), destroys=int(late_arrived.sum())),
        ),
    }


@dataclass
class LiveResultSet:
    """One CQ's live result set, kept by its listener (thread-safe)."""

    entries: dict[str, Any] = field(default_factory=dict)
    counts: EventCounts = field(default_factory=EventCounts)
    errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class _Keeper(CqListener):
    """Applies a CQ's events to its live result set."""

    def __init__(self, live: LiveResultSet) -> None:
        self._live = live

    def on_event(self, event: CqEvent) -> None:
        live = self._live
        with live.lock:
            operation = event.query_operation
            if operation is Operation.CREATE:
                live.counts.creates += 1
                live.entries[str(event.key)] = event.new_value
            elif operation is Operation.UPDATE:
                live.counts.updates += 1
                live.entries[str(event.key)] = event.new_value
            elif operation is Operation.DESTROY:
                live.counts.destroys += 1
                live.entries.pop(str(event.key), None)
            elif operation in (Operation.REGION_CLEAR, Operation.REGION_DESTROY):
                live.entries.clear()

    def on_error(self, event: CqEvent) -> None:
        with self._live.lock:
            self._live.errors += 1


class CqDesk:
    """The CQ desk in this process: its CQs run (with initial results) before this returns.

    Args:
        spec: The desk's spec (kind CQ).
        settings: Client settings; the client id is generated.

    Raises:
        TransportError: Kafka cannot be reached or no server of the namespace runs.
        RegionNotFoundError: the servers do not define region ``flights``.
        ServerTimeoutError: a CQ's execution was not answered within ``read_timeout_ms``.
    """

    def __init__(self, spec: DeskSpec, settings: ClientSettings) -> None:
        self.spec = spec
        self.cache = ClientCache(settings)
        self.live = {name: LiveResultSet() for name in CQ_DESK_QUERIES}
        try:
            self.cache.create_region(REGION)
            service = self.cache.query_service()
            for name, query in CQ_DESK_QUERIES.items():
                live = self.live[name]
                cq = service.new_cq(name, query, CqAttributes([_Keeper(live)]))
                # Held while the initial results go in: the events after them wait for it.
                with live.lock:
                    live.entries.update((r.key, r.value) for r in cq.execute_with_initial_results())
        except BaseException:
            self.cache.close()
            raise

    def show_day(self, keys: tuple[str, ...]) -> None:
        """Ignored: the CQ desk follows its queries, not days."""

    def day_published(self, number: int) -> None:
        """Ignored: the CQ desk stays connected."""

    def _events(self) -> int:
        total = 0
        for live in self.live.values():
            with live.lock:
                counts = live.counts
                total += counts.creates + counts.updates + counts.destroys + live.errors
        return total

    def finish(self, expected_events: int | None, timeout_s: float) -> DeskResult:
        """Wait until the CQs' listeners heard ``expected_events`` events (one change that
        concerns both CQs is one message in the queue and an event for each) and the queue
        is quiet, then report: ``entries`` is the ``delayed`` result set,
        ``continuous_queries`` every CQ's result set and counts."""
        deadline = time.monotonic() + timeout_s
        stats = self.cache.subscription_stats
        while expected_events is not None and self._events() < expected_events:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        quiet = self.cache.wait_for_quiet(
            idle_s=0.5, timeout_s=max(1.0, deadline - time.monotonic())
        )
        outcomes = {}
        for name, live in self.live.items():
            with live.lock:
                outcomes[name] = (dict(live.entries), EventCounts(**vars(live.counts)), live.errors)
        return DeskResult(
            name=self.spec.name,
            events_received=stats.cq_events_received,
            events_delivered=self._events(),
            duplicates_dropped=stats.cq_duplicates_dropped,
            counts=EventCounts(),
            entries=outcomes["delayed"][0],
            quiet=quiet,
            continuous_queries=outcomes,
        )

    def close(self) -> None:
        """Disconnect (the CQs go with the client)."""
        self.cache.close()


def verify_cq_desk(
    spec: DeskSpec,
    result: DeskResult,
    server_state: Mapping[str, Any],
    expected: Mapping[str, CqOutcome],
) -> list[Check]:
    """Per CQ: its live result set equals the server entries of the pandas answer, and its
    CREATE/UPDATE/DESTROY counts equal the transitions computed from the data.

    Returns:
        Two checks per CQ of :data:`CQ_DESK_QUERIES`.
    """
    checks = []
    outcomes = result.continuous_queries or {}
    for name, want in expected.items():
        entries, counts, errors = outcomes.get(name, ({}, EventCounts(), 0))
        wanted = {k: server_state[k] for k in want.keys if k in server_state}
        checks.append(
            compare(f"{spec.name} {name}: live result set == pandas answer", entries, wanted)
        )
        got = (counts.creates, counts.updates, counts.destroys)
        should = (want.counts.creates, want.counts.updates, want.counts.destroys)
        checks.append(
            Check(
                f"{spec.name} {name}: CREATE/UPDATE/DESTROY == transitions in the data",
                got == should and errors == 0,
                f"{got[0]:,}/{got[1]:,}/{got[2]:,} (data: {should[0]:,}/{should[1]:,}/"
                f"{should[2]:,}), {errors} errors",
            )
        )
    return checks


__all__ = [
    "CQ_DESK_QUERIES",
    "CqDesk",
    "CqOutcome",
    "LiveResultSet",
    "expected_cq_outcomes",
    "verify_cq_desk",
]
