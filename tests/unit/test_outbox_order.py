"""A client's events reach its partition in the order they were queued, whether they go in
its own records or in those of the groups it is in: queuing for one address closes the
open runs of the other addresses that share a client with it (the fleet issue's
per-bucket order; a later event read first would make the message tracker drop the earlier
one as a duplicate). Runs of addresses that share no client keep gathering, so batching
stays as it was."""

from __future__ import annotations

from typing import Any

from regionbus.broker.client_proxy import ClientProxy, SharedQueue
from regionbus.broker.outbox import Outbox
from regionbus.broker.queue_runs import Recipients
from regionbus.broker.stats import ServerStats
from regionbus.schemas.codec import encode, split_batch
from regionbus.schemas.messages import Marker
from regionbus.schemas.naming import Topics

_TOPIC = "t.queues"


class _Producer:
    """Keeps what is produced: ``(key, [framed messages])`` and the delivery callback."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, list[bytes]]] = []
        self.reports: list[Any] = []

    def produce(
        self, topic: str, value: bytes, key: bytes, *, on_delivery: Any, **_kwargs: Any
    ) -> None:
        self.records.append((key, split_batch(value)))
        self.reports.append(on_delivery)


class _Delivered:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset


def _event(name: str) -> bytes:
    """A framed message told apart by ``name`` (the outbox only batches what it is given)."""
    return encode(Marker(client_id=name, timestamp_ms=0))


def _setup() -> tuple[_Producer, Outbox, dict[str, ClientProxy]]:
    producer = _Producer()
    outbox = Outbox(producer, Topics("t"), "m", ServerStats(), None)  # type: ignore[arg-type]
    proxies = {c: ClientProxy(c, None, _TOPIC, 0) for c in "ABCD"}
    return producer, outbox, proxies


def _group(*members: str) -> Recipients:
    ids = frozenset(members)
    return Recipients(
        _TOPIC, 0, b"\x00" + "".join(members).encode(), ids, SharedQueue((), _TOPIC, 0)
    )


def test_an_event_for_a_group_between_two_of_a_members_own_closes_its_run() -> None:
    producer, outbox, proxies = _setup()
    group = _group("A", "B")
    outbox.queue(proxies["A"], _event("a1"))
    outbox.queue_shared(group, _event("g2"))
    outbox.queue(proxies["A"], _event("a3"))
    outbox.send()
    assert producer.records == [
        (b"A", [_event("a1")]),
        (group.key, [_event("g2")]),
        (b"A", [_event("a3")]),
    ]


def test_runs_of_addresses_without_a_common_client_keep_gathering() -> None:
    producer, outbox, proxies = _setup()
    ab, cd = _group("A", "B"), _group("C", "D")
    outbox.queue(proxies["A"], _event("a1"))
    outbox.queue(proxies["B"], _event("b1"))
    outbox.queue(proxies["A"], _event("a2"))
    outbox.queue_shared(cd, _event("cd1"))
    outbox.queue_shared(ab, _event("ab1"))
    outbox.queue_shared(cd, _event("cd2"))
    outbox.queue(proxies["C"], _event("c3"))
    outbox.send()
    assert producer.records == [
        (b"A", [_event("a1"), _event("a2")]),
        (b"B", [_event("b1")]),
        (cd.key, [_event("cd1"), _event("cd2")]),
        (ab.key, [_event("ab1")]),
        (b"C", [_event("c3")]),
    ]


def test_two_groups_sharing_a_member_alternate_runs() -> None:
    producer, outbox, _ = _setup()
    ab, bc = _group("A", "B"), _group("B", "C")
    for name, group in (("1", ab), ("2", bc), ("3", ab)):
        outbox.queue_shared(group, _event(name))
    outbox.send()
    assert [key for key, _ in producer.records] == [ab.key, bc.key, ab.key]


def test_each_run_tells_its_account_how_many_events_it_had_queued_through_it() -> None:
    producer, outbox, proxies = _setup()
    group = _group("A", "B")
    a = proxies["A"]
    outbox.queue(a, _event("a1"))
    outbox.queue(a, _event("a2"))
    outbox.queue_shared(group, _event("g"))
    outbox.queue(a, _event("a3"))
    outbox.send()
    for offset, report in enumerate(producer.reports):
        report(None, _Delivered(offset))
    assert list(a.marks) == [(0, 2), (2, 3)]
    assert list(group.queue.marks) == [(1, 1)]
    a.acked_below(1)
    assert a.depth == 1
