"""The outbox numbers every message it hands to the producer and says when every message
before a mark has its delivery report, whatever order the reports come in (reports of
different partitions are not ordered), so the server commits without a flush."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException

from regionbus.broker.outbox import Outbox
from regionbus.broker.stats import ServerStats
from regionbus.schemas.naming import Topics


class _Producer:
    """Keeps each message's delivery callback, for the test to call in its own order."""

    def __init__(self) -> None:
        self.reports: list[Any] = []
        self.gone: set[str] = set()

    def produce(self, topic: str, *_args: Any, on_delivery: Any, **_kwargs: Any) -> None:
        if topic in self.gone:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC))
        self.reports.append(on_delivery)


class _Message:
    def topic(self) -> str:
        return "t.events"


def _outbox(producer: _Producer) -> Outbox:
    return Outbox(producer, Topics("t"), "m", ServerStats(), None)  # type: ignore[arg-type]


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
    producer, events_producer = _Producer(), _Producer()
    outbox = Outbox(
        producer,  # type: ignore[arg-type]
        Topics("t"),
        "m",
        ServerStats(),
        None,  # type: ignore[arg-type]
        events_producer=events_producer,  # type: ignore[arg-type]
    )
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
