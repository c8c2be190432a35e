"""End-of-replay checks: Redis against the data, every desk against Redis.

- the ``flights`` region in Redis equals the state computed directly from the rows;
- the carrier desk's cache equals the server entries its regex matches;
- the airport desk's cache equals the server entries of its key list;
- the dashboard holds exactly the server keys of the day it shows last, all invalid.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from broker.store import RegionStore
from demo.flights_desks import REGION, DeskKind, DeskResult, DeskSpec

_EXAMPLES_SHOWN = 3


@dataclass(frozen=True)
class Check:
    """One verification.

    Attributes:
        name: What was compared.
        ok: Whether it matched.
        detail: The size, or what differed (with a few example keys).
    """

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Verification:
    """The end-of-replay checks."""

    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return all(c.ok for c in self.checks)


def read_region(redis_url: str, namespace: str, total_buckets: int) -> dict[str, Any]:
    """Every entry of region ``flights`` in Redis.

    Args:
        redis_url: Redis URL.
        namespace: Site namespace.
        total_buckets: The namespace's bucket count.

    Returns:
        ``{key: JSON-decoded value, or None when the entry is invalid}``.

    Raises:
        TransportError: Redis failed.
    """
    client = redis.Redis.from_url(redis_url)
    try:
        entries = RegionStore(client, namespace, total_buckets).entries(REGION)
    finally:
        client.close()
    return {k: json.loads(e.value) if e.value is not None else None for k, e in entries.items()}


def compare(name: str, actual: Mapping[str, Any], expected: Mapping[str, Any]) -> Check:
    """Compare two ``{key: value}`` maps.

    Returns:
        A passing check giving the size, or a failing one counting missing, unexpected and
        differing keys, with a few examples of each.
    """
    missing = [k for k in expected if k not in actual]
    extra = [k for k in actual if k not in expected]
    differing = [k for k in expected if k in actual and actual[k] != expected[k]]
    if not (missing or extra or differing):
        return Check(name, True, f"{len(actual):,} entries")
    parts = []
    for label, keys in (("missing", missing), ("unexpected", extra), ("differing", differing)):
        if keys:
            examples = ", ".join(sorted(keys)[:_EXAMPLES_SHOWN])
            parts.append(f"{len(keys):,} {label} (e.g. {examples})")
    return Check(name, False, "; ".join(parts))


def verify(
    server_state: Mapping[str, Any],
    expected_state: Mapping[str, Any],
    results: Mapping[DeskSpec, DeskResult],
) -> Verification:
    """Check the server against the data and every desk against the server.

    Args:
        server_state: Region ``flights`` as :func:`read_region` returns it.
        expected_state: :func:`demo.flights_data.expected_final_state` of the replayed rows.
        results: Each desk's final report.

    Returns:
        One check for the region, then one per desk.
    """
    checks = [compare("Redis region == state computed from the data", server_state, expected_state)]
    for spec, result in results.items():
        if spec.kind is DeskKind.CARRIER:
            assert spec.regex is not None
            pattern = re.compile(spec.regex)
            want = {k: v for k, v in server_state.items() if pattern.fullmatch(k)}
            name = f"{spec.name} == server entries matching {spec.regex}"
        elif spec.kind is DeskKind.AIRPORT:
            want = {k: server_state[k] for k in spec.keys if k in server_state}
            name = f"{spec.name} == server entries of its key list"
        elif result.shown_keys is None:
            checks.append(Check(spec.name, False, "no day was ever shown"))
            continue
        else:
            want = {k: None for k in result.shown_keys if k in server_state}
            name = f"{spec.name} == server keys of the day it shows, all invalid"
        checks.append(compare(name, result.entries, want))
    return Verification(tuple(checks))


__all__ = ["Check", "Verification", "compare", "read_region", "verify"]
