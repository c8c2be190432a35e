"""What goes to a held (full) queue waits in the outbox; nothing else does.

A run for a held queue is parked, and so is every later run for any of its clients (their
order holds) and the reply to each writer whose events it holds (the writer is held, as
a Geode put blocks on a full queue). Everything else is produced at once. A parked run
keeps the offsets from being committed past it until it is delivered; when its hold ends
it goes, in order; what was parked for a client disconnected as unresponsive is dropped.
"""

from __future__ import annotations

from typing import Any

from regionbus.broker.client_proxy import ClientProxy, QueueAccount, SharedQueue
from regionbus.broker.outbox import Outbox
from regionbus.broker.queue_runs import Recipients
from regionbus.broker.stats import ServerStats
from regionbus.schemas.addressing import ClientAddress
from regionbus.schemas.codec import encode, split_batch
from regionbus.schemas.messages import Marker, Operation, OperationKind, Reply
from regionbus.schemas.naming import Topics

_QUEUES = "t.queues"


class _Producer:
    """Keeps what is produced: ``(topic, key, [framed])`` and each delivery callback."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, list[bytes]]] = []
        self.reports: list[Any] = []

    def produce(
        self, topic: str, value: bytes, key: bytes, *, on_delivery: Any, **_kwargs: Any
    ) -> None:
        self.records.append((topic, key, split_batch(value)))
        self.reports.append(on_delivery)

    def deliver_all(self) -> None:
        reports, self.reports = self.reports, []
        for offset, report in enumerate(reports):
            report(None, _Delivered(offset))


class _Delivered:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset

    def topic(self) -> str:
        return _QUEUES


class _Holds:
    def __init__(self) -> None:
        self.held: set[QueueAccount] = set()

    def is_held(self, account: QueueAccount) -> bool:
        return account in self.held

    def __len__(self) -> int:
        return len(self.held)


class _Partitions:
    def partitions(self, _topic: str) -> int:
        return 4


def _event(name: str) -> bytes:
    return encode(Marker(client_id=name, timestamp_ms=0))


def _setup() -> tuple[_Producer, Outbox, _Holds, dict[str, ClientProxy]]:
    producer, holds = _Producer(), _Holds()
    outbox = Outbox(
        producer,  # type: ignore[arg-type]
        Topics("t"),
        "m",
        ServerStats(),
        _Partitions(),  # type: ignore[arg-type]
        holds=holds,  # type: ignore[arg-type]
    )
    return producer, outbox, holds, {c: ClientProxy(c, None, _QUEUES, 0) for c in "ABCW"}


def _reply(outbox: Outbox, client_id: str, request_id: int) -> None:
    outbox.reply(Reply(request_id=request_id, bucket=0, ok=True), ClientAddress(client_id, None))


def _sent(producer: _Producer) -> list[tuple[str, list[bytes]]]:
    """``(key or topic kind, framed)`` of each record, in order."""
    return [
        (key.decode() if topic == _QUEUES else f"reply:{key.decode()}", framed)
        for topic, key, framed in producer.records
    ]


def test_a_held_queue_holds_its_writer_and_no_one_else() -> None:
    producer, outbox, holds, proxies = _setup()
    holds.held.add(proxies["A"])
    outbox.queue(proxies["A"], _event("w1"), "W")
    outbox.queue(proxies["B"], _event("w1"), "W")
    outbox.queue(proxies["B"], _event("v1"), "V")
    _reply(outbox, "W", 1)
    _reply(outbox, "V", 2)
    outbox.send()
    assert [kind for kind, _ in _sent(producer)] == ["B", "reply:V"]
    assert proxies["A"].parked == 1 and proxies["B"].parked == 0

    mark = outbox.mark()
    producer.deliver_all()
    assert not outbox.settled(mark), "a parked run let the offsets past its operation"

    # A later event of A waits behind the parked one; B's go on.
    outbox.queue(proxies["A"], _event("v2"), "V")
    outbox.queue(proxies["B"], _event("v2"), "V")
    outbox.send()
    assert [kind for kind, _ in _sent(producer)][2:] == ["B"]

    holds.held.clear()
    assert outbox.release() == 3
    assert _sent(producer)[3:] == [
        ("A", [_event("w1")]),
        ("reply:W", [encode(Reply(request_id=1, bucket=0, ok=True))]),
        ("A", [_event("v2")]),
    ]
    assert not outbox.settled(mark), "released, not yet delivered"
    producer.deliver_all()
    assert outbox.settled(mark)
    assert outbox.parked_bytes == 0 and proxies["A"].parked == 0


def test_a_reply_gathered_before_its_writers_parked_event_still_waits_for_it() -> None:
    producer, outbox, holds, proxies = _setup()
    holds.held.add(proxies["A"])
    _reply(outbox, "W", 1)
    outbox.queue(proxies["A"], _event("w2"), "W")
    outbox.send()
    assert producer.records == []
    holds.held.clear()
    outbox.release()
    assert [kind for kind, _ in _sent(producer)] == ["reply:W", "A"]


def test_a_group_record_with_a_held_member_blocks_the_other_members_later_events() -> None:
    producer, outbox, holds, proxies = _setup()
    group_queue = SharedQueue((), _QUEUES, 0)
    group = Recipients(_QUEUES, 0, b"\x00AB", frozenset("AB"), group_queue)
    holds.held.add(group_queue)
    outbox.queue_shared(group, _event("g1"), "W")
    outbox.queue(proxies["B"], _event("b1"), "V")
    outbox.queue(proxies["C"], _event("c1"), "V")
    outbox.send()
    assert [kind for kind, _ in _sent(producer)] == ["C"]
    holds.held.clear()
    outbox.release()
    assert [kind for kind, _ in _sent(producer)] == ["C", "\x00AB", "B"]


def test_what_waited_for_a_disconnected_client_alone_is_dropped_and_settled() -> None:
    producer, outbox, holds, proxies = _setup()
    holds.held.add(proxies["A"])
    outbox.queue(proxies["A"], _event("w1"), "W")
    _reply(outbox, "W", 1)
    outbox.send()
    mark = outbox.mark()
    holds.held.clear()
    assert outbox.release({"A"}) == 2
    assert [kind for kind, _ in _sent(producer)] == ["reply:W"]
    producer.deliver_all()
    assert outbox.settled(mark)


def test_release_all_sends_what_is_still_held() -> None:
    producer, outbox, holds, proxies = _setup()
    holds.held.add(proxies["A"])
    outbox.queue(proxies["A"], _event("w1"), "W")
    outbox.send()
    outbox.release()
    assert producer.records == []
    outbox.release_all()
    assert [kind for kind, _ in _sent(producer)] == ["A"]


def test_a_reply_goes_to_the_reply_topic_of_its_requests_principal() -> None:
    # The principal is part of the address a reply is given: a handler that answered a
    # request of principal "desk" in the unscoped topic would leave that client waiting.
    producer, outbox, _, _ = _setup()
    op = Operation(
        request_id=3,
        client_id="A",
        kind=OperationKind.STOP_CQ,
        region="",
        timestamp_ms=0,
        kafka_principal="desk",
    )
    outbox.reply(Reply(request_id=3, bucket=0, ok=True), ClientAddress.of(op))
    outbox.reply(Reply(request_id=4, bucket=0, ok=True), ClientAddress("B", None))
    outbox.send()
    assert [(topic, key) for topic, key, _ in producer.records] == [
        ("t.replies.desk", b"A"),
        ("t.replies", b"B"),
    ]
