"""docs/behaviour.md §6: active-active and ring topologies without loops, conflict resolution by
timestamp then site id, a pluggable conflict resolver, and the flights replayed to a
remote site."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from gateway_sites import Site, replay_flights, running_sites
from support import entry_operation, send_raw_operation, wait_until

from regionbus.gateways.filters import (
    GatewayConflictHelper,
    GatewayConflictResolver,
    TimestampedEntryEvent,
)
from regionbus.gateways.receiver import GatewayReceiver
from regionbus.schemas.messages import OperationKind


@pytest.fixture
def sites(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[list[Site]]:
    """Three sites, ids 1, 2, 3 (a test starts what it uses)."""
    with running_sites(namespace, kafka_bootstrap_servers, redis_url, 3) as started:
        yield started


class _Writes:
    """Raw puts of region ``r`` on a site, with chosen timestamps (one member per site)."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.sequence = 0

    def put(self, key: str, value: str, timestamp_ms: int) -> None:
        op, bucket = entry_operation(
            f"app-{self.site.site_id}",
            OperationKind.PUT,
            key,
            self.sequence,
            f'"{value}"'.encode(),
            request_id=self.sequence + 1,
        )
        self.sequence += 1
        send_raw_operation(
            self.site.kafka, self.site.namespace, op._replace(timestamp_ms=timestamp_ms), bucket
        )
        self.site.wait_for(key, f'"{value}"'.encode())


def _assert_no_loop_and_no_resend(receivers: list[GatewayReceiver]) -> None:
    for receiver in receivers:
        assert receiver.stats.loops_dropped == 0
        assert receiver.stats.duplicates == 0
        assert receiver.stats.possible_duplicate_batches == 0


def test_active_active_concurrent_updates_converge_by_timestamp_then_site_id_without_loops(
    sites: list[Site],
) -> None:
    a, b, _ = sites
    a.start_server(senders={"to-b": 2})
    b.start_server(senders={"to-a": 1})
    receivers = [a.start_receiver(), b.start_receiver()]
    t = int(time.time() * 1000)
    on_a, on_b = _Writes(a), _Writes(b)
    on_a.put("later-a", "a", t + 10)
    on_b.put("later-a", "b", t)
    on_a.put("later-b", "a", t)
    on_b.put("later-b", "b", t + 10)
    on_a.put("tie", "a", t)
    on_b.put("tie", "b", t)  # same timestamp: the higher site id (2) wins
    to_b = a.start_sender("to-b", b)
    to_a = b.start_sender("to-a", a)
    a.client().create_region("r").put("from-a", 1)
    b.client().create_region("r").put("from-b", 2)
    a.wait_for("from-b", b"2")
    b.wait_for("from-a", b"1")

    expected = {"later-a": b'"a"', "later-b": b'"b"', "tie": b'"b"', "from-a": b"1", "from-b": b"2"}
    # a batch is applied per bucket (no order across keys): wait for the whole region
    wait_until(lambda: a.values() == expected and b.values() == expected, 60, "convergence")
    # A's three writes and from-a, nothing of B's (and the reverse); acks come after apply
    wait_until(lambda: to_b.stats.events_dispatched == to_a.stats.events_dispatched == 4)
    assert receivers[0].stats.conflicts_refused == 1  # B's later-a lost on A
    assert receivers[1].stats.conflicts_refused == 2  # A's later-b and tie lost on B
    _assert_no_loop_and_no_resend(receivers)


def test_ring_of_three_sites_converges_without_loops(sites: list[Site]) -> None:
    a, b, c = sites
    a.start_server(senders={"to-b": 2})
    b.start_server(senders={"to-c": 3})
    c.start_server(senders={"to-a": 1})
    receivers = [site.start_receiver() for site in sites]
    t = int(time.time() * 1000)
    writes = [_Writes(site) for site in sites]
    writes[0].put("ring1", "a", t + 10)
    writes[2].put("ring1", "c", t)
    for w, value in zip(writes, "abc", strict=True):
        w.put("ring2", value, t)  # a three-way tie: site 3 wins
    a.start_sender("to-b", b)
    b.start_sender("to-c", c)
    c.start_sender("to-a", a)
    a.client().create_region("r").put("x", "from-a")
    for site in sites:
        site.wait_for("x", b'"from-a"')
        site.wait_for("ring1", b'"a"')
        site.wait_for("ring2", b'"c"')

    expected = {"ring1": b'"a"', "ring2": b'"c"', "x": b'"from-a"'}
    for site in sites:
        assert site.values() == expected
    _assert_no_loop_and_no_resend(receivers)


class _KeepOrMerge(GatewayConflictResolver):
    """Keeps the existing value of ``keep``; replaces an incoming ``merge`` value."""

    def __init__(self) -> None:
        self.seen: list[TimestampedEntryEvent] = []

    def on_event(self, event: TimestampedEntryEvent, helper: GatewayConflictHelper) -> None:
        self.seen.append(event)
        if event.key == "keep":
            helper.disallow_event()
        elif event.key == "merge":
            helper.change_event_value(b'"merged"')


def test_a_conflict_resolver_can_keep_the_existing_value_or_change_the_incoming_one(
    sites: list[Site],
) -> None:
    a, b, _ = sites
    a.start_server(senders={"to-b": 2})
    b.start_server()
    resolver = _KeepOrMerge()
    receiver = b.start_receiver(resolver=resolver)
    t = int(time.time() * 1000)
    on_a, on_b = _Writes(a), _Writes(b)
    for key in ("keep", "merge"):
        on_b.put(key, "b", t)
        on_a.put(key, "a", t + 10)  # newer: it would win without the resolver
    on_a.put("fresh", "a", t)  # no entry on B: no conflict, the resolver is not asked
    a.start_sender("to-b", b)
    expected = {"keep": b'"b"', "merge": b'"merged"', "fresh": b'"a"'}
    wait_until(lambda: b.values() == expected, 60, "site B's region")
    wait_until(lambda: receiver.stats.conflicts_disallowed == 1, 30, "the resolver's verdict")
    assert [
        (e.key, e.old_distributed_system_id, e.new_distributed_system_id) for e in resolver.seen
    ] == [("keep", 2, 1), ("merge", 2, 1)]
    assert resolver.seen[0].old_value == b'"b"' and resolver.seen[0].new_timestamp_ms == t + 10


def test_the_flights_replayed_on_site_a_leave_site_b_equal(sites: list[Site]) -> None:
    a, b, _ = sites
    b.start_server(regions=("flights",))
    b.start_receiver()
    a.start_server(senders={"to-b": 2}, regions=("flights",))
    sender = a.start_sender("to-b", b)
    region = a.client().create_region("flights")

    operations = replay_flights(region, days=1)
    region.put("replay-done", True)
    b.wait_for("replay-done", b"true", region="flights", timeout_s=120)

    a_values = a.values("flights")
    assert len(a_values) > 500
    wait_until(lambda: b.values("flights") == a_values, 60, "B's flights equal to A's")
    wait_until(lambda: sender.stats.events_dispatched == operations + 1, 30, "the last ack")
