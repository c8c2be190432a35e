"""How often an acked queue is trimmed, and never past its acked offsets (without Kafka;
the deletion itself is proven on Kafka by tests/integration/test_queue_trim.py)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from regionbus.gateways import queue_trim
from regionbus.gateways.queue_trim import QueueTrimmer


class _Admin:
    """Records each DeleteRecords as ``[(partition, offset), ...]``; answers at once."""

    def __init__(self) -> None:
        self.requests: list[list[tuple[int, int]]] = []
        self.fail = False

    def delete_records(self, partitions: list[Any], **_: Any) -> dict[Any, Future[Any]]:
        self.requests.append([(tp.partition, tp.offset) for tp in partitions])
        answers: dict[Any, Future[Any]] = {}
        for tp in partitions:
            future: Future[Any] = Future()
            if self.fail:
                future.set_exception(KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT)))
            else:
                future.set_result(None)
            answers[tp] = future
        return answers


class _Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> _Admin:
    fake = _Admin()
    monkeypatch.setattr(queue_trim, "kafka_admin", lambda _config: fake)
    return fake


def test_each_partition_is_trimmed_at_most_once_per_interval_up_to_its_last_ack(
    admin: _Admin,
) -> None:
    clock = _Clock()
    trimmer = QueueTrimmer({}, "ns.gw.to-b", interval_s=1.0, clock=clock)

    trimmer.acked({0: 10, 1: 4})
    clock.now += 0.5
    trimmer.acked({0: 20})  # inside the interval: waits
    trimmer.trim()
    clock.now += 0.5
    trimmer.trim()  # the interval has passed: the latest ack of partition 0 only
    clock.now += 5.0
    trimmer.trim()  # nothing acked since: nothing sent

    assert admin.requests == [[(0, 10), (1, 4)], [(0, 20)]]


def test_a_failed_deletion_is_counted_and_tried_again_after_the_interval(admin: _Admin) -> None:
    clock = _Clock()
    trimmer = QueueTrimmer({}, "ns.aeq.audit", interval_s=1.0, clock=clock)
    admin.fail = True

    trimmer.acked({0: 7})
    admin.fail = False
    trimmer.trim()
    clock.now += 1.0
    trimmer.trim()

    assert trimmer.failures == 1
    assert admin.requests == [[(0, 7)], [(0, 7)]]
