"""The outbox numbers every message it hands to the producer and says when every message
before a mark has its delivery report, whatever order the reports come in (reports of
different partitions are not ordered), so the server commits without a flush."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException

from regionbus.broker.outbox import Outbox
from regionbus.broker.stats import ServerStats
from regionbus.schemas.addressing import ClientAddress
from regionbus.schemas.codec import encode, split_batch
from regionbus.schemas.messages import Reply
from regionbus.schemas.naming import Topics


class _Producer:
    """Keeps each message's delivery callback, for the test to call in its own order, and
    its ``(topic, key, value)``."""

    def __init__(self) -> None:
        self.reports: list[Any] = []
        self.records: list[tuple[str, bytes | None, bytes]] = []
        self.gone: set[str] = set()

    def produce(
        self, topic: str, value: bytes, key: bytes | None, *, on_delivery: Any, **_kwargs: Any
    ) -> None:
        if topic in self.gone:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC))
        self.reports.append(on_delivery)
        self.records.append((topic, key, value))


class _ReplyTopics:
    """Every shared reply topic exists, with 16 partitions."""

    def partitions(self, _topic: str) -> int:
        return 16


class _Message:
    def topic(self) -> str:
        return "t.events"


def _outbox(producer: _Producer) -> Outbox:
    return Outbox(producer, Topics("t"), "m", ServerStats(), None)  # type: ignore[arg-type]


def _two_producers() -> tuple[_Producer, _Producer, Outbox]:
    """The server's two producers (replies and queues; events) and an outbox over them."""
    producer, events_producer = _Producer(), _Producer()
    outbox = Outbox(
        producer,  # type: ignore[arg-type]
        Topics("t"),
        "m",
        ServerStats(),
        _ReplyTopics(),  # type: ignore[arg-type]
        events_producer=events_producer,  # type: ignore[arg-type]
    )
    return producer, events_producer, outbox


def test_a_mark_is_settled_only_when_every_message_before_it_has_its_report() -> None:
    producer = _Producer()
    outbox = _outbox(producer)
    for _ in range(3):
        outbox.produce("t.events", b"v", None, partition=0)
    mark = outbox.mark()
    outbox.produce("t.events", b"later", None, partition=1)
    assert not outbox.settled(mark)

    producer.reports[2](None, _Message())
    producer.reports[3](None, _Message())  # after the mark: does not count for it
    producer.reports[0](None, _Message())
    assert not outbox.settled(mark)

    producer.reports[1](None, _Message())
    assert outbox.settled(mark)
    assert outbox.settled(outbox.mark())


def test_a_failed_delivery_settles_its_message_and_is_counted() -> None:
    producer = _Producer()
    outbox = _outbox(producer)
    outbox.produce("t.events", b"v", None)
    producer.reports[0](KafkaError(KafkaError._MSG_TIMED_OUT), _Message())
    assert outbox.settled(outbox.mark())
    assert outbox.delivery_failures == 1


def test_a_message_the_producer_refused_at_once_is_settled() -> None:
    producer = _Producer()
    producer.gone.add("t.gone")
    outbox = _outbox(producer)
    outbox.produce("t.gone", b"v", None)
    assert outbox.settled(outbox.mark())
    assert outbox.delivery_failures == 1


def test_events_go_on_their_own_producer_and_a_mark_waits_for_both_producers() -> None:
    producer, events_producer, outbox = _two_producers()
    outbox.produce("t.events", b"event", None, partition=3)
    outbox.produce("t.dead-letter", b"other", None)
    mark = outbox.mark()
    assert len(events_producer.reports) == 1
    assert len(producer.reports) == 1
    assert outbox.producers == (producer, events_producer)

    producer.reports[0](None, _Message())
    assert not outbox.settled(mark)  # the event's report is still missing
    events_producer.reports[0](KafkaError(KafkaError._MSG_TIMED_OUT), _Message())
    assert outbox.settled(mark)
    assert outbox.delivery_failures == 1  # counted, so the offsets rewind


def test_pages_of_initial_results_go_by_the_lingering_producer_apart_from_other_replies() -> None:
    # A storm of registrations sends megabytes of pages; a bystander's put reply must not
    # queue behind them in the producer of the replies clients wait for.
    producer, events_producer, outbox = _two_producers()
    page = [Reply(1, 0, ok=True, more=True), Reply(1, 0, ok=True)]
    put, other = Reply(2, 5, ok=True), Reply(3, 5, ok=True)
    a, b = ClientAddress("A", None), ClientAddress("B", None)
    outbox.reply(page[0], a, bulk=True)
    outbox.reply(put, b)
    outbox.reply(other, a)
    outbox.reply(page[1], a, bulk=True)
    outbox.send()
    replies = "t.replies"
    assert [(t, k, split_batch(v)) for t, k, v in events_producer.records] == [
        (replies, b"A", [encode(page[0]), encode(page[1])])
    ]
    assert [(t, k, split_batch(v)) for t, k, v in producer.records] == [
        (replies, b"B", [encode(put)]),
        (replies, b"A", [encode(other)]),
    ]
