"""One-shot OQL queries (Geode ``QueryService.newQuery(oql).execute(params)``) end to end
against a real Kafka and Redis: projections, ORDER BY, LIMIT and bind parameters run on
every bucket's primary and merged by the client; typed errors for an invalid query and for
one over the servers' time or row budget; and results equal to a plain-Python evaluation
of the same query over the entries Redis holds, on random entries.

The random-entries test loads ``REGIONBUS_OQL_ENTRIES`` entries: by default 20,000, some
40-65 s on the shared 2-core machine, most of it the ``put_all`` (about 1,100 entries/s;
the queries take about 1 s per 20,000 entries). The issue's 100,000 is
``REGIONBUS_OQL_ENTRIES=100000`` (passed in 310 s there).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import dead_letters

from regionbus import (
    QueryExecutionTimeoutError,
    QueryFunctionDomainError,
    QueryInvalidError,
    QueryRowLimitError,
    QueryService,
    QueryTypeMismatchError,
    RegionNotFoundError,
    Struct,
)
from regionbus.aio import AsyncClientCache, AsyncRegion
from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ClientCache
from regionbus.schemas.serializers import JsonSerializer

ENTRIES: int = int(os.environ.get("REGIONBUS_OQL_ENTRIES", "20000"))
"""Entries of the random-entries test (the issue's figure is 100,000)."""

_FLIGHTS: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "data" / "oql_flights.json").read_text()
)


@pytest.fixture
def flights(cache_server: CacheServer, client_factory: Callable[..., ClientCache]) -> ClientCache:
    """A client whose region ``r`` holds the six flights on the server."""
    cache = client_factory()
    cache.create_region("r").put_all(_FLIGHTS)
    return cache


@pytest.mark.redis_modes
def test_projections_order_by_limit_and_parameters(flights: ClientCache) -> None:
    service = flights.query_service()
    origins = service.new_query("SELECT f.origin FROM /r f WHERE f.carrier = $1 ORDER BY f.origin")
    assert origins.execute("AA") == ["JFK", "SFO"]
    assert origins.execute("UA") == ["LAX", "SFO"]
    rows = service.new_query(
        "SELECT e.key, e.value.delay AS d FROM /r.entries e "
        "WHERE e.value.origin IN $1 ORDER BY e.value.delay DESC LIMIT $2"
    ).execute(["SFO", "LAX", "BOS"], 4)
    # DESC: numbers high first, then UNDEFINED (f5 has no delay), then null (f4).
    assert rows == [
        Struct(("key", "d"), ("f1", 10)),
        Struct(("key", "d"), ("f6", 7)),
        Struct(("key", "d"), ("f3", 0)),
        Struct(("key", "d"), ("f5", QueryService.UNDEFINED)),
    ]
    everything = service.new_query("SELECT * FROM /r x WHERE x.delay >= 0").execute()
    assert sorted(everything, key=lambda v: v["delay"]) == [
        _FLIGHTS[k] for k in ("f3", "f6", "f1", "f2")
    ]
    assert len(service.new_query("SELECT * FROM /r LIMIT 3").execute()) == 3
    keys = service.new_query("SELECT k FROM /r.keys k WHERE k <> 'f2' ORDER BY k DESC").execute()
    assert keys == ["f6", "f5", "f4", "f3", "f1"]
    count = service.new_query("SELECT COUNT(*) FROM /r x WHERE x.origin = $1")
    assert count.execute("SFO") == [3]
    assert count.execute("ORD") == [0]


@pytest.mark.redis_modes
def test_distinct_aggregates_and_group_by_merge_every_bucket_s_answer(
    flights: ClientCache,
) -> None:
    service = flights.query_service()
    origins = service.new_query("SELECT DISTINCT x.origin FROM /r x ORDER BY x.origin LIMIT $1")
    assert origins.execute(3) == ["BOS", "JFK", "LAX"]
    assert sorted(service.new_query("SELECT DISTINCT x.origin FROM /r x").execute()) == [
        "BOS",
        "JFK",
        "LAX",
        "SFO",
    ]
    totals = service.new_query(
        "SELECT COUNT(*) AS n, COUNT(x.delay) AS c, SUM(x.delay) AS s, AVG(x.delay) AS a, "
        "MIN(x.delay) AS lo, MAX(x.delay) AS hi, COUNT(DISTINCT x.origin) AS d FROM /r x"
    ).execute()
    names = ("n", "c", "s", "a", "lo", "hi", "d")
    assert totals == [Struct(names, (6, 4, 62, 15.5, 0, 45, 4))]
    by_origin = service.new_query(
        "SELECT x.origin, COUNT(*) AS n, SUM(x.delay) AS total FROM /r x "
        "WHERE x.carrier <> $1 GROUP BY x.origin ORDER BY n DESC, x.origin"
    ).execute("B6")
    assert by_origin == [
        Struct(("origin", "n", "total"), ("SFO", 3, 10)),
        Struct(("origin", "n", "total"), ("JFK", 1, 45)),
        Struct(("origin", "n", "total"), ("LAX", 1, 0)),
    ]
    with pytest.raises(QueryTypeMismatchError, match="not a number"):
        service.new_query("SELECT SUM(x.origin) FROM /r x").execute()


def test_drill_downs_iterate_each_value_s_collections_on_the_servers(
    cache_server: CacheServer, client_factory: Callable[..., ClientCache]
) -> None:
    cache = client_factory()
    portfolios = cache.create_region("r")
    portfolios.put_all(
        {
            "p1": {"status": "active", "positions": {"IBM": {"qty": 10, "mktValue": 30.5}}},
            "p2": {"status": "active", "positions": {"SUN": {"qty": 5, "mktValue": 12.0}}},
            "p3": {"status": "closed", "positions": {"IBM": {"qty": 2, "mktValue": 29.0}}},
            "p4": {"status": "active"},
        }
    )
    service = cache.query_service()
    # Geode's documentation's drill-down, over every bucket.
    rich = service.new_query(
        "SELECT DISTINCT posnVal.qty FROM /r, positions.values posnVal "
        "WHERE posnVal.mktValue >= $1 ORDER BY posnVal.qty"
    ).execute(25)
    assert rich == [2, 10]
    by_symbol = service.new_query(
        "SELECT e.key AS sym, SUM(e.value.qty) AS qty, COUNT(*) AS n "
        "FROM /r p, p.positions e WHERE p.status = 'active' GROUP BY e.key ORDER BY sym"
    ).execute()
    assert by_symbol == [
        Struct(("sym", "qty", "n"), ("IBM", 10, 1)),
        Struct(("sym", "qty", "n"), ("SUN", 5, 1)),
    ]
    assert service.new_query("SELECT COUNT(*) FROM /r p, p.positions e").execute() == [3]


def test_a_region_queries_its_values_by_predicate_as_geode_s_region_query(
    flights: ClientCache,
) -> None:
    region = flights.get_region("r")
    assert region is not None
    by_sfo = region.query("origin = 'SFO' AND this.delay > $1", 5)
    assert by_sfo == [_FLIGHTS["f1"]]
    assert region.query("SELECT DISTINCT x.carrier FROM /r x WHERE x.origin = 'SFO'") != []
    assert region.exists_value("delay >= 45") and not region.exists_value("delay > 45")
    assert region.select_value("carrier = 'B6'") == _FLIGHTS["f6"]
    assert region.select_value("carrier = 'ZZ'") is None
    with pytest.raises(QueryFunctionDomainError, match="size 3"):
        region.select_value("origin = 'SFO'")
    with pytest.raises(QueryInvalidError):
        region.query("origin = ")

    async def asynchronously() -> bool:
        async_region = AsyncRegion(region)
        return await async_region.exists_value("origin = $1", "BOS")

    assert asyncio.run(asynchronously())


def test_asyncio_clients_await_a_query(flights: ClientCache) -> None:
    async def run() -> list[Any]:
        return await AsyncClientCache(flights).query(
            "SELECT x.delay FROM /r x WHERE x.delay > $1 ORDER BY x.delay", 5
        )

    assert asyncio.run(run()) == [7, 10, 45]


def test_an_invalid_query_is_refused_before_anything_is_sent_and_by_the_servers(
    flights: ClientCache, kafka_bootstrap_servers: str, namespace: str
) -> None:
    service = flights.query_service()
    with pytest.raises(QueryInvalidError) as refused:
        service.new_query("SELECT x.carrier, COUNT(*) FROM /r x GROUP BY x.origin")
    assert refused.value.rule == "group-by"
    query = service.new_query("SELECT * FROM /r x WHERE x.delay > $1")
    with pytest.raises(QueryInvalidError, match="takes 1 parameters, 0 were given"):
        query.execute()
    # A client that skips the checks: the servers parse and bind again, and refuse it.
    from regionbus.clients.server_proxy import ServerRegionProxy
    from regionbus.schemas.messages import OperationKind, QuerySpec

    proxy = ServerRegionProxy(flights, "r", "")
    too_long = QuerySpec(query.query_string, ("x" * 5_000,))
    with pytest.raises(QueryInvalidError, match="longer than 4096 characters"):
        proxy.every_bucket(OperationKind.QUERY, query=too_long)
    assert dead_letters(kafka_bootstrap_servers, namespace)
    with pytest.raises(RegionNotFoundError):
        service.new_query("SELECT * FROM /nowhere").execute()


def test_values_that_do_not_compare_fail_the_query_with_a_type_mismatch(
    flights: ClientCache,
) -> None:
    flights.get_region("r").put("odd", {"origin": 7})  # type: ignore[union-attr]
    service = flights.query_service()
    with pytest.raises(QueryTypeMismatchError):
        service.new_query("SELECT * FROM /r x WHERE x.origin > 'A'").execute()
    with pytest.raises(QueryTypeMismatchError, match="compares"):
        service.new_query("SELECT x.origin FROM /r x ORDER BY x.origin").execute()


def test_a_query_over_its_time_or_row_budget_fails_with_its_typed_error(
    server_settings: ServerSettings, client_factory: Callable[..., ClientCache]
) -> None:
    tight = server_settings.model_copy(update={"query_max_rows_per_bucket": 50, "total_buckets": 4})
    with CacheServer(tight):
        cache = client_factory()
        region = cache.create_region("r")
        region.put_all({f"k{i}": {"n": i, "s": "x" * 200} for i in range(2_000)})
        service = cache.query_service()
        with pytest.raises(QueryRowLimitError, match="query_max_rows_per_bucket=50"):
            service.new_query("SELECT * FROM /r").execute()
        # Under the bound: a LIMIT, or a narrower WHERE clause, answers.
        assert len(service.new_query("SELECT * FROM /r x ORDER BY x.n LIMIT 40").execute()) == 40
        assert service.new_query("SELECT x.n FROM /r x WHERE x.n < 100 ORDER BY x.n").execute() == (
            list(range(100))
        )
    slow = tight.model_copy(update={"query_max_execution_time_ms": 1})
    with CacheServer(slow):
        service = cache.query_service()
        query = service.new_query("SELECT * FROM /r x WHERE x.s LIKE '%y%' ORDER BY x.n LIMIT 5")
        with pytest.raises(QueryExecutionTimeoutError, match="max execution time 1ms"):
            query.execute()


def _random_value(rng: random.Random) -> dict[str, Any]:
    value: dict[str, Any] = {
        "n": rng.randint(-1_000, 1_000),
        "s": rng.choice(["alpha", "beta", "gamma", "delta", "epsilon"]),
        "f": rng.random() * 100,
        "b": rng.random() < 0.5,
    }
    if rng.random() < 0.05:
        del value["n"]  # UNDEFINED in the query
    elif rng.random() < 0.05:
        value["n"] = None
    return value


_MISSING = object()


def _n(value: dict[str, Any]) -> Any:
    return value.get("n", _MISSING)


def _rank_n(value: dict[str, Any]) -> tuple[int, float]:
    """Geode's ORDER BY order of ``n``: null, then UNDEFINED, then numbers."""
    n = _n(value)
    if n is None:
        return (0, 0.0)
    if n is _MISSING:
        return (1, 0.0)
    return (2, float(n))


def test_results_equal_a_python_evaluation_over_the_entries_redis_holds(
    server_settings: ServerSettings, client_factory: Callable[..., ClientCache]
) -> None:
    rng = random.Random(20261128)
    roomy = server_settings.model_copy(
        update={"query_max_execution_time_ms": 30_000, "query_max_rows_per_bucket": ENTRIES}
    )
    with CacheServer(roomy) as server:
        cache = client_factory()
        region = cache.create_region("r")
        for start in range(0, ENTRIES, 50_000):
            region.put_all(
                {
                    f"k{i:06d}": _random_value(rng)
                    for i in range(start, min(ENTRIES, start + 50_000))
                }
            )
        json = JsonSerializer()
        stored = {k: json.loads(e.value) for k, e in server.store.entries("r").items() if e.value}
        assert len(stored) == ENTRIES
        service = cache.query_service()

        every = service.new_query("SELECT * FROM /r").execute()
        assert sorted(every, key=repr) == sorted(stored.values(), key=repr)

        for _ in range(5):
            low = rng.randint(-1_000, 1_000)
            names = set(rng.sample(["alpha", "beta", "gamma", "delta", "epsilon", "zeta"], 3))
            limit = rng.randint(1, 2_000)
            rows = service.new_query(
                "SELECT e.key, e.value.n FROM /r.entries e WHERE e.value.n >= $1 AND "
                "e.value.s IN $2 ORDER BY e.value.n DESC, e.value.f LIMIT $3"
            ).execute(low, names, limit)
            expected = sorted(
                (
                    (k, v)
                    for k, v in stored.items()
                    if isinstance(_n(v), int) and v["n"] >= low and v["s"] in names
                ),
                key=lambda kv: (-kv[1]["n"], kv[1]["f"], kv[0]),
            )[:limit]
            assert [r.as_dict() for r in rows] == [{"key": k, "n": v["n"]} for k, v in expected]

            flag = rng.random() < 0.5
            rows = service.new_query(
                "SELECT e.key FROM /r.entries e WHERE e.value.b = $1 AND "
                "(e.value.s LIKE '%a' OR NOT (e.value.f < $2)) ORDER BY e.value.n, e.key"
            ).execute(flag, 50.0)
            expected_keys = sorted(
                (
                    k
                    for k, v in stored.items()
                    if v["b"] is flag and (v["s"].endswith("a") or not v["f"] < 50.0)
                ),
                key=lambda k: (_rank_n(stored[k]), k),
            )
            assert rows == expected_keys

            missing = service.new_query(
                "SELECT x.f FROM /r x WHERE IS_UNDEFINED(x.n) OR x.n = NULL OR x.n <> $1"
            ).execute(low)
            assert service.new_query(
                "SELECT COUNT(*) FROM /r x WHERE x.n >= $1 AND x.s IN $2"
            ).execute(low, names) == [
                sum(1 for v in stored.values() if isinstance(_n(v), int) and v["n"] >= low
                    and v["s"] in names)
            ]  # fmt: skip
            assert sorted(missing) == sorted(
                v["f"] for v in stored.values() if _n(v) in (_MISSING, None) or _n(v) != low
            )


def test_a_query_on_an_idle_server_is_answered_as_soon_as_it_is_done(
    cache_server: CacheServer, client_factory: Callable[..., ClientCache]
) -> None:
    # Its answer leaves the server when the worker thread is done, not with the next
    # message the server reads (this client's next ping is 30 s away).
    cache = client_factory(ping_interval_ms=30_000)
    cache.create_region("r").put_all(_FLIGHTS)
    query = cache.query_service().new_query("SELECT * FROM /r")
    for _ in range(3):
        began = time.monotonic()
        assert len(query.execute()) == len(_FLIGHTS)
        assert time.monotonic() - began < 2.0
