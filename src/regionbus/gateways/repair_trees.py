"""The Merkle trees of a gateway repair (`regionbus.gateways.repair`), a site at a time: the
Lua steps that build a region bucket's tree in the site's own Redis, read its nodes or
compare them with the other site's, and read the differing leaves' entries; and the
descent from the roots to the differing leaves.

Only what these reads return leaves a site: ``SiteReader.received`` counts it, by step.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from regionbus.clients.settings import ClientSettings
from regionbus.schemas.naming import RedisKeys
from regionbus.schemas.redis_values import GatewayVersion, parse_gateway_version, parse_meta

MAX_LEAF_BITS = 24
"""Most leaves per bucket, as bits: 16,777,216 (the leaf is that many bits of SHA-1(key))."""
SPARE_LEAF_BITS = 2
"""Leaves per entry, as bits, when ``leaf_bits`` is sized to the bucket: four leaves an
entry. A differing leaf brings its other entries along (a key and version from each site,
~50 bytes each: on average ~1 at one leaf an entry, ~0.25 at four), and each further level
of the tree costs a differing key ~4 bytes."""
LOWEST_STORED_SPAN = 4
"""The tree's nodes covering fewer than 2^4 leaves are not stored: they are most of the
tree's nodes, and writing them took twice as long as the digest itself (measured on a
62,500-entry bucket). The few the descent asks for are computed from their leaves, at most
8 a node."""
NODES_PER_CALL = 4000
"""Most nodes one Lua call reads (Lua's ``unpack`` stack)."""
SCAN_COUNT = 1000
"""Entries each step of a Lua walk reads (a step holds Redis a few ms)."""
LEAF_HASH_TTL_S = 600
"""How long a run's leaves stay in Redis at most (deleted at the end of the bucket)."""
DIGEST_BYTES = 4
"""Bytes of a node's digest that cross between the sites: 32 bits. A difference under a
node hides behind equal digests with probability 2^-32 per comparison; every run salts
its hashes anew (``lua/repair_digest.lua``), so a difference one run missed is found by
the next. 64 bits would double the tree's share of the bytes moved."""
_SCRIPTS = {
    name: files("regionbus.gateways").joinpath(f"lua/{name}.lua").read_text()
    for name in ("repair_digest", "repair_tree", "repair_nodes", "repair_entries")
}


@dataclass(frozen=True)
class RepairSite:
    """One of the two sites: where its data is and how to reach its cache servers.

    Attributes:
        site_id: Its ``distributed_system_id`` (1-255).
        namespace: Its namespace.
        redis: A redis-py client of its Redis (``decode_responses=False``).
        client_settings: How to reach its cache servers (namespace, Kafka, security), for
            applying the changes it lost.
    """

    site_id: int
    namespace: str
    redis: Any
    client_settings: ClientSettings


class SiteReader:
    """The Lua steps of one site in one repair run, and its reads; counts the bytes of
    every answer read from the site by step (``received``).

    Args:
        site: The site.
        run_id: The run's id: its Redis keys, and the salt of its digests.
    """

    def __init__(self, site: RepairSite, run_id: str) -> None:
        self.site = site
        self.keys = RedisKeys(site.namespace)
        self._run_id = run_id
        self.received: Counter[str] = Counter()
        """Bytes of the answers read from this site (what left it), by step (see
        ``RepairReport.bytes_by_step``)."""
        self._digest = site.redis.register_script(_SCRIPTS["repair_digest"])
        self._tree = site.redis.register_script(_SCRIPTS["repair_tree"])
        self._nodes = site.redis.register_script(_SCRIPTS["repair_nodes"])
        self._entries = site.redis.register_script(_SCRIPTS["repair_entries"])

    def _leaf_hash(self, region: str, bucket: int) -> str:
        return f"{self.keys.bucket_prefix(bucket)}repair:{self._run_id}:{region}:leaves"

    def _node_hash(self, region: str, bucket: int) -> str:
        return f"{self.keys.bucket_prefix(bucket)}repair:{self._run_id}:{region}:nodes"

    def entry_count(self, region: str, bucket: int) -> int:
        """The bucket's entries here (valid or invalid)."""
        count = int(self.site.redis.hlen(self.keys.region_meta(region, bucket)))
        self.received["tree"] += len(str(count))
        return count

    def digest(self, region: str, bucket: int, leaf_bits: int) -> None:
        """Build the bucket's tree in this site's Redis: its ``2^leaf_bits`` leaves,
        ``SCAN_COUNT`` entries a Lua step, then the stored levels. Nothing leaves the site.

        Raises:
            redis.RedisError: this site's Redis failed.
        """
        cursor: Any = 0
        keys = [
            self.keys.region_meta(region, bucket),
            self.keys.region_gateway_versions(region, bucket),
            self._leaf_hash(region, bucket),
        ]
        while True:
            cursor = self._digest(
                keys, [cursor, SCAN_COUNT, leaf_bits, LEAF_HASH_TTL_S, self._run_id]
            )
            if int(cursor) == 0:
                break
        tree = [self._leaf_hash(region, bucket), self._node_hash(region, bucket)]
        self._tree(tree, [leaf_bits, LOWEST_STORED_SPAN, LEAF_HASH_TTL_S])

    def nodes(self, region: str, bucket: int, span_bits: int, nodes: Sequence[int]) -> bytes:
        """``DIGEST_BYTES`` of digest per node (see ``lua/repair_nodes.lua``)."""
        keys = [self._leaf_hash(region, bucket), self._node_hash(region, bucket)]
        out = bytearray()
        for start in range(0, len(nodes), NODES_PER_CALL):
            chunk = nodes[start : start + NODES_PER_CALL]
            out += self._nodes(keys, [span_bits, "", LOWEST_STORED_SPAN, *chunk])
        self.received["tree"] += len(out)
        return bytes(out)

    def differing(
        self, region: str, bucket: int, span_bits: int, nodes: Sequence[int], theirs: bytes
    ) -> list[int]:
        """The nodes whose digests here differ from ``theirs`` (the other site's, from
        :meth:`nodes`), compared in this site's Redis."""
        keys = [self._leaf_hash(region, bucket), self._node_hash(region, bucket)]
        out: list[int] = []
        for start in range(0, len(nodes), NODES_PER_CALL):
            chunk = nodes[start : start + NODES_PER_CALL]
            digests = theirs[start * DIGEST_BYTES : (start + len(chunk)) * DIGEST_BYTES]
            raw = self._nodes(keys, [span_bits, digests, LOWEST_STORED_SPAN, *chunk])
            self.received["tree"] += len(raw)
            out += [chunk[i] for i in set_bits(raw)]
        return out

    def entries(
        self, region: str, bucket: int, leaf_bits: int, leaves: Sequence[int]
    ) -> dict[str, GatewayVersion | None]:
        """``{key: gateway version (None: none kept)}`` of the bucket's entries in
        ``leaves`` here, read by walking the bucket in Lua steps.

        Raises:
            redis.RedisError: this site's Redis failed.
        """
        out: dict[str, GatewayVersion | None] = {}
        cursor: Any = 0
        keys = [
            self.keys.region_meta(region, bucket),
            self.keys.region_gateway_versions(region, bucket),
        ]
        while True:
            raw = self._entries(keys, [cursor, SCAN_COUNT, leaf_bits, *leaves])
            self.received["entries"] += sum(len(item) for item in raw)
            cursor = raw[0]
            for i in range(1, len(raw), 2):
                out[raw[i].decode()] = unpack_version(raw[i + 1])
            if int(cursor) == 0:
                return out

    def tombstones(
        self, region: str, bucket: int, keys: Sequence[str]
    ) -> list[GatewayVersion | None]:
        """The gateway version kept here for each of ``keys`` (a destroyed key's is its
        tombstone; None: no trace of it), in ``keys``' order.

        Raises:
            redis.RedisError: this site's Redis failed.
        """
        if not keys:
            return []
        raw = self.site.redis.hmget(self.keys.region_gateway_versions(region, bucket), list(keys))
        self.received["entries"] += sum(len(v or b"") for v in raw)
        return [parse_gateway_version(v) if v else None for v in raw]

    def values(
        self, region: str, bucket: int, keys: Sequence[str]
    ) -> list[tuple[bytes | None, str | None]]:
        """``(value, serializer)`` per key (value None: invalid or gone)."""
        if not keys:
            return []
        pipe = self.site.redis.pipeline(transaction=False)
        pipe.hmget(self.keys.region_values(region, bucket), list(keys))
        pipe.hmget(self.keys.region_meta(region, bucket), list(keys))
        values, metas = pipe.execute()
        self.received["values"] += sum(len(v or b"") for v in (*values, *metas))
        return [
            (value, parse_meta(meta).serializer if meta else None)
            for value, meta in zip(values, metas, strict=True)
        ]

    def drop(self, region: str, bucket: int) -> None:
        """Delete the run's tree of the bucket here (it would expire after
        ``LEAF_HASH_TTL_S`` anyway)."""
        self.site.redis.delete(self._leaf_hash(region, bucket), self._node_hash(region, bucket))


def set_bits(bitmap: bytes) -> Iterator[int]:
    """The positions of the set bits of ``lua/repair_nodes.lua``'s answer (the first
    position: the high bit of the first byte)."""
    for i, byte in enumerate(bitmap):
        for bit in range(8):
            if byte & (0x80 >> bit):
                yield i * 8 + bit


def leaf_bits_for(entries: int) -> int:
    """Leaves per bucket, as bits, for a bucket of ``entries`` entries (the larger site's):
    ``SPARE_LEAF_BITS`` more than the bits of ``entries``, 1 to ``MAX_LEAF_BITS``."""
    return max(1, min(MAX_LEAF_BITS, entries.bit_length() + SPARE_LEAF_BITS))


def unpack_version(packed: bytes) -> GatewayVersion | None:
    """A gateway version as ``lua/repair_entries.lua`` packs it (None: b"", no version)."""
    if not packed:
        return None
    high, low, site_id = struct.unpack(">HIB", packed)
    return GatewayVersion((high << 32) | low, site_id)


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def differing_leaves(
    here: SiteReader, there: SiteReader, region: str, bucket: int, leaf_bits: int
) -> list[int]:
    """Descend both trees from the root, into the children of differing nodes only: one
    site's digests of a level go to the other, which answers which of its own differ.
    Of each two children, one site reads the left one's digest only; the right one's
    is the parent's XOR it.

    Returns:
        The leaves whose digests differ, in ascending order.

    Raises:
        redis.RedisError: either site's Redis failed.
    """
    span = leaf_bits
    nodes = [0]
    digests = here.nodes(region, bucket, span, nodes)
    while True:
        differing = there.differing(region, bucket, span, nodes, digests)
        if span == 0 or not differing:
            return differing
        parent = {
            n: digests[i * DIGEST_BYTES : (i + 1) * DIGEST_BYTES] for i, n in enumerate(nodes)
        }
        span -= 1
        lefts = here.nodes(region, bucket, span, [n << 1 for n in differing])
        nodes, pairs = [], bytearray()
        for i, n in enumerate(differing):
            left = lefts[i * DIGEST_BYTES : (i + 1) * DIGEST_BYTES]
            nodes += [n << 1, (n << 1) + 1]
            pairs += left + _xor(parent[n], left)
        digests = bytes(pairs)


__all__ = [
    "DIGEST_BYTES",
    "LEAF_HASH_TTL_S",
    "LOWEST_STORED_SPAN",
    "MAX_LEAF_BITS",
    "NODES_PER_CALL",
    "SCAN_COUNT",
    "SPARE_LEAF_BITS",
    "RepairSite",
    "SiteReader",
    "differing_leaves",
    "leaf_bits_for",
    "set_bits",
    "unpack_version",
]
