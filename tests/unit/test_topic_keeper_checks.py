"""When the topic keeper looks at the server's topics, and what it reports, without Kafka
(the recreation itself is proven on Kafka by tests/integration/test_topic_keeper.py)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from regionbus.broker.topic_keeper import MIN_CHECK_GAP_S, TopicKeeper
from regionbus.schemas.topics import TopicSpec


class _Description:
    def __init__(self, topic_id: str) -> None:
        self.topic_id = topic_id


class _Admin:
    """Answers describe_topics from ``ids``; ``down`` makes every answer a timeout."""

    def __init__(self, ids: dict[str, str]) -> None:
        self.ids = ids
        self.down = False
        self.silent = False
        self.describes = 0

    def describe_topics(self, topics: Any, **_: Any) -> dict[str, Future[Any]]:
        self.describes += 1
        answers: dict[str, Future[Any]] = {}
        for name in topics.topic_names:
            future: Future[Any] = Future()
            if self.silent:
                pass  # never answered
            elif self.down:
                future.set_exception(KafkaException(KafkaError(KafkaError._TIMED_OUT)))
            else:
                future.set_result(_Description(self.ids[name]))
            answers[name] = future
        return answers


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _keeper(admin: _Admin, clock: _Clock) -> TopicKeeper:
    """A keeper that has looked once (and noted the ids), with its next check 1 s away."""
    keeper = TopicKeeper(
        admin,  # type: ignore[arg-type]
        [TopicSpec("ns.ops", 16), TopicSpec("ns.events", 16)],
        check_interval_s=1.0,
        clock=clock,
    )
    clock.now += 1.0
    assert _check(keeper) == []
    admin.describes = 0
    return keeper


def _check(keeper: TopicKeeper) -> list[str]:
    """One call asks (never waiting); the next one reads the answer, here already in."""
    assert keeper.keep() == []
    return keeper.keep()


def test_a_topic_with_a_new_id_is_reported_once_at_the_next_check() -> None:
    admin, clock = _Admin({"ns.ops": "a", "ns.events": "b"}), _Clock()
    keeper = _keeper(admin, clock)
    admin.ids["ns.ops"] = "a2"

    early = _check(keeper)
    clock.now += 1.0
    due = _check(keeper)
    clock.now += 1.0
    again = _check(keeper)

    assert (early, due, again) == ([], ["ns.ops"], [])
    assert admin.describes == 2


def test_an_error_naming_a_kept_topic_brings_the_check_forward_within_bounds() -> None:
    admin, clock = _Admin({"ns.ops": "a", "ns.events": "b"}), _Clock()
    keeper = _keeper(admin, clock)

    start = clock.now
    assert not keeper.suspect("ns.queue.c1")
    assert keeper.suspect("ns.events")
    clock.now = start + MIN_CHECK_GAP_S / 2
    assert keeper.keep() == [] and admin.describes == 0
    clock.now = start + MIN_CHECK_GAP_S
    keeper.keep()
    assert admin.describes == 1
    keeper.suspect("ns.events")
    keeper.keep()
    assert admin.describes == 1  # not again before the gap has passed


def test_a_cluster_that_does_not_answer_is_asked_again_and_nothing_is_raised() -> None:
    admin, clock = _Admin({"ns.ops": "a", "ns.events": "b"}), _Clock()
    keeper = _keeper(admin, clock)
    admin.down = True

    clock.now += 1.0
    assert _check(keeper) == []
    admin.down = False
    admin.ids["ns.events"] = "b2"
    clock.now += 1.0

    assert _check(keeper) == ["ns.events"]


def test_the_server_loop_never_waits_for_an_answer_and_a_lost_one_is_asked_again() -> None:
    admin, clock = _Admin({"ns.ops": "a", "ns.events": "b"}), _Clock()
    keeper = TopicKeeper(
        admin,  # type: ignore[arg-type]
        [TopicSpec("ns.ops", 16)],
        check_interval_s=1.0,
        timeout_s=5.0,
        clock=clock,
    )
    admin.silent = True

    clock.now += 1.0
    answers = [keeper.keep() for _ in range(3)]
    clock.now += 6.0
    gave_up = keeper.keep()
    asked_again = keeper.keep()

    assert answers == [[], [], []] and gave_up == [] and asked_again == []
    assert admin.describes == 2
