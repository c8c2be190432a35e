"""A client's continuous queries cannot hold the server for another client.

The attacks, at a size that fits the suite: a LIKE pattern within the query's length limit
that compiles to some 20,000 RE2 instructions (one put of a 100 KB value then held the
server's loop for 6.7 s), and 200 distinct LIKE queries near the size bound with values of
100 KB. Beside them, a client putting to another region keeps its latency.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from support import bystander_puts, wait_until

from regionbus import CqAttributes, CqEvent, CqListener, RegionShortcut
from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ClientCache
from regionbus.schemas.cq.parser import MAX_CQ_QUERY_CHARS
from regionbus.schemas.errors import CqInvalidError

pytestmark = pytest.mark.abuse

_BOUND_S = 1.0
"""Longest the other client's put may take (on a loaded machine, ten times its own
baseline)."""


class _Errors(CqListener):
    def __init__(self) -> None:
        self.errors: list[CqEvent] = []
        self.events: list[CqEvent] = []

    def on_event(self, event: CqEvent) -> None:
        self.events.append(event)

    def on_error(self, event: CqEvent) -> None:
        self.errors.append(event)


def _timed_put(region: Any, key: str) -> float:
    started = time.monotonic()
    region.put(key, 1)
    return time.monotonic() - started


def test_long_like_queries_and_large_values_leave_another_clients_puts_their_pace(
    server_settings: ServerSettings, client_factory: Callable[..., ClientCache]
) -> None:
    with CacheServer(server_settings.model_copy(update={"regions": ["r", "s"]})):
        attacker = client_factory()
        attacker.create_region("r", RegionShortcut.PROXY)
        service = attacker.query_service()
        monster = ("%a_" * MAX_CQ_QUERY_CHARS)[: MAX_CQ_QUERY_CHARS - 40]
        with pytest.raises(CqInvalidError, match="like-pattern"):
            service.new_cq("monster", f"SELECT * FROM /r x WHERE x.s LIKE '{monster}'")

        heard = _Errors()
        for i in range(200):
            pattern = f"%{i}_" + "%a_" * 30  # about 470 instructions each, within the bound
            service.new_cq(
                f"q{i}", f"SELECT * FROM /r x WHERE x.s LIKE '{pattern}'", CqAttributes([heard])
            ).execute()

        victim = client_factory().create_region("s", RegionShortcut.PROXY)
        baseline_s = min(_timed_put(victim, f"warm-{i}") for i in range(3))
        writer = client_factory().create_region("r", RegionShortcut.PROXY)
        with bystander_puts(victim, [f"v{i}" for i in range(10)], at_least=20) as latencies:
            for i in range(3):
                writer.put(f"big{i}", {"s": "a" * 100_000})
            for i in range(5):
                writer.put(f"small{i}", {"s": "ab" * 500})
        assert max(latencies) <= max(_BOUND_S, 10 * baseline_s), (baseline_s, latencies)
        # Each of the 200 queries heard of each large value as an error, not a stall.
        wait_until(lambda: len(heard.errors) >= 3 * 200, timeout_s=60, what="the error events")
        assert all("characters x instructions" in str(e.throwable) for e in heard.errors)
