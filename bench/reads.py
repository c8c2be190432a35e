"""``bench.core``'s read phases, (g) ``get_all`` and (q) a one-shot OQL query, each beside
raw Redis reading the same entries where the servers store them (the workload:
:mod:`bench.reads_figures`; Apache Geode's side: ``bench.peers.geode``).

Every call is made one at a time from this process, on a ``PROXY`` region (no local copy:
each ``get_all`` reads the servers, as a Geode ``PROXY`` client region's ``getAll`` does):

(g) ``Region.get_all`` of ``keys_per_call`` random keys, beside the raw read of those keys'
    values from the values hashes of their buckets (``HMGET`` per bucket, in one pipeline:
    the ``MGET`` of the servers' hash layout);
(q) ``query_service().new_query(QUERY_OQL).execute(QUERY_MIN_PRICE)`` over ``entries``
    JSON documents, beside ``HSCAN`` of every bucket's values hash, each value decoded and
    filtered in Python.

Both sides must answer the same: every key's value, and the same number of rows each run
(otherwise the run fails with :class:`BenchError`).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from bench.reads_figures import (
    GET_ALL_KEY_PREFIX,
    QUERY_KEY_PREFIX,
    QUERY_MIN_PRICE,
    QUERY_OQL,
    QUERY_REGION,
    ReadFigures,
    ReadOptions,
    ReadSeries,
    query_document,
    selected_rows,
    timed_calls,
    warmup_count,
)
from bench.server import BenchError
from bench.services import REGION, BenchOptions, Services
from bench.workers import stamped_value
from regionbus.clients import BytesSerializer, ClientCache, ClientRegionShortcut, ClientSettings
from regionbus.runtime.redis_connect import connect_redis_url
from regionbus.schemas.naming import DEFAULT_TOTAL_BUCKETS, RedisKeys, bucket_of

_FILL_CHUNK: Final = 1_000
"""Entries of one ``put_all`` while pre-filling."""

_HSCAN_COUNT: Final = 500
"""The raw scan's ``COUNT`` hint: the page the servers' query reads take
(``regionbus.broker.queries.PAGE_ENTRIES``)."""

_SEED: Final = 39

_READ_TIMEOUT_MS: Final = 60_000
"""The read phases' client waits this long for a reply (the default is 10 s): a bound
for a shared, loaded machine, where a pre-filling ``put_all`` of 1,000 entries can take
longer. It bounds a failure only; the figures are the calls' own times."""


def key_samples(options: ReadOptions) -> list[list[str]]:
    """The keys of every ``get_all`` call, warm-up first: ``keys_per_call`` distinct keys of
    the pre-filled ones each, the same every run (a fixed seed)."""
    rng = random.Random(_SEED)
    count = warmup_count(options.calls) + options.calls
    population = range(options.entries)
    return [
        [f"{GET_ALL_KEY_PREFIX}{i}" for i in rng.sample(population, options.keys_per_call)]
        for _ in range(count)
    ]


def _fill(region: Any, entries: dict[str, Any]) -> None:
    items = list(entries.items())
    for start in range(0, len(items), _FILL_CHUNK):
        region.put_all(dict(items[start : start + _FILL_CHUNK]))


class _RawReads:
    """The raw Redis side: the servers' own hashes, read without a server in the way."""

    def __init__(self, redis_url: str, namespace: str) -> None:
        self._redis = connect_redis_url(redis_url)
        self._keys = RedisKeys(namespace)

    def close(self) -> None:
        self._redis.close()

    def get_all(self, keys: list[str]) -> int:
        """The values of ``keys``: ``HMGET`` of each bucket's values hash, one pipeline;
        how many are present."""
        by_bucket: dict[int, list[str]] = {}
        for key in keys:
            by_bucket.setdefault(bucket_of(REGION, key, DEFAULT_TOTAL_BUCKETS), []).append(key)
        pipe = self._redis.pipeline(transaction=False)
        for bucket, bucket_keys in by_bucket.items():
            pipe.hmget(self._keys.region_values(REGION, bucket), bucket_keys)
        return sum(v is not None for values in pipe.execute() for v in values)

    def query(self) -> int:
        """The rows of the query: every bucket's values hash scanned, each value decoded and
        filtered here; how many."""
        rows = []
        for bucket in range(DEFAULT_TOTAL_BUCKETS):
            values_key = self._keys.region_values(QUERY_REGION, bucket)
            for _key, raw in self._redis.hscan_iter(values_key, count=_HSCAN_COUNT):
                value = json.loads(raw)
                if value["price"] >= QUERY_MIN_PRICE:
                    rows.append(value)
        return len(rows)


def _check(name: str, series: ReadSeries, expected: int) -> None:
    if series.items != expected:
        raise BenchError(f"{name} answered {series.items:,} values, expected {expected:,}")


def run_reads(services: Services, bench: BenchOptions, options: ReadOptions) -> ReadFigures:
    """Pre-fill the two regions, then run phases (g) and (q), each beside raw Redis.

    Args:
        services: The run's Kafka and Redis, and its namespace (a cache server of it
            defines regions ``bench`` and :data:`QUERY_REGION`).
        bench: The client settings of the run (fetch wait, linger).
        options: The sizes.

    Raises:
        BenchError: a side did not answer every key, or not the rows expected.
        RegionBusError: a call failed.
    """
    load_average = os.getloadavg()
    settings = services.client_settings(
        bench, subscription_enabled=False, read_timeout_ms=_READ_TIMEOUT_MS
    )
    cache = ClientCache(ClientSettings(**settings))
    raw = _RawReads(services.redis_url, services.namespace)
    try:
        values = cache.create_region(
            REGION, ClientRegionShortcut.PROXY, serializer=BytesSerializer()
        )
        documents = cache.create_region(QUERY_REGION, ClientRegionShortcut.PROXY)
        _fill(
            values,
            {
                f"{GET_ALL_KEY_PREFIX}{i}": stamped_value(options.value_bytes)
                for i in range(options.entries)
            },
        )
        _fill(
            documents, {f"{QUERY_KEY_PREFIX}{i}": query_document(i) for i in range(options.entries)}
        )
        samples = key_samples(options)
        warmup = warmup_count(options.calls)

        def present(found: dict[str, Any]) -> int:
            return sum(v is not None for v in found.values())

        get_all = timed_calls(
            [_bound(lambda keys: present(values.get_all(keys)), keys) for keys in samples], warmup
        )
        raw_get_all = timed_calls([_bound(raw.get_all, keys) for keys in samples], warmup)
        query = cache.query_service().new_query(QUERY_OQL)
        runs = warmup_count(options.query_runs) + options.query_runs
        query_warmup = warmup_count(options.query_runs)
        rb_query = timed_calls([lambda: len(query.execute(QUERY_MIN_PRICE))] * runs, query_warmup)
        raw_query = timed_calls([raw.query] * runs, query_warmup)
    finally:
        raw.close()
        cache.close()
    rows = selected_rows(options.entries)
    every_key = options.calls * options.keys_per_call
    _check("get_all", get_all, every_key)
    _check("raw Redis HMGET", raw_get_all, every_key)
    _check("the OQL query", rb_query, rows * options.query_runs)
    _check("the raw HSCAN", raw_query, rows * options.query_runs)
    return ReadFigures(options, get_all, raw_get_all, rb_query, raw_query, rows, (*load_average,))


def _bound(call: Callable[[list[str]], int], keys: list[str]) -> Callable[[], int]:
    return lambda: call(keys)


def print_reads(figures: ReadFigures, console: Console) -> None:
    """Print phases (g) and (q) beside raw Redis: rate, p50, p99 and the ratios."""
    options = figures.options
    load = " ".join(f"{x:.1f}" for x in figures.load_average)
    table = Table(
        title=f"(g) get_all of {options.keys_per_call} keys and (q) an OQL query over "
        f"{options.entries:,} entries ({figures.rows:,} rows), beside raw Redis "
        f"(load average before: {load})"
    )
    for column in ("figure", "regionbus", "raw Redis", "ratio"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for name, ours, theirs in (
        ("get_all", figures.get_all, figures.raw_get_all),
        ("query", figures.query, figures.raw_query),
    ):
        table.add_row(
            f"{name} calls/s",
            _rate(ours.per_s),
            _rate(theirs.per_s),
            _x(ours.per_s, theirs.per_s),
        )
        for pct in ("p50", "p99"):
            a, b = getattr(ours, f"{pct}_ms"), getattr(theirs, f"{pct}_ms")
            table.add_row(f"{name} {pct} (ms)", f"{a:.2f}", f"{b:.2f}", _x(a, b))
    console.print(table)


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


__all__ = ["key_samples", "print_reads", "run_reads"]
