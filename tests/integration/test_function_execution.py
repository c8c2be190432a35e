"""Function execution (Geode ``FunctionService``) end to end against a real Kafka and
Redis: routing by filter, every bucket without one, once per server, collectors, errors,
the time budget, a slow function beside another client, and what a function's changes
reach."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support import Recorder, bystander_puts, settle, wait_until

from regionbus import (
    ALL_KEYS,
    ClientCache,
    ClientRegionShortcut,
    EntryEvent,
    Function,
    FunctionContext,
    FunctionError,
    FunctionNotRegisteredError,
    FunctionService,
    FunctionTimeoutError,
    PartitionRegionHelper,
    RegionFunctionContext,
    RequestLimitError,
    ResultCollector,
)
from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.schemas.naming import bucket_of

_KEYS = {f"k{i:02d}": i for i in range(40)}


class Where(Function):
    """Answers where it ran: its bucket, filter, the bucket's keys, arguments, server."""

    id = "where"

    def execute(self, context: FunctionContext) -> None:
        assert isinstance(context, RegionFunctionContext)
        local = PartitionRegionHelper.get_local_data_for_context(context)
        context.result_sender.last_result(
            {
                "bucket": context.bucket,
                "filter": sorted(context.filter),
                "keys": sorted(local.keys()),
                "arguments": context.arguments,
                "member": context.member_name,
                "region": context.data_set.name,
            }
        )


class SendValues(Function):
    """Sends each value of its bucket, then 0 as its last result."""

    id = "send-values"

    def execute(self, context: FunctionContext) -> None:
        assert isinstance(context, RegionFunctionContext)
        for value in PartitionRegionHelper.get_local_data_for_context(context).values():
            context.result_sender.send_result(value)
        context.result_sender.last_result(0)


class Member(Function):
    """Answers the member id of the server it ran on (``on_servers``)."""

    id = "member"

    def execute(self, context: FunctionContext) -> None:
        assert not isinstance(context, RegionFunctionContext)
        context.result_sender.last_result(context.member_name)


class Failing(Function):
    """Raises, sends no last result, or sends an exception, as its arguments say."""

    id = "failing"

    def execute(self, context: FunctionContext) -> None:
        how = context.arguments
        if how == "raise":
            raise ValueError("no flights on the moon")
        if how == "exception":
            context.result_sender.send_exception(KeyError("UA-1"))
            context.result_sender.last_result("after")


class Sleeping(Function):
    """Sleeps as many seconds as its arguments say, then answers True."""

    id = "sleeping"

    def execute(self, context: FunctionContext) -> None:
        time.sleep(context.arguments)
        context.result_sender.last_result(True)


class Spinning(Function):
    """Keeps a core busy for as many seconds as its arguments say."""

    id = "spinning"

    def execute(self, context: FunctionContext) -> None:
        end = time.monotonic() + context.arguments
        spins = 0
        while time.monotonic() < end:
            spins += 1
        context.result_sender.last_result(spins)


class Changing(Function):
    """Makes the change its arguments name (``[method, key, value]``) on its region."""

    id = "changing"

    def execute(self, context: FunctionContext) -> None:
        assert isinstance(context, RegionFunctionContext)
        method, key, value = context.arguments
        region = context.data_set
        if method == "put":
            region.put(key, value)
        else:
            getattr(region, method)(key)
        context.result_sender.last_result(region.get(key) if method == "get" else method)


class FireAndForget(Function):
    """Puts its arguments' key without sending results (Geode ``hasResult`` false)."""

    id = "fire-and-forget"
    has_result = False
    is_ha = False

    def execute(self, context: FunctionContext) -> None:
        assert isinstance(context, RegionFunctionContext)
        context.data_set.put(context.arguments, "done")


_FUNCTIONS: list[Function] = [
    Where(),
    SendValues(),
    Member(),
    Failing(),
    Sleeping(),
    Spinning(),
    Changing(),
    FireAndForget(),
]


@pytest.fixture
def settings(server_settings: ServerSettings) -> ServerSettings:
    return server_settings.model_copy(update={"regions": ["r", "s"]})


@pytest.fixture
def function_server(settings: ServerSettings) -> Iterator[CacheServer]:
    with CacheServer(settings, functions=_FUNCTIONS) as server:
        yield server


@pytest.fixture
def region(function_server: CacheServer, client_factory: Callable[..., ClientCache]) -> Any:
    region = client_factory().create_region("r", ClientRegionShortcut.PROXY)
    region.put_all(_KEYS)
    return region


def _bucket(key: str) -> int:
    return bucket_of("r", key, 16)


def _keys_of(bucket: int) -> list[str]:
    return sorted(k for k in _KEYS if _bucket(k) == bucket)


def test_a_filter_runs_on_the_primaries_of_its_keys_buckets_only(region: Any) -> None:
    keys = ["k01", "k02", "k03"]
    buckets = {_bucket(k) for k in keys}
    assert len(buckets) > 1, "the filter should span buckets"

    execution = FunctionService.on_region(region).with_filter(keys).set_arguments({"a": [1]})
    results = execution.execute("where").get_result()

    assert sorted(r["bucket"] for r in results) == sorted(buckets)
    for result in results:
        bucket = result["bucket"]
        assert result["filter"] == sorted(k for k in keys if _bucket(k) == bucket)
        assert result["keys"] == _keys_of(bucket)
        assert result["arguments"] == {"a": [1]}
        assert result["region"] == "r"


def test_without_a_filter_every_bucket_runs_once_over_its_own_entries(region: Any) -> None:
    results = FunctionService.on_region(region).execute("where").get_result()

    assert sorted(r["bucket"] for r in results) == list(range(16))
    for result in results:
        assert result["filter"] == []
        assert result["keys"] == _keys_of(result["bucket"])
        assert result["arguments"] is None


def test_results_reach_a_custom_collector_with_their_member(
    region: Any, function_server: CacheServer
) -> None:
    class Summing(ResultCollector):
        def __init__(self) -> None:
            self.total = 0
            self.members: set[str] = set()
            self.ended = False

        def add_result(self, member_id: str, result: Any) -> None:
            self.total += result
            self.members.add(member_id)

        def end_results(self) -> None:
            self.ended = True

        def get_result(self, timeout_ms: int | None = None) -> int:
            return self.total

    summing = Summing()
    collector = FunctionService.on_region(region).with_collector(summing).execute("send-values")

    assert collector is summing and summing.ended
    assert summing.get_result() == sum(_KEYS.values())
    assert summing.members == {function_server.settings.member_id}


def test_on_servers_runs_once_on_each_server(
    settings: ServerSettings, client_factory: Callable[..., ClientCache]
) -> None:
    first = settings.model_copy(update={"member_id": "server-one", "lease_ttl_ms": 2_000})
    second = first.model_copy(update={"member_id": "server-two"})
    with (
        CacheServer(first, functions=_FUNCTIONS) as one,
        CacheServer(second, functions=_FUNCTIONS) as two,
    ):
        wait_until(lambda: bool(one.primary_buckets and two.primary_buckets), 30, "a balance")
        cache = client_factory()
        for _ in range(3):
            members = FunctionService.on_servers(cache).execute("member").get_result()
            assert sorted(members) == ["server-one", "server-two"]


def test_function_errors_reach_the_caller_typed(region: Any, client_factory: Any) -> None:
    execution = FunctionService.on_region(region).with_filter(["k01"])
    with pytest.raises(FunctionError, match="ValueError: no flights on the moon"):
        execution.set_arguments("raise").execute("failing")
    with pytest.raises(FunctionError, match="did not send last result"):
        execution.set_arguments("nothing").execute("failing")
    with pytest.raises(FunctionNotRegisteredError, match="'no-such-function' is not registered"):
        execution.execute("no-such-function")
    with pytest.raises(FunctionError, match="Cannot specify filter"):
        FunctionService.on_servers(client_factory()).with_filter(["k01"])

    got = execution.set_arguments("exception").execute("failing").get_result()
    assert len(got) == 2 and got[1] == "after"
    assert isinstance(got[0], FunctionError) and "KeyError: 'UA-1'" in str(got[0])


def test_a_function_past_its_time_budget_is_answered_timeout_and_its_changes_fail(
    settings: ServerSettings, client_factory: Callable[..., ClientCache]
) -> None:
    budget = settings.model_copy(update={"function_timeout_ms": 500})
    with CacheServer(budget, functions=_FUNCTIONS):
        region = client_factory(read_timeout_ms=20_000).create_region("r")
        execution = FunctionService.on_region(region).with_filter(["k01"])
        began = time.monotonic()
        with pytest.raises(FunctionTimeoutError, match="function_timeout_ms=500"):
            execution.set_arguments(3).execute("sleeping")
        assert time.monotonic() - began < 3, "answered at the budget, not when it returned"
        # Its thread returns later; the server answers the next execution as ever.
        assert execution.set_arguments(0).execute("sleeping").get_result() == [True]


def test_more_executions_than_a_server_holds_pending_are_refused_typed(
    settings: ServerSettings, client_factory: Callable[..., ClientCache]
) -> None:
    small = settings.model_copy(update={"max_pending_functions": 2, "function_threads": 1})
    with CacheServer(small, functions=_FUNCTIONS):
        region = client_factory().create_region("r")
        # Sixteen buckets' executions of one call: at most two may wait on the server.
        with pytest.raises(RequestLimitError, match="max_pending_functions"):
            FunctionService.on_region(region).set_arguments(0.2).execute("sleeping")


@pytest.mark.abuse
def test_a_slow_function_leaves_another_clients_puts_their_pace(
    settings: ServerSettings, client_factory: Callable[..., ClientCache]
) -> None:
    slow = settings.model_copy(update={"function_timeout_ms": 60_000, "function_threads": 2})
    with CacheServer(slow, functions=_FUNCTIONS):
        busy = client_factory(read_timeout_ms=60_000).create_region("r")
        victim = client_factory().create_region("s", ClientRegionShortcut.PROXY)
        stop = threading.Event()
        ran: list[int] = []

        # Two buckets' primary spins a core for 2 s each, on both worker threads at once.
        keys = {_bucket(k): k for k in _KEYS}
        spinning = FunctionService.on_region(busy).with_filter(list(keys.values())[:2])

        def spin_until_stopped() -> None:
            while not stop.is_set():
                spinning.set_arguments(2.0).execute("spinning")
                ran.append(1)

        spinner = threading.Thread(target=spin_until_stopped, daemon=True)
        spinner.start()
        try:
            with bystander_puts(victim, [f"v{i}" for i in range(10)], at_least=20) as latencies:
                time.sleep(6.0)
        finally:
            stop.set()
            spinner.join(120)
        assert ran, "no execution completed"
        # On the loop, every put behind one bucket's execution would have waited 2 s.
        assert max(latencies) < 1.0, latencies


def test_a_put_and_a_destroy_of_a_function_reach_a_subscriber_as_a_clients(
    region: Any, client_factory: Callable[..., ClientCache], function_server: CacheServer
) -> None:
    heard = Recorder()
    client_factory().create_region("r", listeners=[heard]).register_interest(ALL_KEYS)
    execution = FunctionService.on_region(region).with_filter(["fn-key"])

    assert execution.set_arguments(["put", "fn-key", {"by": "function"}]).execute(
        "changing"
    ).get_result() == ["put"]
    wait_until(lambda: ("create", "fn-key", {"by": "function"}) in heard.snapshot(), what="put")
    assert region.get("fn-key") == {"by": "function"}
    execution.set_arguments(["destroy", "fn-key", None]).execute("changing")
    wait_until(lambda: ("destroy", "fn-key", None) in heard.snapshot(), what="the destroy")
    assert region.get("fn-key") is None
    created = next(e for e in heard.events if isinstance(e, EntryEvent) and e.key == "fn-key")
    # An operation of the server: its EventID is of the server's member.
    assert created.event_id is not None
    assert created.event_id.member == function_server.settings.member_id


def test_a_local_destroy_and_invalidate_of_a_function_reach_no_client(
    settings: ServerSettings, client_factory: Callable[..., ClientCache]
) -> None:
    server_heard = Recorder()
    with CacheServer(settings, functions=_FUNCTIONS, listeners={"r": [server_heard]}) as server:
        writer = client_factory().create_region("r", ClientRegionShortcut.PROXY)
        heard = Recorder()
        caching = client_factory().create_region("r", listeners=[heard])
        caching.register_interest(ALL_KEYS)
        writer.put("gone", 1)
        writer.put("blank", 2)
        wait_until(lambda: len(heard.snapshot()) == 2, what="the two creates")
        stored = server.store.entries("r")
        execution = FunctionService.on_region(writer)

        execution.with_filter(["gone"]).set_arguments(["local_destroy", "gone", None]).execute(
            "changing"
        )
        execution.with_filter(["blank"]).set_arguments(["local_invalidate", "blank", None]).execute(
            "changing"
        )

        wait_until(lambda: "gone" not in server.store.entries("r"), what="the local destroy")
        wait_until(
            lambda: server.store.entries("r")["blank"].value is None, what="the local invalidate"
        )
        assert stored["gone"].value == b"1"
        # The server's own listeners heard both (Geode tells a member's listeners of its
        # local operations); no client did, and the caching client keeps its copies.
        wait_until(
            lambda: (
                {(m, k) for m, k, _ in server_heard.snapshot()}
                >= {("destroy", "gone"), ("invalidate", "blank")}
            ),
            what="the server listener",
        )
        settle(caching.region_service, idle_s=0.5)  # the cache the region belongs to
        assert heard.snapshot() == [("create", "gone", 1), ("create", "blank", 2)]
        assert caching.local_entries() == {"gone": 1, "blank": 2}
        assert writer.get("gone") is None and writer.get("blank") is None


def test_a_function_without_results_returns_at_once_and_still_runs(
    region: Any, client_factory: Callable[..., ClientCache]
) -> None:
    execution = FunctionService.on_region(region).with_filter(["nr"]).set_arguments("nr")
    collector = execution.execute("fire-and-forget")
    with pytest.raises(FunctionError, match="hasResult"):
        collector.get_result()
    wait_until(lambda: region.get("nr") == "done", what="the function's put")
