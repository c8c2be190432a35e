"""The full subscription queues of a server, each holding back only its own writers.

A queue that holds ``maximum_message_count`` unacked events is full (docs/behaviour.md §4; Geode
``HARegionQueue``): the operations whose events go to it wait until its client acks or
``maximum_queue_full_wait_ms`` has passed, as a Geode put blocks on a full queue. Only
those: the server loop goes on, so writers whose events go elsewhere, and clients whose
queues have room, do not wait for a client that does not read. The events for a held
queue (and the replies of the writers whose events they are) are parked in the outbox
(`regionbus.broker.outbox.Outbox`), in order, and sent when the hold ends.

A hold begins when routing finds a queue's counted depth at the capacity. Its ack is read
then, and every :data:`HOLD_POLL_S` while it lasts, without waiting for the answer (a
server with a thousand full queues makes a thousand requests in flight, not a thousand
waits). It ends:

- when an ack read says the queue has room again: fewer than the capacity of the events
  sent to it are unacked (what is parked was not sent);
- at ``maximum_queue_full_wait_ms``: the queue may then grow (it is not held for again
  until it drains below the capacity), or, if the operator chose
  ``disconnect_unresponsive_clients``, its clients that stayed over the capacity are
  disconnected and nothing more is queued for them;
- at once, for every hold, when the outbox has more than :data:`PARKED_BYTES_MAX` parked:
  memory stays bounded whatever the writers send meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from regionbus.broker.client_proxy import ClientProxy, QueueAccount, SharedQueue
from regionbus.broker.queue_acks import AckRead, QueueAcks
from regionbus.broker.stats import ServerStats

log = logging.getLogger("regionbus.server")

HOLD_POLL_S: Final = 0.05
"""How often a held queue's ack is read again, in seconds."""
PARKED_BYTES_MAX: Final = 64 * 1024 * 1024
"""Bytes of events and replies the outbox may keep parked; past them every hold ends at
once (as if its wait had passed)."""


@dataclass
class _Hold:
    """One full queue's hold: until when, whose, and its ack read in flight."""

    deadline: float
    whose: str
    read: AckRead
    asked_at: float
    confirmed: bool = False
    """An ack read found it full (the hold is logged and counted then, not on the
    counted depth alone, which lags the client's acks)."""
    committed: dict[str, int] = field(default_factory=dict)
    """The readers' committed offsets as last read."""


@dataclass
class HoldsEnded:
    """What :meth:`QueueHolds.tick` ended.

    Attributes:
        any: Whether a hold ended (the outbox then sends what it may).
        disconnected: Clients disconnected as unresponsive: what is parked for them alone
            is dropped.
    """

    any: bool = False
    disconnected: set[str] = field(default_factory=set)


class QueueHolds:
    """The queues of one server that are held because they are full.

    Args:
        acks: Reads the acks of a held queue.
        stats: The server's counters (``queue_full_waits``, ``clients_disconnected``).
        limit: ``maximum_message_count``, events (Geode default: 230,000).
        wait_ms: ``maximum_queue_full_wait_ms``, the longest hold, in ms.
        disconnect_unresponsive: ``disconnect_unresponsive_clients``: end a hold that
            lasted its whole wait by disconnecting the clients still over the capacity,
            instead of letting the queue grow.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        acks: QueueAcks,
        stats: ServerStats,
        limit: int,
        wait_ms: int,
        disconnect_unresponsive: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._acks = acks
        self._stats = stats
        self._limit = limit
        self._wait_s = wait_ms / 1000
        self._disconnect = disconnect_unresponsive
        self._clock = clock
        self._holds: dict[QueueAccount, _Hold] = {}

    def __len__(self) -> int:
        return len(self._holds)

    def is_held(self, account: QueueAccount) -> bool:
        """Whether the events of this queue are held back now."""
        return account in self._holds

    def full(self, account: QueueAccount, whose: str) -> None:
        """Routing counted ``account`` at the capacity: hold it, unless it is held already
        or was let grow (:attr:`QueueAccount.overflowing`). ``whose`` names its client(s)
        in the log."""
        if account.overflowing or account in self._holds:
            return
        now = self._clock()
        self._holds[account] = _Hold(now + self._wait_s, whose, self._acks.ask_acks(account), now)

    def tick(self, *, over_budget: bool = False) -> HoldsEnded:
        """Look at each hold (at every turn of the server loop): end those whose ack read
        shows room, or whose wait has passed, or all of them when ``over_budget`` (the
        outbox parked more than :data:`PARKED_BYTES_MAX`). Never waits on Kafka."""
        ended = HoldsEnded()
        if not self._holds:
            return ended
        now = self._clock()
        for account, hold in list(self._holds.items()):
            if hold.read.done():
                hold.committed.update(hold.read.answers())
                # What is parked was not sent: the client cannot have acked it.
                sent = self._acks.take_acks(account, hold.committed) - account.parked
                if sent < self._limit:
                    self._end(account, hold, "has room again", ended)
                    continue
                if not hold.confirmed:
                    hold.confirmed = True
                    self._stats.queue_full_waits += 1
                    log.warning(
                        "subscription queues full (%d unacked events): %s; holding their "
                        "writers for up to %d ms",
                        self._limit,
                        hold.whose,
                        int(self._wait_s * 1000),
                    )
                if now - hold.asked_at >= HOLD_POLL_S:
                    hold.read, hold.asked_at = self._acks.ask_acks(account), now
            if now >= hold.deadline or over_budget:
                if over_budget:
                    log.warning(
                        "%d bytes of events parked for full queues: ending the hold of %s",
                        PARKED_BYTES_MAX,
                        hold.whose,
                    )
                self._expire(account, hold, ended)
        return ended

    def _end(self, account: QueueAccount, hold: _Hold, why: str, ended: HoldsEnded) -> None:
        del self._holds[account]
        ended.any = True
        if hold.confirmed:
            log.info("subscription queue of %s %s", hold.whose, why)

    def _expire(self, account: QueueAccount, hold: _Hold, ended: HoldsEnded) -> None:
        """The hold lasted its whole wait: let the queue grow, or disconnect the clients
        still over the capacity."""
        self._end(account, hold, "was held for its whole wait", ended)
        if not hold.confirmed:
            self._stats.queue_full_waits += 1
        if not self._disconnect:
            log.warning("queue of %s stays over its capacity: not waiting again", hold.whose)
            account.overflowing = True
            return
        if isinstance(account, SharedQueue):
            # The members whose own acks (as last read) leave them at the capacity; the
            # others stay in the group.
            late = {
                client_id
                for client_id, offset in hold.committed.items()
                if client_id in account.members and account.unacked_after(offset) >= self._limit
            }
            account.set_members(account.members - late)
        elif isinstance(account, ClientProxy):
            late = {account.client_id}
        else:
            late = set()
        for client_id in sorted(late):
            log.warning("disconnecting unresponsive client %s (queue full)", client_id)
            self._stats.clients_disconnected += 1
        ended.disconnected |= late

    def forget(self, account: QueueAccount) -> None:
        """Drop the hold of a queue that is gone (its client was forgotten)."""
        self._holds.pop(account, None)


__all__ = ["HOLD_POLL_S", "PARKED_BYTES_MAX", "HoldsEnded", "QueueHolds"]
