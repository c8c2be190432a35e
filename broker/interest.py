"""The interest registry: which client wants which entries, and routing events by it.

Each server keeps the registry in memory for routing and in Redis for failover and
durable clients. A registration is installed bucket by bucket, in the order of that
bucket's operations, so routing in a bucket starts exactly where its bulk-load snapshot
was taken (invariant 3 of ARCHITECTURE.md). The server routes to the **union** of a
client's registrations; a client gets values when any matching registration has
``receive_values=True`` (SPEC §3).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis

from broker.store import redis_errors
from schemas.errors import InvalidInterestError
from schemas.messages import InterestKind, InterestSpec
from schemas.naming import RedisKeys


def compile_interest_regex(pattern: str | None) -> re.Pattern[str]:
    """Compile a registration regex (matched against the whole key, as Geode's ``matches()``).

    Raises:
        InvalidInterestError: the pattern is missing or does not compile.
    """
    if pattern is None:
        raise InvalidInterestError("a REGEX registration needs a pattern")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise InvalidInterestError(f"invalid interest regex {pattern!r}: {exc}") from exc


@dataclass(slots=True)
class _Registration:
    receive_values: bool
    durable: bool
    buckets: set[int]


@dataclass(slots=True)
class _RegexRegistration(_Registration):
    pattern: re.Pattern[str] = field(default_factory=lambda: re.compile(""))


@dataclass(slots=True)
class _RegionInterest:
    all_keys: dict[str, _Registration] = field(default_factory=dict)
    keys: dict[str, dict[str, _Registration]] = field(default_factory=dict)
    regexes: dict[tuple[str, str], _RegexRegistration] = field(default_factory=dict)

    def clients(self) -> set[str]:
        out = set(self.all_keys)
        for by_client in self.keys.values():
            out.update(by_client)
        out.update(client for client, _ in self.regexes)
        return out


def _field(region: str, kind: InterestKind, item: str) -> str:
    return f"{region}\x00{kind.value}\x00{item}"


class InterestRegistry:
    """In-memory interest registry of one server, persisted in Redis.

    Args:
        client: redis-py client (``decode_responses=False``).
        namespace: The site namespace.
        total_buckets: Number of buckets (registrations loaded from Redis are active in all).
    """

    def __init__(self, client: redis.Redis, namespace: str, total_buckets: int) -> None:
        self._redis = client
        self._keys = RedisKeys(namespace)
        self._all_buckets = frozenset(range(total_buckets))
        self._regions: dict[str, _RegionInterest] = {}

    # --- changes -----------------------------------------------------------------------

    def register(
        self, client_id: str, region: str, spec: InterestSpec, bucket: int, keys: Iterable[str]
    ) -> None:
        """Install a registration for one bucket and persist it.

        Args:
            client_id: The subscriber (its queue is ``{ns}.queue.<client_id>``).
            region: Region name.
            spec: The registration.
            bucket: The bucket whose operations are routed by it from now on.
            keys: For a KEYS spec, the keys of this bucket.

        Raises:
            InvalidInterestError: a REGEX spec whose pattern does not compile.
            TransportError: Redis failed.
        """
        ri = self._regions.setdefault(region, _RegionInterest())
        record = {"receive_values": spec.receive_values, "durable": spec.durable}
        stored: dict[str | bytes, bytes | float | int | str] = {}
        if spec.kind is InterestKind.ALL_KEYS:
            self._activate(ri.all_keys, client_id, spec, bucket)
            stored[_field(region, spec.kind, "")] = json.dumps(record)
        elif spec.kind is InterestKind.REGEX:
            pattern = compile_interest_regex(spec.regex)
            reg = ri.regexes.get((client_id, pattern.pattern))
            if reg is None:
                reg = _RegexRegistration(spec.receive_values, spec.durable, set(), pattern)
                ri.regexes[(client_id, pattern.pattern)] = reg
            reg.receive_values = reg.receive_values or spec.receive_values
            reg.durable = reg.durable or spec.durable
            reg.buckets.add(bucket)
            stored[_field(region, spec.kind, pattern.pattern)] = json.dumps(record)
        else:
            for key in keys:
                self._activate(ri.keys.setdefault(key, {}), client_id, spec, bucket)
                stored[_field(region, spec.kind, key)] = json.dumps(record)
        if stored:
            with redis_errors():
                self._redis.hset(self._keys.interest(client_id), mapping=stored)

    @staticmethod
    def _activate(
        table: dict[str, _Registration], client_id: str, spec: InterestSpec, bucket: int
    ) -> None:
        reg = table.get(client_id)
        if reg is None:
            table[client_id] = _Registration(spec.receive_values, spec.durable, {bucket})
            return
        reg.receive_values = reg.receive_values or spec.receive_values
        reg.durable = reg.durable or spec.durable
        reg.buckets.add(bucket)

    def unregister(self, client_id: str, region: str, spec: InterestSpec) -> None:
        """Remove a registration (all its buckets) from memory and Redis.

        KEYS removes those keys, ALL_KEYS the all-keys registration, REGEX that pattern.

        Raises:
            TransportError: Redis failed.
        """
        ri = self._regions.get(region)
        fields: list[str] = []
        if spec.kind is InterestKind.ALL_KEYS:
            if ri:
                ri.all_keys.pop(client_id, None)
            fields.append(_field(region, spec.kind, ""))
        elif spec.kind is InterestKind.REGEX:
            pattern = spec.regex or ""
            if ri:
                ri.regexes.pop((client_id, pattern), None)
            fields.append(_field(region, spec.kind, pattern))
        else:
            for key in spec.keys:
                if ri and key in ri.keys:
                    ri.keys[key].pop(client_id, None)
                    if not ri.keys[key]:
                        del ri.keys[key]
                fields.append(_field(region, spec.kind, key))
        if fields:
            with redis_errors():
                self._redis.hdel(self._keys.interest(client_id), *fields)

    def drop_client(self, client_id: str, *, keep_durable: bool = False) -> None:
        """Forget a client's registrations (all, or all but the durable ones).

        Raises:
            TransportError: Redis failed.
        """
        for ri in self._regions.values():
            reg = ri.all_keys.get(client_id)
            if reg is not None and not (keep_durable and reg.durable):
                del ri.all_keys[client_id]
            for key in list(ri.keys):
                reg = ri.keys[key].get(client_id)
                if reg is not None and not (keep_durable and reg.durable):
                    del ri.keys[key][client_id]
                    if not ri.keys[key]:
                        del ri.keys[key]
            for rk in [rk for rk in ri.regexes if rk[0] == client_id]:
                if not (keep_durable and ri.regexes[rk].durable):
                    del ri.regexes[rk]
        with redis_errors():
            if not keep_durable:
                self._redis.delete(self._keys.interest(client_id))
                return
            stored = self._redis.hgetall(self._keys.interest(client_id))
            gone = [f for f, v in stored.items() if not json.loads(v).get("durable")]
            if gone:
                self._redis.hdel(self._keys.interest(client_id), *gone)

    def load(self, client_ids: Iterable[str]) -> int:
        """Load the persisted registrations of these clients, active in every bucket.

        Returns:
            How many registrations were loaded.

        Raises:
            TransportError: Redis failed.
        """
        count = 0
        for client_id in client_ids:
            with redis_errors():
                stored = self._redis.hgetall(self._keys.interest(client_id))
            for raw_field, raw_value in stored.items():
                region, kind_name, item = raw_field.decode().split("\x00", 2)
                record = json.loads(raw_value)
                kind = InterestKind(kind_name)
                ri = self._regions.setdefault(region, _RegionInterest())
                buckets = set(self._all_buckets)
                rv, durable = bool(record["receive_values"]), bool(record["durable"])
                if kind is InterestKind.ALL_KEYS:
                    ri.all_keys[client_id] = _Registration(rv, durable, buckets)
                elif kind is InterestKind.REGEX:
                    ri.regexes[(client_id, item)] = _RegexRegistration(
                        rv, durable, buckets, compile_interest_regex(item)
                    )
                else:
                    ri.keys.setdefault(item, {})[client_id] = _Registration(rv, durable, buckets)
                count += 1
        return count

    # --- routing -----------------------------------------------------------------------

    def route(self, region: str, key: str, bucket: int) -> dict[str, bool]:
        """The clients interested in a change of one entry.

        Args:
            region: Region name.
            key: Entry key.
            bucket: The bucket the change was applied in.

        Returns:
            ``{client_id: receive_values}`` for every client with a registration active in
            that bucket that matches the key (union; values if any match wants them).
        """
        ri = self._regions.get(region)
        if ri is None:
            return {}
        out: dict[str, bool] = {}
        for client_id, reg in ri.all_keys.items():
            if bucket in reg.buckets:
                out[client_id] = reg.receive_values
        by_key = ri.keys.get(key)
        if by_key:
            for client_id, reg in by_key.items():
                if bucket in reg.buckets:
                    out[client_id] = out.get(client_id, False) or reg.receive_values
        for (client_id, _), rreg in ri.regexes.items():
            if bucket in rreg.buckets and (
                not out.get(client_id) and rreg.pattern.fullmatch(key) is not None
            ):
                out[client_id] = out.get(client_id, False) or rreg.receive_values
        return out

    def clients_of_region(self, region: str) -> set[str]:
        """Every client with any interest in the region (receives region clear/destroy)."""
        ri = self._regions.get(region)
        return ri.clients() if ri else set()

    def forget_region(self, region: str) -> None:
        """Drop in-memory routing of a destroyed region (Redis records are left for durables)."""
        self._regions.pop(region, None)

    def matches(self, spec: InterestSpec, key: str) -> bool:
        """Whether a key is covered by one spec (used to filter bulk-load snapshots)."""
        if spec.kind is InterestKind.ALL_KEYS:
            return True
        if spec.kind is InterestKind.REGEX:
            return compile_interest_regex(spec.regex).fullmatch(key) is not None
        return key in spec.keys


__all__ = ["InterestRegistry", "compile_interest_regex"]
