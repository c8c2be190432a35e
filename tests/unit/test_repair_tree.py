"""The pure parts of gateway repair's tree descent: the answers' bitmaps, the leaves sized to
a bucket, the packed versions, and the descent that reads one child's digest of two (the
Lua side is exercised against Redis by tests/integration/test_gateway_repair.py)."""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence
from typing import Any, cast

import pytest

from regionbus.gateways.repair_trees import (
    MAX_LEAF_BITS,
    differing_leaves,
    leaf_bits_for,
    set_bits,
    unpack_version,
)
from regionbus.schemas.redis_values import GatewayVersion


def test_the_answer_bitmap_names_nodes_from_the_first_bytes_high_bit() -> None:
    assert list(set_bits(b"")) == []
    assert list(set_bits(b"\x00\x00")) == []
    assert list(set_bits(b"\x80")) == [0]
    assert list(set_bits(b"\x01\x80")) == [7, 8]
    assert list(set_bits(b"\xff")) == list(range(8))


@pytest.mark.parametrize(
    ("entries", "bits"),
    [(0, 2), (1, 3), (125, 9), (62_500, 18), (1 << 30, MAX_LEAF_BITS)],
)
def test_leaves_are_about_four_an_entry_within_the_bounds(entries: int, bits: int) -> None:
    assert leaf_bits_for(entries) == bits


def test_a_packed_version_is_the_timestamp_in_six_bytes_and_the_site_in_one() -> None:
    ms = 1_764_412_345_678
    packed = struct.pack(">HIB", ms >> 32, ms & 0xFFFFFFFF, 7)  # as repair_entries.lua packs
    assert len(packed) == 7
    assert unpack_version(packed) == GatewayVersion(ms, 7)
    assert unpack_version(b"") is None


class _Tree:
    """One site's tree over its leaf digests (4-byte ints), as the Lua scripts compute it,
    counting the digests read from it."""

    def __init__(self, leaves: dict[int, int]) -> None:
        self.leaves = leaves
        self.read = 0
        self.asked: list[int] = []

    def digest(self, span: int, node: int) -> int:
        out = 0
        for leaf in range(node << span, (node + 1) << span):
            out ^= self.leaves.get(leaf, 0)
        return out

    def nodes(self, region: str, bucket: int, span: int, nodes: Sequence[int]) -> bytes:
        self.read += len(nodes)
        self.asked += nodes
        return b"".join(struct.pack(">i", self.digest(span, n)) for n in nodes)

    def differing(
        self, region: str, bucket: int, span: int, nodes: Sequence[int], theirs: bytes
    ) -> list[int]:
        mine = self.nodes(region, bucket, span, nodes)
        return [
            n for i, n in enumerate(nodes) if mine[i * 4 : i * 4 + 4] != theirs[i * 4 : i * 4 + 4]
        ]


def _digest(rng: random.Random) -> int:
    return struct.unpack(">i", rng.randbytes(4))[0]


@pytest.mark.parametrize("differences", [0, 1, 5, 40])
def test_the_descent_finds_exactly_the_differing_leaves_reading_one_child_of_two(
    differences: int,
) -> None:
    rng = random.Random(differences)
    leaf_bits = 10
    leaves = {leaf: _digest(rng) for leaf in rng.sample(range(1 << leaf_bits), 300)}
    other = dict(leaves)
    changed = set(rng.sample(sorted(leaves), differences))
    for leaf in changed:
        other[leaf] = _digest(rng)
    here, there = _Tree(leaves), _Tree(other)

    found = differing_leaves(cast(Any, here), cast(Any, there), "r", 0, leaf_bits)

    assert sorted(found) == sorted(changed)
    # the root, then for each differing node its left child only: never a right child
    assert here.asked[0] == 0 and all(n % 2 == 0 for n in here.asked[1:])
    assert here.read == 1 + sum(
        len({leaf >> span for leaf in changed}) for span in range(1, leaf_bits + 1)
    )
