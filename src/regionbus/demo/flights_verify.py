"""End-of-replay checks: Redis against the data, every desk against Redis.

- the ``flights`` region in Redis equals the state computed directly from the rows;
- the carrier desk's cache equals the server entries its regex matches;
- the airport desk's cache equals the server entries of its key list;
- the dashboard holds exactly the server keys of the day it shows last, all invalid;
- the CQ desk's checks (live result sets against pandas) are
  :func:`regionbus.demo.flights_cq_desk.verify_cq_desk`'s;
- the durable operations desk (docs/behaviour.md §5) got, over both its connections, every change of
  each of its keys exactly once and in order (strictly increasing versions, as many as
  the key's operations), in phases that never go backwards (first connection, replay
  before the marker, live), with a non-empty replay when it was away;
  ``after_region_live`` fired once per connection; replay left its cache alone (at the
  marker its new, empty cache holds only what the live events before the marker made
  of it); and at the end its cache equals the server entries of the keys it got live
  events for. Keys whose every change came as replay are not in its cache: replay never
  changes the cache, and the reconnection loads nothing (it does not register again).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from regionbus.broker.store import RegionStore
from regionbus.demo.flights_desks import REGION, DeskKind, DeskResult, DeskSpec, DurableLog, Phase
from regionbus.runtime.redis_connect import connect_redis_url

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
    client = connect_redis_url(redis_url)
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


def _examples(keys: list[str]) -> str:
    return ", ".join(sorted(keys)[:_EXAMPLES_SHOWN])


def verify_durable(
    spec: DeskSpec,
    log: DurableLog,
    entries: Mapping[str, Any],
    server_state: Mapping[str, Any],
    operations_by_key: Mapping[str, int],
) -> list[Check]:
    """Check what the durable operations desk saw (see the module docstring).

    Args:
        spec: The desk's spec (its ``keys`` are its durable interest).
        log: What it recorded over both connections.
        entries: Its cache at the end.
        server_state: Region ``flights`` as :func:`read_region` returns it.
        operations_by_key: Operations the replay made on each key.

    Returns:
        Five checks: events once and in order, phases, ``after_region_live``, replay left
        the cache alone, final cache.
    """
    name = spec.name
    by_key: dict[str, list[tuple[int, Phase]]] = {}
    for key, version, phase in log.events:
        by_key.setdefault(key, []).append((version, phase))
    wrong_count, unordered, backwards = [], [], []
    for key in dict.fromkeys(spec.keys):
        seen = by_key.pop(key, [])
        if len(seen) != operations_by_key.get(key, 0):
            wrong_count.append(key)
        if any(a[0] >= b[0] for a, b in itertools.pairwise(seen)):
            unordered.append(key)
        if any(a[1] > b[1] for a, b in itertools.pairwise(seen)):
            backwards.append(key)
    foreign = list(by_key)
    problems = [
        f"{len(keys):,} {label} (e.g. {_examples(keys)})"
        for label, keys in (
            ("keys seen more or less often than they changed", wrong_count),
            ("keys with versions not strictly increasing", unordered),
            ("keys outside its interest", foreign),
        )
        if keys
    ]
    checks = [
        Check(
            f"{name}: every change of its keys once, versions strictly increasing",
            not problems,
            "; ".join(problems) or f"{len(log.events):,} events on {len(spec.keys):,} keys",
        )
    ]

    phases = [phase for _, _, phase in log.events]
    counts = {p: phases.count(p) for p in Phase}
    summary = (
        f"{counts[Phase.CONNECTED]:,} before it left, {counts[Phase.REPLAY]:,} replayed "
        f"({log.client_state}, {log.pending_event_count:,} pending at reconnect), "
        f"{counts[Phase.LIVE]:,} live"
        if log.away
        else f"{counts[Phase.CONNECTED]:,} while connected throughout (replay too short to leave)"
    )
    phase_problems = []
    if backwards:
        phase_problems.append(
            f"{len(backwards):,} keys went back a phase (e.g. {_examples(backwards)})"
        )
    if log.away and (counts[Phase.REPLAY] == 0 or log.client_state != "RECONNECTED"):
        phase_problems.append("away, but nothing was replayed or the queue was not kept")
    if not log.away and counts[Phase.REPLAY]:
        phase_problems.append("never away, yet events were replayed")
    checks.append(
        Check(
            f"{name}: phases in order per key (before leaving, replay before the marker, live)",
            not phase_problems,
            "; ".join([*phase_problems, summary]),
        )
    )

    expected_calls = [1, 1] if log.away else [1]
    checks.append(
        Check(
            f"{name}: after_region_live once per connection",
            log.live_calls == expected_calls,
            f"calls per connection: {log.live_calls}",
        )
    )

    if log.cache_at_live is None:
        checks.append(Check(f"{name}: replay left the cache alone", False, "no marker seen"))
    else:
        at_live = compare(
            f"{name}: replay left the cache alone (cache at the marker == live events before it)",
            log.cache_at_live,
            log.applied_before_live,
        )
        checks.append(at_live)

    applied = Phase.LIVE if log.away else Phase.CONNECTED
    live_keys = {key for key, _, phase in log.events if phase is applied}
    want = {k: server_state[k] for k in spec.keys if k in server_state and k in live_keys}
    checks.append(compare(f"{name} == server entries of its keys with live events", entries, want))
    return checks


def verify(
    server_state: Mapping[str, Any],
    expected_state: Mapping[str, Any],
    results: Mapping[DeskSpec, DeskResult],
    operations_by_key: Mapping[str, int] | None = None,
) -> Verification:
    """Check the server against the data and every desk against the server.

    Args:
        server_state: Region ``flights`` as :func:`read_region` returns it.
        expected_state: :func:`regionbus.demo.flights_data.expected_final_state` of the replayed
        rows.
        results: Each desk's final report.
        operations_by_key: Operations the replay made on each key (needed for the
            operations desk; an empty map when None).

    Returns:
        One check for the region, then one per desk (five for the operations desk).
    """
    checks = [compare("Redis region == state computed from the data", server_state, expected_state)]
    for spec, result in results.items():
        if spec.kind is DeskKind.CQ:
            continue  # its checks need the rows: regionbus.demo.flights_cq_desk.verify_cq_desk
        if spec.kind is DeskKind.OPERATIONS:
            if result.durable is None:
                checks.append(Check(spec.name, False, "no durable log reported"))
            else:
                checks.extend(
                    verify_durable(
                        spec,
                        result.durable,
                        result.entries,
                        server_state,
                        operations_by_key or {},
                    )
                )
            continue
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


__all__ = ["Check", "Verification", "compare", "read_region", "verify", "verify_durable"]
