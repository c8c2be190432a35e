"""The queue analytics job and ``regionbus status`` agree on every queue's backlog: both
read a queue's head from the consumer group its worker commits under (the naming policy's
client, gateway sender and async event queue groups)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from gateway_sites import Site, running_sites, start_async_event_queue
from support import settle, wait_until

from regionbus.broker.cli import main
from regionbus.gateways.async_event_queue import AsyncEvent, AsyncEventListener
from regionbus.spark.analytics import queue_analytics

_PUTS = 6
_BATCH_SIZE = 2
_ACCEPTED_BATCHES = 2


class _AcceptsFirstBatches(AsyncEventListener):
    """Accepts the first ``accepted`` batches, then refuses every batch (it is redelivered
    until accepted, so the queue's head stays after the accepted ones)."""

    def __init__(self, accepted: int) -> None:
        self.accepted = accepted
        self.calls = 0
        self.accepted_events = 0
        self._lock = threading.Lock()

    def process_events(self, events: list[AsyncEvent]) -> bool:
        with self._lock:
            self.calls += 1
            if self.calls > self.accepted:
                return False
            self.accepted_events += len(events)
            return True

    def refused_once(self) -> bool:
        with self._lock:
            return self.calls > self.accepted


@pytest.fixture
def sites(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[list[Site]]:
    with running_sites(namespace, kafka_bootstrap_servers, redis_url, 2) as started:
        yield started


def _status(site: Site) -> dict[str, Any]:
    """``regionbus status --json`` of the site, once it read every figure (it answers
    within about a second and leaves unknown what Kafka did not answer by then)."""
    document: dict[str, Any] = {}

    def read_all() -> bool:
        result = CliRunner().invoke(
            main,
            [
                *("status", "--json", "--namespace", site.namespace),
                *("--kafka", site.kafka, "--redis", site.redis_url),
            ],
        )
        assert result.exit_code == 0, result.output
        document.update(json.loads(result.output))
        return not document["unreadable"]

    wait_until(read_all, timeout_s=60, what="regionbus status to read every figure")
    return document


def test_analytics_backlog_of_each_queue_equals_regionbus_status_depth(
    spark_session: Any, sites: list[Site]
) -> None:
    a, b = sites
    a.start_server(senders={"to-b": b.site_id}, async_event_queues=("audit",))
    lagging = a.client(subscription_ack_interval_ms=3_600_000)  # acks nothing
    lagging.create_region("r").register_interest_regex("k.*")
    writer = a.client()
    region = writer.create_region("r")
    for i in range(_PUTS):
        region.put(f"k{i}", i)  # one record each in the client, gateway and event queues
    settle(lagging)
    # Site b runs no gateway receiver: every batch the sender sends goes unacked.
    a.start_sender("to-b", b)
    # Two batches accepted back to back: the second one's records stay in the topic after
    # its commit (acked records are deleted at most once a second, and not while a refused
    # batch is redelivered), so only the dispatcher's group tells they are acked.
    listener = _AcceptsFirstBatches(_ACCEPTED_BATCHES)
    start_async_event_queue(a, "audit", listener, batch_size=_BATCH_SIZE, retry_interval_ms=100)
    wait_until(listener.refused_once, timeout_s=60, what="the listener to refuse a batch")

    status = _status(a)
    result = queue_analytics(spark_session, kafka_bootstrap_servers=a.kafka, namespace=a.namespace)

    depths = {r.client_id: r.depth for r in result.queues.collect()}
    status_depths = {q["client_id"]: q["depth_messages"] for q in status["queues"]}
    assert status_depths[lagging.client_id] == _PUTS
    assert status_depths[writer.client_id] == 0
    assert depths == status_depths
    backlogs = {(r.kind, r.topic): r.backlog for r in result.gateways.collect()}
    (sender,) = status["gateway_senders"]
    (event_queue,) = status["async_event_queues"]
    assert sender["backlog_events"] == _PUTS
    # Two batches of at most two events accepted: some events acked, some not.
    assert 0 < listener.accepted_events < _PUTS
    assert event_queue["backlog_events"] == _PUTS - listener.accepted_events
    assert backlogs == {
        ("gateway", sender["topic"]): sender["backlog_events"],
        ("async-event-queue", event_queue["topic"]): event_queue["backlog_events"],
    }
