"""A topic creation the cluster never answers is a TransportError (unreachable), which the
callers retry, and not a bare TimeoutError that would stop a worker (a gateway sender whose
remote Kafka went away between its metadata answer and the creation did stop so)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

from regionbus.schemas.errors import TransportError
from regionbus.schemas.topics import TopicSpec, ensure_topics


class _Admin:
    """One broker, no topics yet; creations are accepted and never answered."""

    def __init__(self) -> None:
        self.created: list[str] = []

    def list_topics(self, **_: Any) -> Any:
        return SimpleNamespace(brokers={1: SimpleNamespace(id=1)}, topics={})

    def create_topics(self, topics: list[Any], **_: Any) -> dict[str, Future[Any]]:
        self.created += [topic.topic for topic in topics]
        return {topic.topic: Future() for topic in topics}


def test_an_unanswered_creation_is_a_transport_error() -> None:
    admin = _Admin()
    with pytest.raises(TransportError, match=r"creating topic site2\.inbound: no answer"):
        ensure_topics(admin, [TopicSpec("site2.inbound", 1)], timeout_s=0.2)  # type: ignore[arg-type]
    assert admin.created == ["site2.inbound"]
