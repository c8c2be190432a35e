"""How many partitions a shared client topic has: asked of Kafka once, remembered, bounded,
re-asked when absent."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaException

from regionbus.broker import client_topics
from regionbus.broker.client_topics import ClientTopicPartitions


class _Metadata:
    """Stands in for AdminClient.list_topics: answers from existing topics' partitions."""

    def __init__(self, existing: dict[str, int]) -> None:
        self.existing = existing
        self.asked: list[str] = []
        self.fail = False

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.asked.append(topic)
        if self.fail:
            raise KafkaException("broker down")
        if topic in self.existing:
            partitions = {p: object() for p in range(self.existing[topic])}
            found = SimpleNamespace(error=None, partitions=partitions)
        else:
            found = SimpleNamespace(error="UNKNOWN_TOPIC_OR_PART", partitions={})
        return SimpleNamespace(topics={topic: found})


def test_a_present_topic_is_asked_once_and_believed_until_forgotten() -> None:
    metadata = _Metadata({"ns.replies.a": 16})
    known = ClientTopicPartitions(metadata)  # type: ignore[arg-type]
    assert known.partitions("ns.replies.a") == 16
    assert known.exists("ns.replies.a")
    assert metadata.asked == ["ns.replies.a"]
    known.forget("ns.replies.a")
    metadata.existing.clear()
    assert not known.exists("ns.replies.a")


def test_an_absent_topic_is_asked_again_after_the_recheck_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(client_topics.time, "monotonic", lambda: now[0])
    metadata = _Metadata({})
    known = ClientTopicPartitions(metadata, absent_recheck_s=5.0)  # type: ignore[arg-type]
    assert known.partitions("ns.replies.late") == 0
    now[0] += 4.9
    assert known.partitions("ns.replies.late") == 0
    assert metadata.asked == ["ns.replies.late"]
    metadata.existing["ns.replies.late"] = 4
    now[0] += 0.2
    assert known.partitions("ns.replies.late") == 4
    assert metadata.asked == ["ns.replies.late", "ns.replies.late"]


def test_forged_principals_cannot_grow_the_cache_past_its_bound() -> None:
    known = ClientTopicPartitions(_Metadata({}), max_entries=10)  # type: ignore[arg-type]
    for i in range(1000):
        known.exists(f"ns.replies.forged-{i}")
    assert len(known) == 10


def test_a_failed_metadata_request_is_not_remembered_and_a_noted_count_needs_no_request() -> None:
    metadata = _Metadata({"ns.replies.a": 3})
    metadata.fail = True
    known = ClientTopicPartitions(metadata)  # type: ignore[arg-type]
    assert known.partitions("ns.replies.a") == 0
    metadata.fail = False
    assert known.partitions("ns.replies.a") == 3
    known.note("ns.replies", 16)
    assert known.partitions("ns.replies") == 16
    assert metadata.asked == ["ns.replies.a", "ns.replies.a"]
