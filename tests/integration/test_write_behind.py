"""docs/behaviour.md §7 write-behind: an async event queue keeps a SQL table (SQLite through
SQLAlchemy) equal to the ``flights`` region after a replay, also when the listener fails
every tenth batch after writing part of it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from gateway_sites import Site, replay_flights, start_async_event_queue
from support import wait_until

from regionbus.gateways.async_event_queue import AsyncEvent
from regionbus.gateways.write_behind import SqlWriteBehindListener


class _FailsEveryTenthBatch(SqlWriteBehindListener):
    """Writes the first half of every tenth batch, then reports failure."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.calls = 0
        self.failures = 0

    def process_events(self, events: list[AsyncEvent]) -> bool:
        self.calls += 1
        if self.calls % 10 == 0:
            self.failures += 1
            super().process_events(events[: len(events) // 2])
            return False
        return super().process_events(events)


@pytest.fixture
def site(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[Site]:
    with ExitStack() as stack:
        yield Site(stack, namespace, kafka_bootstrap_servers, redis_url, 1)


@pytest.mark.parametrize("failing", [False, True], ids=["healthy", "fails_every_tenth_batch"])
def test_the_write_behind_table_equals_the_flights_region_after_the_replay(
    site: Site, tmp_path: Path, failing: bool
) -> None:
    url = f"sqlite:///{tmp_path / 'flights.db'}"
    listener = _FailsEveryTenthBatch(url) if failing else SqlWriteBehindListener(url)
    site.start_server(regions=("flights",), async_event_queues=("db",))
    queue = start_async_event_queue(site, "db", listener, batch_size=50, retry_interval_ms=20)
    region = site.client().create_region("flights")

    replay_flights(region, days=1)
    region.put("replay-done", True)
    wait_until(lambda: "replay-done" in listener.rows("flights"), 120, "the last event")

    expected = site.values("flights")
    assert len(expected) > 500
    assert listener.rows("flights") == expected
    if failing:
        assert isinstance(listener, _FailsEveryTenthBatch) and listener.failures >= 3
        assert queue.stats.batches_redispatched == listener.failures
    else:
        assert queue.stats.batches_redispatched == 0
