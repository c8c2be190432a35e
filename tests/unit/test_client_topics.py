"""Which reply topics exist: asked of Kafka once, remembered, bounded, re-asked when absent."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaException

from regionbus.broker import client_topics
from regionbus.broker.client_topics import ClientTopicPresence


class _Metadata:
    """Stands in for AdminClient.list_topics: answers from a set of existing topics."""

    def __init__(self, existing: set[str]) -> None:
        self.existing = existing
        self.asked: list[str] = []
        self.fail = False

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.asked.append(topic)
        if self.fail:
            raise KafkaException("broker down")
        if topic in self.existing:
            found = SimpleNamespace(error=None, partitions={0: object()})
        else:
            found = SimpleNamespace(error="UNKNOWN_TOPIC_OR_PART", partitions={})
        return SimpleNamespace(topics={topic: found})


def test_a_present_topic_is_asked_once_and_believed_until_forgotten() -> None:
    metadata = _Metadata({"ns.reply.a"})
    presence = ClientTopicPresence(metadata)  # type: ignore[arg-type]
    assert presence.exists("ns.reply.a")
    assert presence.exists("ns.reply.a")
    assert metadata.asked == ["ns.reply.a"]
    presence.forget("ns.reply.a")
    metadata.existing.clear()
    assert not presence.exists("ns.reply.a")


def test_an_absent_topic_is_asked_again_after_the_recheck_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(client_topics.time, "monotonic", lambda: now[0])
    metadata = _Metadata(set())
    presence = ClientTopicPresence(metadata, absent_recheck_s=5.0)  # type: ignore[arg-type]
    assert not presence.exists("ns.reply.late")
    now[0] += 4.9
    assert not presence.exists("ns.reply.late")
    assert metadata.asked == ["ns.reply.late"]
    metadata.existing.add("ns.reply.late")
    now[0] += 0.2
    assert presence.exists("ns.reply.late")
    assert metadata.asked == ["ns.reply.late", "ns.reply.late"]


def test_forged_client_ids_cannot_grow_the_cache_past_its_bound() -> None:
    presence = ClientTopicPresence(_Metadata(set()), max_entries=10)  # type: ignore[arg-type]
    for i in range(1000):
        presence.exists(f"ns.reply.forged-{i}")
    assert len(presence) == 10


def test_a_failed_metadata_request_counts_as_present_and_is_not_remembered() -> None:
    metadata = _Metadata(set())
    metadata.fail = True
    presence = ClientTopicPresence(metadata)  # type: ignore[arg-type]
    assert presence.exists("ns.reply.a")
    metadata.fail = False
    assert not presence.exists("ns.reply.a")
