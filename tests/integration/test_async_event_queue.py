"""docs/behaviour.md §7: async event queues deliver batches of distributable events to a listener,
in order, again (flagged possible duplicate) until it accepts them; pause and resume."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from gateway_sites import Site, start_async_event_queue
from support import entry_operation, send_raw_operation, wait_until

from regionbus.gateways.async_event_queue import (
    AsyncEvent,
    AsyncEventListener,
    AsyncEventQueueSettings,
)
from regionbus.schemas.messages import EventKind, OperationKind


class _Recording(AsyncEventListener):
    """Records every batch; ``answers`` scripts the first calls (True, False or an
    exception to raise), then every call returns True."""

    def __init__(self, answers: list[bool | Exception] | None = None) -> None:
        self.batches: list[list[AsyncEvent]] = []
        self.answers = list(answers or [])
        self.lock = threading.Lock()

    def process_events(self, events: list[AsyncEvent]) -> bool:
        with self.lock:
            self.batches.append(list(events))
            answer = self.answers.pop(0) if self.answers else True
        if isinstance(answer, Exception):
            raise answer
        return answer

    def events(self) -> list[AsyncEvent]:
        with self.lock:
            return [e for batch in self.batches for e in batch]


@pytest.fixture
def site(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[Site]:
    with ExitStack() as stack:
        yield Site(stack, namespace, kafka_bootstrap_servers, redis_url, 1)


def test_defaults_are_geodes() -> None:
    settings = AsyncEventQueueSettings(queue_id="q")
    assert (settings.batch_size, settings.batch_time_interval_ms) == (100, 5)
    assert not settings.dispatching_paused and not settings.batch_conflation_enabled


def test_a_queue_created_paused_delivers_nothing_until_resumed_then_every_distributable_event_in_order(  # noqa: E501
    site: Site,
) -> None:
    site.start_server(async_event_queues=("audit",))
    listener = _Recording()
    queue = start_async_event_queue(site, "audit", listener, dispatching_paused=True)
    region = site.client().create_region("r")
    region.put_all({f"k{i:03d}": i for i in range(250)})
    region.put("k000", "updated")
    region.destroy("k001")
    invalidate, bucket = entry_operation("app-1", OperationKind.INVALIDATE, "k002", 0)
    send_raw_operation(site.kafka, site.namespace, invalidate, bucket)
    region.clear()
    region.put("sentinel", 1)
    time.sleep(1.0)  # paused: nothing may arrive however long we wait
    assert listener.events() == [] and queue.is_dispatching_paused

    queue.resume_event_dispatching()
    wait_until(lambda: any(e.key == "sentinel" for e in listener.events()), 30, "sentinel")

    events = listener.events()
    assert [(e.kind, e.key) for e in events[250:]] == [
        (EventKind.UPDATE, "k000"),
        (EventKind.DESTROY, "k001"),
        (EventKind.CREATE, "sentinel"),
    ]  # no invalidate, no clear
    assert sorted(e.key for e in events[:250]) == [f"k{i:03d}" for i in range(250)]
    assert {e.kind for e in events[:250]} == {EventKind.CREATE}
    assert events[250].value == "updated"
    assert all(len(b) <= 100 for b in listener.batches)
    assert not any(e.possible_duplicate for e in events)


def test_false_or_an_exception_delivers_the_same_batch_again_flagged_possible_duplicate(
    site: Site,
) -> None:
    site.start_server(async_event_queues=("audit",))
    listener = _Recording([False, RuntimeError("database down")])
    # The first batch must hold all 30 puts: wait for them rather than for the first few
    # the broker makes visible (the 5 ms default would cut a batch there).
    queue = start_async_event_queue(
        site,
        "audit",
        listener,
        dispatching_paused=True,
        retry_interval_ms=10,
        batch_size=30,
        batch_time_interval_ms=3_000,
    )
    region = site.client().create_region("r")
    region.put_all({f"k{i}": i for i in range(30)})
    queue.resume_event_dispatching()
    wait_until(lambda: len(listener.batches) >= 3, 30, "three deliveries")
    region.put("after", 1)
    wait_until(lambda: any(e.key == "after" for e in listener.events()), 30, "the next batch")

    first, second, third = listener.batches[:3]
    assert (
        [e.event_id for e in first] == [e.event_id for e in second] == [e.event_id for e in third]
    )
    assert len(first) == 30
    assert not any(e.possible_duplicate for e in first)
    assert all(e.possible_duplicate for e in second + third)
    assert [e.key for b in listener.batches[3:] for e in b] == ["after"]
    assert queue.stats.batches_redispatched == 2


def test_a_parallel_queue_keeps_the_order_of_each_key(site: Site) -> None:
    site.start_server(async_event_queues=("audit",), parallel=True)
    listener = _Recording()
    start_async_event_queue(site, "audit", listener, batch_size=7)
    region = site.client().create_region("r")
    futures = [region.put_async(f"key{i % 5}", i) for i in range(200)]
    for future in futures:
        future.result(30)
    wait_until(lambda: len(listener.events()) == 200, 30, "every event")

    per_key: dict[str, list[int]] = {}
    for event in listener.events():
        per_key.setdefault(event.key, []).append(event.value)
    assert per_key == {f"key{k}": list(range(k, 200, 5)) for k in range(5)}
    buckets = {e.event_id.bucket for e in listener.events()}
    assert len(buckets) > 1
