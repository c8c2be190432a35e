"""``regionbus gateway repair``: two sites that diverged while no gateway ran between them
(a partition longer than the queue's retention) are compared with Merkle trees and made
equal, each key decided as WAN delivery would have, moving only what differs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from gateway_sites import Site, running_sites
from support import Recorder, wait_until

from regionbus.broker.cli import main
from regionbus.clients import ALL_KEYS, ClientSettings
from regionbus.gateways.filters import (
    GatewayConflictHelper,
    GatewayConflictResolver,
    TimestampedEntryEvent,
)
from regionbus.gateways.repair import GatewayRepair, RepairSite
from regionbus.schemas.messages import EventKind

TOTAL_BUCKETS = 16


@pytest.fixture
def sites(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[list[Site]]:
    with running_sites(namespace, kafka_bootstrap_servers, redis_url, 2) as started:
        yield started


def _repair_site(site: Site, client: redis.Redis) -> RepairSite:
    return RepairSite(
        site.site_id,
        site.namespace,
        client,
        ClientSettings(
            namespace=site.namespace,
            kafka_bootstrap_servers=site.kafka,
            fetch_wait_max_ms=100,
            read_timeout_ms=30_000,
        ),
    )


def _repair(sites: list[Site], redis_url: str, **options: Any) -> GatewayRepair:
    """Both sites' servers started, and a repair between them."""
    a, b = sites
    a.start_server()
    b.start_server()
    client = redis.Redis.from_url(redis_url)
    return GatewayRepair(_repair_site(a, client), _repair_site(b, client), TOTAL_BUCKETS, **options)


def test_two_sites_that_diverged_converge_each_key_to_the_later_change_moving_only_the_difference(
    sites: list[Site], redis_url: str
) -> None:
    a, b = sites
    repair = _repair(sites, redis_url)
    at_a = a.client().create_region("r")
    at_b = b.client().create_region("r")
    at_a.put_all({f"k{i}": {"i": i} for i in range(2000)})

    # Everything is at A only: the first repair copies it to B, each key as A's change.
    first = repair.run(["r"])
    assert first.keys_differing == 2000 and first.applied == 2000, first
    assert b.values() == a.values()
    assert repair.run(["r"]).keys_differing == 0

    # The partition: both sides change, some keys at both (the later change must win).
    heard = Recorder()
    b.client().create_region("r", listeners=[heard]).register_interest(ALL_KEYS)
    for i in range(0, 20):
        at_a.put(f"k{i}", {"i": i, "at": "A"})
    for i in range(20, 40):
        at_b.put(f"k{i}", {"i": i, "at": "B"})
    at_b.put("k5", {"i": 5, "at": "B, before A's"})  # A changes k5 again below: A wins
    time.sleep(0.01)  # a later timestamp than B's k5, on this millisecond clock
    at_a.put("k5", {"i": 5, "at": "A, last"})
    at_a.put("k25", {"i": 25, "at": "A, before B's"})  # B changes k25 again below: B wins
    time.sleep(0.01)
    at_b.put("k25", {"i": 25, "at": "B, last"})
    for i in range(40, 45):
        at_a.destroy(f"k{i}")
    for i in range(45, 50):
        at_b.destroy(f"k{i}")
    at_a.put("new-at-a", 1)
    at_b.put("new-at-b", 2)
    expected = {**a.values(), **{k: v for k, v in b.values().items()}}
    for i in range(20):
        expected[f"k{i}"] = a.values()[f"k{i}"]
    expected["k25"] = b.values()["k25"]
    for i in range(40, 50):
        expected.pop(f"k{i}")
    heard.events.clear()

    second = repair.run(["r"])
    assert a.values() == b.values() == expected
    # 20 + 20 updates (k5 and k25 among them), 10 destroys, 2 creates
    assert second.keys_differing == 52, second
    assert second.applied == 52 and second.refused == second.failed == 0
    by_key = {d.key: d for d in second.decisions}
    assert by_key["k5"].winner_site_id == 1 and by_key["k25"].winner_site_id == 2
    assert by_key["k42"].action == "destroy" and by_key["k47"].action == "destroy"
    assert by_key["new-at-b"].winner_site_id == 2
    # B's clients hear what B lost as events: A's 20 updates, 5 destroys and 1 create
    wait_until(lambda: len(heard.events) >= 26, 30, "B's client hearing the repair")
    # Only the differing leaves moved (with the tree's nodes above them): a fraction of
    # what the first run, which copied the whole region, moved
    assert second.bytes_moved < first.bytes_moved / 3, (second.bytes_moved, first.bytes_moved)
    assert second.leaves_differing <= 52

    third = repair.run(["r"])
    assert third.keys_differing == 0 and third.buckets_differing == 0
    # One site's root of every bucket, and each site's count of the bucket's entries (which
    # sizes the tree: about 130 entries a bucket, three digits), only
    assert third.bytes_by_step == {"tree": 4 * TOTAL_BUCKETS + 2 * 3 * TOTAL_BUCKETS}, third


def test_a_dry_run_decides_and_changes_nothing_and_the_later_change_wins_at_either_site(
    sites: list[Site], redis_url: str
) -> None:
    a, b = sites
    dry = _repair(sites, redis_url, dry_run=True)
    at_a = a.client().create_region("r")
    at_b = b.client().create_region("r")
    at_a.put("k", "old at A")
    decided = dry.run(["r"])
    assert decided.keys_differing == 1 and decided.applied == 0 and b.values() == {}
    at_b.put("k", "newer at B")
    dry.dry_run = False
    report = dry.run(["r"])
    assert report.keys_differing == 1 and report.decisions[0].winner_site_id == 2
    assert a.values() == b.values() == {"k": b'"newer at B"'}


@pytest.mark.parametrize("leaf_bits", [2, 6])
def test_a_tree_of_few_leaves_finds_every_difference_from_levels_computed_from_the_leaves(
    sites: list[Site], redis_url: str, leaf_bits: int
) -> None:
    # Below 16 leaves a node is not stored: 2 bits makes every level, the root included,
    # computed from the leaves when asked; 6 bits stores the upper levels only.
    a, b = sites
    repair = _repair(sites, redis_url, leaf_bits=leaf_bits)
    at_a, at_b = a.client().create_region("r"), b.client().create_region("r")
    at_a.put_all({f"k{i}": i for i in range(300)})
    assert repair.run(["r"]).applied == 300
    for i in range(0, 300, 10):
        at_b.put(f"k{i}", -i)
    report = repair.run(["r"])
    assert report.keys_differing == 30 and report.applied == 30, report
    assert a.values() == b.values()
    assert repair.run(["r"]).keys_differing == 0


class _KeepOrStamp(GatewayConflictResolver):
    """Disallows changes to ``keep*`` keys; stamps the value of ``stamp*`` keys; records
    what it saw."""

    def __init__(self) -> None:
        self.seen: list[TimestampedEntryEvent] = []

    def on_event(self, event: TimestampedEntryEvent, helper: GatewayConflictHelper) -> None:
        self.seen.append(event)
        if event.key.startswith("keep"):
            helper.disallow_event()
        elif event.key.startswith("stamp"):
            helper.change_event_value(b'"stamped"')


def test_the_conflict_resolver_decides_each_conflict_as_the_losing_sites_receiver_would(
    sites: list[Site], redis_url: str
) -> None:
    a, b = sites
    resolver = _KeepOrStamp()
    repair = _repair(sites, redis_url, conflict_resolver=resolver)
    at_a, at_b = a.client().create_region("r"), b.client().create_region("r")
    at_a.put_all({"keep": "a1", "stamp": "a1", "plain": "a1"})
    assert repair.run(["r"]).applied == 3 and resolver.seen == []  # B had nothing: no conflict
    # B changes keep and stamp (its entries now last changed at site 2), then A changes all
    # three later: A wins each, and B's keep and stamp are conflicts (A's plain is not: B
    # last had it from site 1)
    at_b.put("keep", "b2")
    at_b.put("stamp", "b2")
    time.sleep(0.01)  # a later timestamp on this millisecond clock
    at_a.put_all({"keep": "a3", "stamp": "a3", "plain": "a3"})

    report = repair.run(["r"])

    assert report.keys_differing == 3 and report.disallowed == 1, report
    assert report.applied == 2 and report.failed == 0, report
    assert b.values() == {"keep": b'"b2"', "stamp": b'"stamped"', "plain": b'"a3"'}
    seen = {event.key: event for event in resolver.seen}
    assert sorted(seen) == ["keep", "stamp"]
    assert seen["keep"].kind is EventKind.UPDATE
    assert (seen["keep"].new_value, seen["keep"].old_value) == (b'"a3"', b'"b2"')
    assert (seen["keep"].new_distributed_system_id, seen["keep"].old_distributed_system_id) == (
        1,
        2,
    )
    # what the resolver disallowed stays different: the next run finds it, and only it
    again = repair.run(["r"])
    assert again.keys_differing == 1 and again.disallowed == 1, again


def test_the_command_repairs_and_reports_as_json(sites: list[Site], redis_url: str) -> None:
    a, b = sites
    a.start_server()
    b.start_server()
    a.client().create_region("r").put_all({"x": 1, "y": 2})
    args = [
        "gateway", "repair", "--namespace", a.namespace, "--kafka", a.kafka, "--redis",
        redis_url, "--site-id", "1", "--remote-namespace", b.namespace, "--remote-kafka",
        b.kafka, "--remote-redis", redis_url, "--remote-site-id", "2", "--region", "r",
    ]  # fmt: skip
    dry = CliRunner().invoke(main, [*args, "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["keys_differing"] == 2 and b.values() == {}
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 0, done.output
    assert (
        "2 keys differed: 2 repaired, 0 refused as older, 0 failed, 0 disallowed" in done.output
    ), done.output
    assert b.values() == a.values() == {"x": b"1", "y": b"2"}
