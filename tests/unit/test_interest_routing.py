"""Routing by interest, in memory (no Redis): which clients get a change, with values or
invalidations, bucket by bucket (docs/behaviour.md §3; invariant 3 of ARCHITECTURE.md)."""

from __future__ import annotations

from typing import Any

import pytest

from regionbus.broker.interest import InterestTable
from regionbus.schemas.errors import InvalidInterestError
from regionbus.schemas.messages import InterestKind, InterestSpec

ALL = InterestSpec(InterestKind.ALL_KEYS)
KEYS = InterestSpec(InterestKind.KEYS)
NO_VALUES = InterestSpec(InterestKind.ALL_KEYS, receive_values=False)


def _regex(pattern: str, receive_values: bool = True, durable: bool = False) -> InterestSpec:
    return InterestSpec(
        InterestKind.REGEX, regex=pattern, receive_values=receive_values, durable=durable
    )


def test_a_registration_routes_only_in_the_buckets_it_was_installed_in() -> None:
    table = InterestTable()
    table.add("c1", "r", ALL, [3])
    assert _union(table, "r", "k", 3) == {"c1": True}
    assert _union(table, "r", "k", 4) == {}
    table.add("c1", "r", ALL, [4])
    assert _union(table, "r", "k", 4) == {"c1": True}


def test_keys_route_their_own_keys_and_a_regex_the_whole_key_only() -> None:
    table = InterestTable()
    table.add("keys", "r", KEYS, [0], ["a", "b"])
    table.add("regex", "r", _regex("UA-.*"), [0])
    assert _union(table, "r", "a", 0) == {"keys": True}
    assert _union(table, "r", "UA-1", 0) == {"regex": True}
    assert _union(table, "r", "xUA-1", 0) == {}  # fullmatch, as Geode's Matcher.matches()
    assert _union(table, "other", "a", 0) == {}


def test_the_union_of_a_clients_registrations_wants_values_when_any_does() -> None:
    table = InterestTable()
    table.add("c", "r", NO_VALUES, [0])
    assert _union(table, "r", "k", 0) == {"c": False}
    table.add("c", "r", KEYS, [0], ["k"])
    assert _union(table, "r", "k", 0) == {"c": True}
    assert _union(table, "r", "other", 0) == {"c": False}
    table.add("d", "r", _regex("o.*", receive_values=False), [0])
    table.add("d", "r", _regex("ot.*"), [0])
    assert _union(table, "r", "other", 0)["d"] is True


def test_removing_a_registration_leaves_the_others() -> None:
    table = InterestTable()
    table.add("c", "r", KEYS, [0], ["a", "b"])
    table.add("c", "r", _regex("z.*"), [0])
    table.remove("c", "r", InterestSpec(InterestKind.KEYS, ("a",)))
    assert _union(table, "r", "a", 0) == {}
    assert _union(table, "r", "b", 0) == {"c": True}
    table.remove("c", "r", _regex("z.*"))
    assert _union(table, "r", "zz", 0) == {}
    table.remove("c", "missing-region", ALL)


def test_dropping_a_client_can_keep_its_durable_registrations() -> None:
    table = InterestTable()
    table.add("c", "r", InterestSpec(InterestKind.KEYS, durable=True), [0], ["kept"])
    table.add("c", "r", KEYS, [0], ["gone"])
    table.add("c", "r", _regex("d.*", durable=True), [0])
    table.drop_client("c", keep_durable=True)
    assert _union(table, "r", "kept", 0) == {"c": True}
    assert _union(table, "r", "dx", 0) == {"c": True}
    assert _union(table, "r", "gone", 0) == {}
    table.drop_client("c")
    assert table.clients_of_region("r") == set()


class _NoWalk(dict[Any, Any]):
    """A region's registrations that fail the test when anything walks all of them while
    ``refusing`` is set."""

    refusing = True

    def _check(self) -> None:
        if self.refusing:
            raise AssertionError("every registration of the region was walked")

    def __iter__(self) -> Any:
        self._check()
        return super().__iter__()

    def keys(self) -> Any:
        self._check()
        return super().keys()

    def values(self) -> Any:
        self._check()
        return super().values()

    def items(self) -> Any:
        self._check()
        return super().items()


def test_forgetting_a_client_walks_its_own_registrations_not_every_registered_key() -> None:
    """A fleet's clients come and go: forgetting one must cost its own registrations, not
    a pass over every key any client registered (which made 10,000 disconnects quadratic)."""
    table = InterestTable()
    for i in range(1_000):
        table.add(f"other-{i}", "r", KEYS, [0], [f"k{i}"])
        table.add(f"other-{i}", "r", _regex(f"o{i}-.*"), [0])
    table.add("c", "r", KEYS, [0], ["k1", "mine"])
    table.add("c", "r", _regex("m.*"), [0])
    registrations = table._regions["r"]
    keys, regexes = _NoWalk(registrations.keys), _NoWalk(registrations.regexes)
    registrations.keys, registrations.regexes = keys, regexes

    table.drop_client("c")

    keys.refusing = regexes.refusing = False
    assert _union(table, "r", "k1", 0) == {"other-1": True}
    assert _union(table, "r", "mine", 0) == {}
    assert _union(table, "r", "mx", 0) == {}
    assert _union(table, "r", "o7-x", 0) == {"other-7": True}
    assert "c" not in table.clients_of_region("r")


def test_routing_after_a_registration_step_does_not_walk_every_registered_key() -> None:
    """A registration of many keys arrives in many steps, each of which changes the
    region's audiences: rebuilding them must cost the clients, not every key registered
    (a pass over 100,000 keys per step held every other client's puts ~100 ms)."""
    table = InterestTable()
    for i in range(1_000):
        table.add(f"other-{i}", "r", KEYS, [0], [f"k{i}"])
    table.add("big", "r", KEYS, [0], [f"big-{i}" for i in range(500)])
    registrations = table._regions["r"]
    registrations.keys = keys = _NoWalk(registrations.keys)

    table.add("big", "r", KEYS, [0], [f"big-{i}" for i in range(500, 1_000)])
    routed = table.audiences("r", "k7", 0)
    table.add("all", "r", ALL, [0])
    routed_again = table.audiences("r", "big-700", 0)

    keys.refusing = False
    assert [sorted(a.clients) for a in routed.audiences] == [["other-7"]]
    assert routed.individual == {}
    assert [sorted(a.clients) for a in routed_again.audiences] == [["all"], ["big"]]
    assert routed_again.individual == {}


def test_nothing_of_a_forgotten_client_or_region_stays_in_the_table() -> None:
    table = InterestTable()
    table.add("c", "r", InterestSpec(InterestKind.KEYS, durable=True), [0], ["kept"])
    table.add("c", "r", KEYS, [0], ["gone"])
    table.add("c", "r", _regex("d.*", durable=True), [0])
    table.add("c", "destroyed", KEYS, [0], ["x"])
    table.add("c", "destroyed", _regex("x.*"), [0])
    table.forget_region("destroyed")
    table.drop_client("c", keep_durable=True)
    assert _union(table, "r", "kept", 0) == {"c": True}
    table.add("d", "destroyed", KEYS, [0], ["x"])

    table.drop_client("c")

    assert _union(table, "r", "kept", 0) == {} and _union(table, "r", "dx", 0) == {}
    assert _union(table, "destroyed", "x", 0) == {"d": True}
    assert all("c" not in ri.keys_of and "c" not in ri.patterns_of for ri in _regions(table))
    table.drop_client("d")
    assert all(ri.keys_of == {} and ri.patterns_of == {} for ri in _regions(table))


def test_a_registration_of_no_keys_leaves_no_interest() -> None:
    table = InterestTable()
    table.add("a", "r", ALL, [0])
    table.add("c", "r", KEYS, [0], [])
    assert table.clients_of_region("r") == {"a"}
    assert table.audiences("r", "k", 0).individual == {}


def test_region_events_go_to_every_client_with_any_interest_in_the_region() -> None:
    table = InterestTable()
    table.add("a", "r", ALL, [0])
    table.add("b", "r", KEYS, [1], ["k"])
    table.add("c", "r", _regex("x"), [2])
    table.add("d", "other", ALL, [0])
    assert table.clients_of_region("r") == {"a", "b", "c"}
    table.forget_region("r")
    assert table.clients_of_region("r") == set()
    assert table.clients_of_region("other") == {"d"}


def test_a_regex_that_does_not_compile_is_refused() -> None:
    with pytest.raises(InvalidInterestError):
        InterestTable().add("c", "r", _regex("("), [0])


def test_routes_of_all_keys_regions_follow_every_change_of_the_table() -> None:
    # Such routes are computed once per bucket: each change must be seen at once, and a
    # caller changing the route it got must not change the next one.
    table = InterestTable()
    table.add("c1", "r", ALL, [0])
    first = _union(table, "r", "a", 0)
    assert first == {"c1": True}
    first.pop("c1")
    assert _union(table, "r", "b", 0) == {"c1": True}
    table.add("c2", "r", NO_VALUES, [0])
    assert _union(table, "r", "a", 0) == {"c1": True, "c2": False}
    table.add("c2", "r", ALL, [0])
    assert _union(table, "r", "a", 0) == {"c1": True, "c2": True}
    table.remove("c2", "r", ALL)
    assert _union(table, "r", "a", 0) == {"c1": True}
    table.add("c3", "r", KEYS, [0], ["a"])
    assert _union(table, "r", "a", 0) == {"c1": True, "c3": True}
    assert _union(table, "r", "b", 0) == {"c1": True}
    table.remove("c3", "r", InterestSpec(InterestKind.KEYS, keys=("a",)))
    assert _union(table, "r", "a", 0) == {"c1": True}
    table.drop_client("c1")
    assert _union(table, "r", "a", 0) == {}
    table.add("c4", "r", ALL, [0])
    assert _union(table, "r", "a", 0) == {"c4": True}
    table.forget_region("r")
    assert _union(table, "r", "a", 0) == {}
    table.add("c5", "r", ALL, [0])
    assert _union(table, "r", "a", 0) == {"c5": True}
    table.clear()
    assert _union(table, "r", "a", 0) == {}


# --- audiences: clients that share a registration, routed once -------------------------


def _regions(table: InterestTable) -> list[Any]:
    return list(table._regions.values())


def _union(table: InterestTable, region: str, key: str, bucket: int) -> dict[str, bool]:
    """What the audiences of a change reach, as one ``{client: receive_values}``."""
    routed = table.audiences(region, key, bucket)
    out = dict(routed.individual)
    for audience in routed.audiences:
        for client_id in audience.clients:
            assert client_id not in out, f"{client_id} reached twice"
            out[client_id] = audience.receive_values
    return out


def test_clients_sharing_a_registration_are_one_audience_per_receive_values() -> None:
    table = InterestTable()
    for n in range(100):
        table.add(f"all{n}", "r", ALL, [0])
    for n in range(10):
        table.add(f"inv{n}", "r", NO_VALUES, [0])
    routed = table.audiences("r", "k", 0)
    assert not routed.individual
    assert [(a.source, a.receive_values, len(a.clients)) for a in routed.audiences] == [
        (("all", "r"), True, 100),
        (("all", "r"), False, 10),
    ]
    assert table.audiences("r", "k", 1).audiences == ()  # installed in bucket 0 only


def test_equal_audiences_of_different_buckets_are_one_object() -> None:
    # The notifier keeps an audience's targets by it: the same object stops the lookup at
    # identity, where an equal one of another bucket compared every client of it, on
    # every change.
    table = InterestTable()
    for n in range(1000):
        table.add(f"all{n}", "r", ALL, range(16))
    table.add("keys", "r", KEYS, range(16), ["k1", "k2"])
    first = table.audiences("r", "k1", 3).audiences
    second = table.audiences("r", "k2", 11).audiences
    assert [a.source for a in first] == [("all", "r"), ("key", "r", "k1")]
    assert first[0] is second[0]
    assert len(first[0].clients) == 1000


def test_a_client_with_two_registrations_on_a_region_is_routed_alone_with_their_union() -> None:
    table = InterestTable()
    table.add("shared", "r", ALL, [0])
    table.add("c", "r", NO_VALUES, [0])
    table.add("c", "r", KEYS, [0], ["k"])
    routed = table.audiences("r", "k", 0)
    assert routed.individual == {"c": True}
    assert [set(a.clients) for a in routed.audiences] == [{"shared"}]
    assert table.audiences("r", "other", 0).individual == {"c": False}
    table.remove("c", "r", InterestSpec(InterestKind.KEYS, ("k",)))
    assert table.audiences("r", "k", 0).individual == {}
    assert {frozenset(a.clients) for a in table.audiences("r", "k", 0).audiences} == {
        frozenset({"shared"}),
        frozenset({"c"}),
    }


def test_a_client_of_several_keys_and_nothing_else_is_in_its_keys_audiences() -> None:
    """Two exact keys never match the same change, so a client of several keys need not be
    routed alone: 10,000 durable clients of three keys each, routed alone, made every
    change walk all of them."""
    table = InterestTable()
    for i in range(1_000):
        table.add(f"d{i}", "r", KEYS, [0], [f"d{i}-{j}" for j in range(3)])
    table.add("also", "r", KEYS._replace(receive_values=False), [0], ["d7-1", "x"])

    routed = table.audiences("r", "d7-1", 0)

    assert routed.individual == {}
    assert sorted((a.source, a.receive_values, sorted(a.clients)) for a in routed.audiences) == [
        (("key", "r", "d7-1"), False, ["also"]),
        (("key", "r", "d7-1"), True, ["d7"]),
    ]
    registrations = table._regions["r"].audiences
    assert registrations is not None and registrations.overlapping == frozenset()
    # Keys beside a regex or every key can match the same change: routed alone, as before.
    table.add("d3", "r", _regex("d3-.*", receive_values=False), [0])
    table.add("d5", "r", NO_VALUES, [0])
    assert table.audiences("r", "d3-0", 0).individual == {"d3": True, "d5": False}
    assert table.audiences("r", "d5-2", 0).individual == {"d5": True}
    assert _union(table, "r", "d3-0", 0) == {"d3": True, "d5": False}


def test_a_regex_audience_is_matched_once_and_a_key_audience_holds_that_keys_clients() -> None:
    table = InterestTable()
    for n in range(5):
        table.add(f"ua{n}", "r", _regex("UA-.*"), [0])
        table.add(f"key{n}", "r", KEYS, [0], ["UA-1"])
    routed = table.audiences("r", "UA-1", 0)
    assert {(a.source, len(a.clients)) for a in routed.audiences} == {
        (("regex", "r", "UA-.*"), 5),
        (("key", "r", "UA-1"), 5),
    }
    assert table.audiences("r", "DL-1", 0).audiences == ()


def test_audiences_reach_exactly_whom_a_walk_of_every_registration_reaches() -> None:
    import random

    rng = random.Random(7)
    table = InterestTable()
    keys = [f"k{i}" for i in range(6)]
    specs = [ALL, NO_VALUES, _regex("k[0-2]"), _regex("k.*", receive_values=False)]
    for n in range(40):
        client = f"c{n % 25}"
        buckets = rng.sample(range(4), rng.randint(1, 4))
        if rng.random() < 0.4:
            table.add(
                client,
                "r",
                KEYS._replace(receive_values=rng.random() < 0.5),
                buckets,
                rng.sample(keys, 2),
            )
        else:
            table.add(client, "r", rng.choice(specs), buckets)
        if rng.random() < 0.2:
            table.drop_client(f"c{rng.randrange(25)}")
        for key in keys:
            for bucket in range(4):
                assert _union(table, "r", key, bucket) == _reference_route(table, "r", key, bucket)


def _reference_route(table: InterestTable, region: str, key: str, bucket: int) -> dict[str, bool]:
    """A plain walk of every registration of the region (what routing did before it
    was by audiences): the oracle the audiences are checked against."""
    ri = table._regions.get(region)
    if ri is None:
        return {}
    out: dict[str, bool] = {}
    for client_id, reg in ri.all_keys.items():
        if bucket in reg.buckets:
            out[client_id] = reg.receive_values
    for client_id, reg in (ri.keys.get(key) or {}).items():
        if bucket in reg.buckets:
            out[client_id] = out.get(client_id, False) or reg.receive_values
    for (client_id, _), rreg in ri.regexes.items():
        if bucket in rreg.buckets and rreg.pattern.fullmatch(key) is not None:
            out[client_id] = out.get(client_id, False) or rreg.receive_values
    return out
