"""The bucket election's choices, without Redis: who takes a free bucket, who becomes a
secondary, which buckets an overloaded server hands over (docs/behaviour.md §4)."""

from __future__ import annotations

from regionbus.broker.buckets import (
    BucketView,
    buckets_to_hand_over,
    choose_taker,
    secondary_candidates,
)

RANK = {"old": 0, "mid": 1, "new": 2}
LIVE = set(RANK)


def test_a_live_handoff_receiver_takes_the_bucket_before_any_secondary() -> None:
    taker = choose_taker("new", ["old"], LIVE, {"old": 0, "mid": 0, "new": 5}, RANK)
    assert taker == "new"


def test_a_dead_handoff_receiver_is_ignored_for_the_longest_lived_secondary() -> None:
    assert choose_taker("gone", ["mid", "new"], LIVE, dict.fromkeys(LIVE, 0), RANK) == "mid"


def test_without_secondaries_the_member_with_fewest_primaries_takes_it_the_older_on_a_tie() -> None:
    primaries = {"old": 3, "mid": 1, "new": 1}
    assert choose_taker(None, [], LIVE, primaries, RANK) == "mid"
    assert choose_taker(None, [], set(), {}, {}) is None


def test_a_short_bucket_gets_the_members_with_fewest_secondaries_never_its_primary() -> None:
    view = BucketView(bucket=3, primary="old", epoch=7, secondaries=())
    secondaries_of = {"old": 0, "mid": 2, "new": 1}
    assert secondary_candidates(view, 1, LIVE, secondaries_of, RANK) == ["new"]
    assert secondary_candidates(view, 2, LIVE, secondaries_of, RANK) == ["new", "mid"]


def test_a_full_or_primaryless_bucket_gets_no_new_secondary() -> None:
    full = BucketView(bucket=1, primary="old", epoch=1, secondaries=("mid",))
    assert secondary_candidates(full, 1, LIVE, dict.fromkeys(LIVE, 0), RANK) == []
    free = BucketView(bucket=2, primary=None, epoch=0, secondaries=())
    assert secondary_candidates(free, 1, LIVE, dict.fromkeys(LIVE, 0), RANK) == []


def test_an_overloaded_server_hands_its_highest_buckets_to_the_least_loaded() -> None:
    owned = range(16)
    out = buckets_to_hand_over("old", owned, {"old": 16, "mid": 0}, RANK, 16)
    assert out == {
        15: "mid",
        14: "mid",
        13: "mid",
        12: "mid",
        11: "mid",
        10: "mid",
        9: "mid",
        8: "mid",
    }


def test_servers_one_bucket_apart_keep_their_buckets() -> None:
    primaries = {"old": 6, "mid": 5, "new": 5}
    assert buckets_to_hand_over("old", range(6), primaries, RANK, 16) == {}
    assert buckets_to_hand_over("old", range(16), {"old": 16}, {"old": 0}, 16) == {}
