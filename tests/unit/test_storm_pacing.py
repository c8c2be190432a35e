"""The rules that pace a storm: a token bucket for connects, a fair queue, initial results
that take a bounded share of each loop turn, a page at a time, to the end, and clients
that try again after a random wait."""

from __future__ import annotations

from typing import Any

import pytest

from regionbus.broker.config import ServerSettings
from regionbus.broker.initial_results import InitialResults, PagedLoad, WholeLoad
from regionbus.broker.pacing import ConnectAdmission, FairQueue, TokenBucket
from regionbus.clients.resend import CONNECT_RESEND_CAP_S, CONNECT_RESEND_FIRST_S, full_jitter_s
from regionbus.schemas.messages import Control, ControlKind, Entry, Operation, OperationKind, Reply

# --- the token bucket ------------------------------------------------------------------


def test_a_token_bucket_admits_its_burst_then_its_rate() -> None:
    bucket = TokenBucket(rate_per_s=100, burst=5, now_s=10.0)
    assert [bucket.take(10.0) for _ in range(6)] == [True] * 5 + [False]
    assert bucket.take(10.005) is False, "half a token is no token"
    assert bucket.take(10.02) is True, "a token and a half"
    assert bucket.take(10.02) is False
    # A long quiet time fills it to its burst, no further.
    assert sum(bucket.take(100.0) for _ in range(50)) == 5


def test_a_token_bucket_is_not_refilled_by_a_clock_going_back() -> None:
    bucket = TokenBucket(rate_per_s=100, burst=1, now_s=10.0)
    assert bucket.take(10.0)
    assert not bucket.take(9.0)
    assert not bucket.take(10.0)


@pytest.mark.parametrize(("rate_per_s", "burst"), [(0, 1), (-1, 1), (1, 0)])
def test_a_token_bucket_refuses_a_rate_or_burst_that_admits_nothing(
    rate_per_s: float, burst: int
) -> None:
    with pytest.raises(ValueError, match="token bucket"):
        TokenBucket(rate_per_s, burst, 0.0)


# --- the fair queue --------------------------------------------------------------------


def test_a_fair_queue_is_first_in_first_out_for_owners_below_their_share() -> None:
    queue: FairQueue[str] = FairQueue()
    for item in ("a1", "b1", "a2", "c1"):
        queue.push(item[0], item)
    assert [queue.pop(lambda _: False) for _ in range(5)] == ["a1", "b1", "a2", "c1", None]


def test_an_owner_at_its_share_lets_the_others_go_first() -> None:
    queue: FairQueue[str] = FairQueue()
    for item in ("a1", "a2", "a3", "b1"):
        queue.push(item[0], item)
    assert queue.pop(lambda owner: owner == "a") == "b1"
    assert queue.pop(lambda owner: owner == "a") is None
    assert queue.pop(lambda _: False) == "a1"
    assert len(queue) == 2


def test_a_fair_queue_removes_one_owners_matching_items_only() -> None:
    queue: FairQueue[str] = FairQueue()
    for item in ("a1", "b1", "a2", "a3"):
        queue.push(item[0], item)
    assert queue.remove("a", lambda item: item != "a2") == ["a1", "a3"]
    assert queue.remove("c", lambda _: True) == []
    assert [queue.pop(lambda _: False) for _ in range(3)] == ["b1", "a2", None]


# --- connect admission -----------------------------------------------------------------


def _connect(n: int) -> Control:
    return Control(ControlKind.CONNECT, f"c{n}", 0, request_id=n)


def test_connects_past_the_burst_wait_for_the_rate_in_arrival_order() -> None:
    now = [0.0]
    admitted: list[int] = []
    connects = ConnectAdmission(
        lambda c: admitted.append(c.request_id), 100, 3, 1000, clock_s=lambda: now[0]
    )
    for n in range(10):
        connects.connect(_connect(n))
    assert admitted == [0, 1, 2] and len(connects) == 7
    assert connects.admit_due() == 0
    now[0] = 0.02
    assert connects.admit_due() == 2
    now[0] = 1.0
    assert connects.admit_due() == 3, "a turn admits at most the burst"
    assert admitted == list(range(8))


def test_a_connect_arriving_while_others_wait_queues_behind_them() -> None:
    now = [0.0]
    admitted: list[int] = []
    connects = ConnectAdmission(
        lambda c: admitted.append(c.request_id), 100, 1, 1000, clock_s=lambda: now[0]
    )
    connects.connect(_connect(0))
    connects.connect(_connect(1))
    now[0] = 1.0
    connects.connect(_connect(2))
    assert admitted == [0], "a token free now goes to the connect that waited longest"
    connects.admit_due()
    assert admitted == [0, 1]


def test_past_the_queue_bound_the_oldest_waiting_connects_are_dropped() -> None:
    admitted: list[int] = []
    connects = ConnectAdmission(
        lambda c: admitted.append(c.request_id), 1, 1, 3, clock_s=lambda: 0.0
    )
    for n in range(6):
        connects.connect(_connect(n))
    assert len(connects) == 3 and connects.dropped == 2


# --- initial results -------------------------------------------------------------------


class _Pages:
    """A bucket of ``size`` entries read as a cursor's pages, each taking ``cost_s``."""

    def __init__(self, size: int, clock: list[float], cost_s: float) -> None:
        self.size = size
        self.clock = clock
        self.cost_s = cost_s
        self.reads: list[tuple[str, int]] = []

    def scan_page(
        self, region: str, bucket: int, cursor: int, count: int, *_: Any
    ) -> tuple[int, list[Entry]]:
        self.clock[0] += self.cost_s
        self.reads.append((region, bucket))
        end = min(self.size, cursor + count)
        entries = [Entry(f"k{i}", i, b"v") for i in range(cursor, end)]
        return (0 if end == self.size else end), entries


class _Replies:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Reply]] = []
        self.bulk: list[bool] = []

    def reply(self, reply: Reply, to: Any, *, bulk: bool = False) -> None:
        self.sent.append((to.client_id, reply))
        self.bulk.append(bulk)


class _Owned:
    def __init__(self, buckets: set[int]) -> None:
        self.owned = dict.fromkeys(buckets, 1)


def _loads(
    size: int = 25, cost_s: float = 0.004, **settings: Any
) -> tuple[InitialResults, _Pages, _Replies, _Owned, list[float]]:
    clock = [0.0]
    pages = _Pages(size, clock, cost_s)
    replies = _Replies()
    owned = _Owned(set(range(16)))
    server = ServerSettings(
        initial_results_budget_ms=20,
        initial_results_running_max=4,
        initial_results_page_entries=10,
        **settings,
    )
    loads = InitialResults(server, pages, owned, replies, clock_s=lambda: clock[0])  # type: ignore[arg-type]
    return loads, pages, replies, owned, clock


def _registration(client_id: str, bucket: int, version: int = 7) -> PagedLoad:
    op = Operation(1, client_id, OperationKind.REGISTER_INTEREST, "big", 0)
    return PagedLoad(op, bucket, version, with_values=True)


def test_a_load_is_sent_a_page_at_a_time_and_ends_with_the_registration_version() -> None:
    loads, _, replies, _, _ = _loads(size=25)
    loads.add(_registration("a", 3, version=42))
    while loads.run():
        pass
    answer = [reply for _, reply in replies.sent]
    assert [len(r.entries) for r in answer] == [10, 10, 5]
    assert [r.more for r in answer] == [True, True, False]
    assert [r.version for r in answer] == [None, None, 42]
    assert {e.key for r in answer for e in r.entries} == {f"k{i}" for i in range(25)}
    assert loads.pending == 0
    assert replies.bulk == [True, True, True]  # by the lingering producer, all of them


def test_an_empty_bucket_still_ends_its_answer() -> None:
    loads, _, replies, _, _ = _loads(size=0)
    loads.add(_registration("a", 0))
    assert loads.run()
    assert [(r.entries, r.more, r.version) for _, r in replies.sent] == [((), False, 7)]


def test_a_turn_stops_once_its_budget_is_spent() -> None:
    loads, pages, _, _, _ = _loads(size=1000, cost_s=0.004)
    for bucket in range(4):
        loads.add(_registration("a", bucket))
        loads.add(_registration("b", bucket))
    loads.run()
    # 20 ms at 4 ms a page: 5 pages, never a whole bucket of 100 pages.
    assert len(pages.reads) == 5
    assert loads.pending == 8


def test_over_time_loads_take_at_most_their_share_of_the_loop() -> None:
    # The budget bounds one turn; the share bounds the rate a storm drives the producer,
    # Kafka and the registering clients at, which on shared cores others wait behind.
    loads, pages, _, _, clock = _loads(size=1000, cost_s=0.004, initial_results_share=0.25)
    assert loads.poll_s(0.1) == 0.1, "nothing pending: the loop polls its whole timeout"
    loads.add(_registration("a", 0))
    assert loads.poll_s(0.1) == 0.0, "pages to send: the poll does not idle"
    assert loads.run()
    assert len(pages.reads) == 5  # 20 ms
    # 20 ms at a share of a quarter: the next run may start 60 ms later, not before.
    assert loads.poll_s(0.1) == pytest.approx(0.060)
    assert loads.poll_s(0.01) == 0.01, "never past the loop's own poll timeout"
    clock[0] += 0.059
    assert not loads.run()
    assert len(pages.reads) == 5
    clock[0] += 0.001
    assert loads.run()
    assert len(pages.reads) == 10


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_a_share_that_sends_nothing_or_more_than_the_loop_is_refused(share: float) -> None:
    assert ServerSettings(initial_results_share=1.0).initial_results_share == 1.0
    with pytest.raises(ValueError, match="initial_results_share"):
        ServerSettings(initial_results_share=share)


def test_loads_run_a_bounded_number_at_once_and_a_client_at_most_half() -> None:
    loads, _, replies, _, _ = _loads(size=1000, cost_s=0.001)
    for bucket in range(4):
        loads.add(_registration("a", bucket))
    loads.add(_registration("b", 0))
    loads.add(_registration("c", 0))
    loads.run()
    answered = {(client, reply.bucket) for client, reply in replies.sent}
    # Four at once, "a" (first in) with two of them: "b" and "c" need not wait for it.
    assert answered == {("a", 0), ("a", 1), ("b", 0), ("c", 0)}


def test_a_load_of_a_bucket_lost_is_dropped_and_a_disconnected_clients_are_forgotten() -> None:
    loads, pages, replies, owned, _ = _loads(size=1000, cost_s=0.0)
    loads.add(_registration("a", 1))
    loads.add(_registration("a", 2))
    loads.add(_registration("b", 2))
    del owned.owned[1]
    assert loads.drop("b", 2) == 1
    pages.cost_s = 0.001
    loads.run()
    assert {bucket for _, bucket in pages.reads} == {2}
    assert {client for client, _ in replies.sent} == {"a"}


def test_a_whole_load_runs_once_at_its_turn() -> None:
    loads, _, _, _, _ = _loads()
    ran: list[str] = []
    op = Operation(1, "a", OperationKind.EXECUTE_CQ, "big", 0)
    loads.add(WholeLoad(op, 0, lambda: ran.append("cq")))
    assert loads.run() and not loads.run()
    assert ran == ["cq"]


# --- clients back off with jitter ------------------------------------------------------


def test_a_wait_is_anywhere_up_to_a_ceiling_that_doubles_to_its_cap() -> None:
    ceilings = [full_jitter_s(n, 2.0, 16.0, uniform=lambda low, high: high) for n in range(6)]
    assert ceilings == [2.0, 4.0, 8.0, 16.0, 16.0, 16.0]
    assert full_jitter_s(3, 2.0, 16.0, uniform=lambda low, high: low) == 0.0
    assert full_jitter_s(10_000, 2.0, 16.0, uniform=lambda low, high: high) == 16.0


def test_a_fleet_that_lost_its_servers_together_does_not_come_back_in_step() -> None:
    waits = [full_jitter_s(0, CONNECT_RESEND_FIRST_S, CONNECT_RESEND_CAP_S) for _ in range(1000)]
    assert all(0 <= w <= CONNECT_RESEND_FIRST_S for w in waits)
    # Spread over the whole window: no tenth of it holds more than a fifth of the fleet.
    tenths = [0] * 10
    for w in waits:
        tenths[min(9, int(w / CONNECT_RESEND_FIRST_S * 10))] += 1
    assert max(tenths) < 200
