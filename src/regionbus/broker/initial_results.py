"""Initial results sent a bounded share of each loop turn: the bulk loads of interest
registrations in a whole bucket (ALL_KEYS, REGEX) and the initial results of continuous
queries.

A registration of every key with ``KEYS_VALUES`` used to read the bucket's entries and
send them within the handling of its operation. Two hundred clients registering at once in
a region of 100,000 entries made that 3,200 whole-bucket reads in a row, and held every
other client's operations (read in the same loop) behind them for tens of seconds. Here
that work waits in a :class:`regionbus.broker.pacing.FairQueue` and runs, a bounded number
of loads at once, for at most ``initial_results_budget_ms`` of each turn of the loop and
at most ``initial_results_share`` of its time; then the loop reads operations again. The
pages go by the server's lingering producer (``bulk`` replies,
`regionbus.broker.deliveries`).

How a paged load stays gap-free (docs/behaviour.md §3, §4). The registration takes effect when its
operation is processed, in the bucket's order (Geode registers interest before it sends
the initial snapshot): every change of the bucket from then on is routed to the client.
The bucket's entries are then read a page at a time (``HSCAN``,
:meth:`regionbus.broker.store.reads.EntryReads.scan_page`) over later turns, each page
sent as it is read (``more`` replies); the last reply carries the region version at the
registration. An entry present throughout reaches the client in a page; any other was
changed after the registration and reaches it as an event. An entry that arrives both
ways (or twice in pages) carries its version each time, and the client keeps the newest
(`regionbus.clients.local_store.LocalStore.load`: a newer local version wins, a key
destroyed during the registration is not revived).

A continuous query's initial results are a result set at one point of the bucket's order
(the client holds the CQ's events until they arrive and has no version to set an event
against a result), so its execution is not paged: the whole execution (registration and
read) waits its turn and runs in one step, at which point it takes effect; what a step
costs is bounded by the bucket's size. A key registration reads at most
``KEYS_PER_REGISTRATION_MESSAGE`` keys, and stays in its handler.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from regionbus.broker.config import ServerSettings
from regionbus.broker.outbox import Outbox
from regionbus.broker.ownership import BucketOwnership
from regionbus.broker.pacing import FairQueue
from regionbus.broker.store import RegionStore
from regionbus.schemas.addressing import ClientAddress
from regionbus.schemas.messages import Entry, Operation, Reply


@dataclass
class PagedLoad:
    """The initial results of a registration in one bucket, read a page at a time.

    Attributes:
        op: The registration.
        bucket: The bucket.
        version: The region's version in the bucket at the registration (sent last).
        with_values: Read values (``KEYS_VALUES``) or keys only (``KEYS``).
        key_filter: Keep only the keys it accepts (a REGEX registration), else None.
        cursor: Where the next page starts (``HSCAN`` cursor; 0 before the first).
    """

    op: Operation
    bucket: int
    version: int
    with_values: bool
    key_filter: Callable[[str], bool] | None = None
    cursor: int = 0


@dataclass
class WholeLoad:
    """Work that answers an operation in one step when its turn comes (a continuous
    query's execution with its initial results).

    Attributes:
        op: The operation.
        bucket: The bucket.
        run: Does it all (registration, read, reply).
    """

    op: Operation
    bucket: int
    run: Callable[[], None]


Load = PagedLoad | WholeLoad


def reply_entries(
    send: Callable[[Reply], None],
    chunk_bytes: int,
    op: Operation,
    bucket: int,
    entries: list[Entry],
    version: int | None = None,
    *,
    last: bool = True,
) -> None:
    """Reply with entries, split into messages of about ``chunk_bytes``
    (``reply_chunk_bytes``); with ``last``, the last message ends the answer
    (``more=False``) and carries ``version`` (for registrations: the region version at the
    registration). Without ``last`` nothing is sent for no entries. Each message goes
    through ``send`` (the client's proxy's reply, or the outbox's to ``op``'s address)."""
    chunks: list[list[Entry]] = [[]]
    size = 0
    for entry in entries:
        entry_size = len(entry.key) + len(entry.value or b"") + 24
        if chunks[-1] and size + entry_size > chunk_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += entry_size
    if not last and not entries:
        return
    for i, chunk in enumerate(chunks):
        ends = last and i == len(chunks) - 1
        reply = Reply(
            request_id=op.request_id,
            bucket=bucket,
            ok=True,
            entries=tuple(chunk),
            more=not ends,
            version=version if ends else None,
        )
        send(reply)


class InitialResults:
    """The initial results waiting or being sent, and the share of the loop they get.

    Two bounds: a turn's sending stops at ``initial_results_budget_ms`` (what another
    client's operation read in that turn waits at most), and over time the sending takes
    at most ``initial_results_share`` of the loop's wall-clock time: after a run of t
    seconds, the next waits t * (1 - share) / share. The second bounds what a storm of
    registrations makes everything downstream do per second (the producer, Kafka, the
    clients decoding), which on shared cores is what others' operations wait behind.

    Args:
        settings: ``initial_results_budget_ms``, ``initial_results_share``,
            ``initial_results_running_max``, ``initial_results_page_entries``,
            ``reply_chunk_bytes``.
        store: Reads the pages.
        ownership: A load of a bucket no longer held here is dropped (its client's
            request times out, as any request whose primary failed before answering).
        outbox: The replies.
        clock_s: The monotonic clock.
    """

    def __init__(
        self,
        settings: ServerSettings,
        store: RegionStore,
        ownership: BucketOwnership,
        outbox: Outbox,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._store = store
        self._ownership = ownership
        self._outbox = outbox
        self._clock_s = clock_s
        self._waiting: FairQueue[Load] = FairQueue()
        self._running: list[Load] = []
        # A client's share of the loads running at once: half of them, so a client whose
        # registrations queued many loads leaves room for the next client.
        self._client_share = max(1, settings.initial_results_running_max // 2)
        self._resume_s = 0.0
        """When the next run may start (monotonic clock, s)."""

    @property
    def pending(self) -> int:
        """Loads waiting or running."""
        return len(self._waiting) + len(self._running)

    def poll_s(self, timeout_s: float) -> float:
        """How long the loop may wait for operations (s): ``timeout_s`` (its poll timeout)
        when nothing is pending, else no longer than until a run may send (0: now), so the
        loop never idles its whole timeout between two turns of pages."""
        if not self.pending:
            return timeout_s
        return min(timeout_s, max(0.0, self._resume_s - self._clock_s()))

    def add(self, load: Load) -> None:
        """Queue a load behind the others (it runs on a later turn, :meth:`run`)."""
        self._waiting.push(load.op.client_id, load)

    def drop(self, client_id: str, bucket: int) -> int:
        """Forget a client's loads in a bucket (it disconnected, or removed what it
        registered): returns how many."""

        def ours(load: Load) -> bool:
            return load.bucket == bucket

        kept = [x for x in self._running if x.op.client_id != client_id or not ours(x)]
        dropped = len(self._running) - len(kept)
        self._running = kept
        return dropped + len(self._waiting.remove(client_id, ours))

    def run(self) -> bool:
        """Run loads for at most ``initial_results_budget_ms`` (at each turn of the loop),
        a page of each running load in turn, at most ``initial_results_running_max`` at
        once. One page or one whole load may end past the budget: the budget is checked
        between steps. Nothing runs before the time the last run's share set
        (:meth:`poll_s`).

        Returns:
            True when anything was sent (the caller sends the outbox).

        Raises:
            TransportError: Redis failed (the load stays, and resumes at its page).
        """
        if not self.pending:
            return False
        began_s = self._clock_s()
        if began_s < self._resume_s:
            return False
        try:
            return self._run_until(began_s + self._settings.initial_results_budget_ms / 1000)
        finally:
            spent_s = self._clock_s() - began_s
            self._resume_s = began_s + spent_s / self._settings.initial_results_share

    def _run_until(self, deadline_s: float) -> bool:
        worked = False
        while True:
            self._fill()
            if not self._running:
                return worked
            for load in list(self._running):
                if load.bucket not in self._ownership.owned or self._step(load):
                    self._running.remove(load)
                worked = True
                if self._clock_s() >= deadline_s:
                    return worked

    def _fill(self) -> None:
        running_max = self._settings.initial_results_running_max
        while len(self._running) < running_max:
            load = self._waiting.pop(self._at_share)
            if load is None:
                return
            self._running.append(load)

    def _at_share(self, client_id: str) -> bool:
        running = sum(1 for load in self._running if load.op.client_id == client_id)
        return running >= self._client_share

    def _step(self, load: Load) -> bool:
        """One step of a load; True when it is done."""
        if isinstance(load, WholeLoad):
            load.run()
            return True
        load.cursor, entries = self._store.scan_page(
            load.op.region,
            load.bucket,
            load.cursor,
            self._settings.initial_results_page_entries,
            load.key_filter,
            load.with_values,
        )
        done = load.cursor == 0
        reply_entries(
            partial(self._outbox.reply, to=ClientAddress.of(load.op), bulk=True),
            self._settings.reply_chunk_bytes,
            load.op,
            load.bucket,
            entries,
            load.version,
            last=done,
        )
        return done


__all__ = ["InitialResults", "Load", "PagedLoad", "WholeLoad", "reply_entries"]
