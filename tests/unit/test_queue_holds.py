"""A full queue's hold: counted once an ack read finds it full, ended by room or by its
wait (the queue then grows, or its client is disconnected), never waiting on Kafka."""

from __future__ import annotations

from typing import Any

from regionbus.broker.client_proxy import ClientProxy, QueueAccount
from regionbus.broker.queue_holds import QueueHolds
from regionbus.broker.stats import ServerStats


class _Read:
    """Answered once the test sets the acks' answer."""

    def __init__(self, acks: _Acks) -> None:
        self._proxies = acks

    def done(self) -> bool:
        return self._proxies.answer is not None

    def answers(self, timeout_s: float = 0.0) -> dict[str, int]:
        return self._proxies.answer or {}


class _Acks:
    """Answers ack reads with what the test sets (None: not answered yet)."""

    def __init__(self) -> None:
        self.answer: dict[str, int] | None = None
        self.depth_after: int = 0
        self.asked = 0

    def ask_acks(self, _account: QueueAccount) -> _Read:
        self.asked += 1
        return _Read(self)

    def take_acks(self, _account: QueueAccount, _committed: dict[str, int]) -> int:
        return self.depth_after


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _holds(acks: _Acks, clock: _Clock, disconnect: bool = False) -> QueueHolds:
    anything: Any = acks
    return QueueHolds(anything, ServerStats(), 20, 5_000, disconnect, clock)


def test_a_hold_is_counted_when_a_read_finds_the_queue_full_and_ends_when_it_has_room() -> None:
    acks, clock = _Acks(), _Clock()
    holds = _holds(acks, clock)
    proxy = ClientProxy("A", None, "t.queues", 0)
    holds.full(proxy, "A")
    assert holds.is_held(proxy)
    assert not holds.tick().any, "no answer yet: still held"

    acks.answer, acks.depth_after = {"A": 5}, 20
    clock.now += 0.1
    assert not holds.tick().any
    assert holds._stats.queue_full_waits == 1

    acks.depth_after = 19
    ended = holds.tick()
    assert ended.any and not ended.disconnected
    assert not holds.is_held(proxy) and not proxy.overflowing


def test_a_hold_that_lasts_its_wait_lets_the_queue_grow() -> None:
    acks, clock = _Acks(), _Clock()
    holds = _holds(acks, clock)
    proxy = ClientProxy("A", None, "t.queues", 0)
    holds.full(proxy, "A")
    clock.now += 5.0
    ended = holds.tick()
    assert ended.any and proxy.overflowing
    assert holds._stats.queue_full_waits == 1
    holds.full(proxy, "A")
    assert not holds.is_held(proxy), "a queue let grow is not held again"


def test_a_hold_that_lasts_its_wait_disconnects_when_the_operator_chose_so() -> None:
    acks, clock = _Acks(), _Clock()
    holds = _holds(acks, clock, disconnect=True)
    proxy = ClientProxy("A", None, "t.queues", 0)
    holds.full(proxy, "A")
    clock.now += 5.0
    ended = holds.tick()
    assert ended.disconnected == {"A"}
    assert holds._stats.clients_disconnected == 1


def test_every_hold_ends_at_once_over_the_parked_budget() -> None:
    acks, clock = _Acks(), _Clock()
    holds = _holds(acks, clock)
    accounts = [ClientProxy(c, None, "t.queues", 0) for c in "ABC"]
    for account in accounts:
        holds.full(account, account.client_id)
    assert holds.tick(over_budget=True).any
    assert len(holds) == 0 and all(a.overflowing for a in accounts)


def test_a_hold_ends_once_what_was_sent_is_acked_however_much_is_parked() -> None:
    acks, clock = _Acks(), _Clock()
    holds = _holds(acks, clock)
    proxy = ClientProxy("A", None, "t.queues", 0)
    holds.full(proxy, "A")
    proxy.parked = 30  # held back in the outbox: its client cannot ack them
    acks.answer, acks.depth_after = {"A": 5}, 40
    assert holds.tick().any, "10 sent events unacked, under the capacity of 20"
