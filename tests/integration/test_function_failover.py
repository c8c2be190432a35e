"""High availability of function execution (Geode ``Function.isHA``): a bucket's primary
that stops or dies while it runs a function leaves its buckets to be executed again on
their new primary, and each bucket's results reach the caller exactly once; a function
that is not ``is_ha`` fails instead."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from function_kill_plugin import MARKER_ENV
from support import wait_until
from test_high_availability import ServerProcess, cluster  # noqa: F401  (its fixture)

import regionbus
from regionbus import (
    ClientCache,
    ClientRegionShortcut,
    Function,
    FunctionContext,
    FunctionInvocationTargetError,
    FunctionService,
    RegionFunctionContext,
)
from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.schemas.naming import RedisKeys

_HERE = Path(__file__).parent
_LEASE_TTL_MS = 2_000


class HeldOnOneServer(Function):
    """Answers its bucket, server and whether it is a re-execution; a first execution on
    ``held_member`` waits for :attr:`release` first."""

    id = "held-on-one-server"

    def __init__(self, held_member: str) -> None:
        self.held_member = held_member
        self.release = threading.Event()
        self.started: list[int] = []

    def execute(self, context: FunctionContext) -> None:
        assert isinstance(context, RegionFunctionContext)
        if context.member_name == self.held_member and not context.is_possible_duplicate:
            self.started.append(context.bucket)
            self.release.wait(30)
        context.result_sender.last_result(
            {
                "bucket": context.bucket,
                "member": context.member_name,
                "duplicate": context.is_possible_duplicate,
            }
        )


class HeldNotHa(HeldOnOneServer):
    id = "held-not-ha"
    is_ha = False


def _stop_one_server_while_it_runs(
    settings: ServerSettings,
    client_factory: Callable[..., ClientCache],
    function: HeldOnOneServer,
) -> list[Any]:
    """Run ``function`` on every bucket of ``r`` over two servers and stop the one whose
    executions it holds once they started; what the execution answered."""
    first = settings.model_copy(update={"member_id": "server-a", "lease_ttl_ms": _LEASE_TTL_MS})
    second = first.model_copy(update={"member_id": "server-b"})
    stopping = CacheServer(first, functions=[function])
    stopping.start()
    try:
        with CacheServer(second, functions=[function]) as staying:
            wait_until(
                lambda: bool(stopping.primary_buckets and staying.primary_buckets), 30, "balance"
            )
            region = client_factory(read_timeout_ms=30_000).create_region(
                "r", ClientRegionShortcut.PROXY
            )
            with ThreadPoolExecutor(1) as pool:
                running = pool.submit(
                    lambda: FunctionService.on_region(region).execute(function.id).get_result()
                )
                wait_until(lambda: bool(function.started), what="an execution on server-a")
                stopping.stop()  # answers its executions FunctionInvocationTargetError
                function.release.set()
                return list(running.result(90))
    finally:
        function.release.set()
        stopping.stop()


def test_an_ha_function_runs_again_where_a_stopped_servers_buckets_went(
    server_settings: ServerSettings, client_factory: Callable[..., ClientCache]
) -> None:
    function = HeldOnOneServer("server-a")

    results = _stop_one_server_while_it_runs(server_settings, client_factory, function)

    # Every bucket answered once, all by the server that stayed: those of the stopped one
    # from their re-execution there.
    assert sorted(r["bucket"] for r in results) == list(range(16))
    assert {r["member"] for r in results} == {"server-b"}
    again = {r["bucket"] for r in results if r["duplicate"]}
    assert set(function.started) <= again


def test_a_function_that_is_not_ha_fails_when_its_server_stops(
    server_settings: ServerSettings, client_factory: Callable[..., ClientCache]
) -> None:
    function = HeldNotHa("server-a")
    with pytest.raises(FunctionInvocationTargetError, match="server-a stopped"):
        _stop_one_server_while_it_runs(server_settings, client_factory, function)


def test_an_ha_function_whose_server_dies_runs_again_after_the_read_timeout(
    cluster: Callable[..., ServerProcess],  # noqa: F811
    redis_client: redis.Redis,
    namespace: str,
    client_factory: Callable[..., ClientCache],
    tmp_path: Path,
) -> None:
    plugin = {
        "REGIONBUS_FUNCTIONS": json.dumps(["function_kill_plugin:KillOnFirstExecution"]),
        # This module's folder for the plugin, and the regionbus under test.
        "PYTHONPATH": os.pathsep.join((str(_HERE), str(Path(regionbus.__file__).parents[1]))),
        MARKER_ENV: str(tmp_path / "killed"),
    }
    servers = [cluster(name, **plugin) for name in ("s1", "s2")]
    members = RedisKeys(namespace).members
    for server in servers:
        wait_until(
            lambda s=server: redis_client.hexists(members, s.member_id), 60, "servers to join"
        )
    cache = client_factory(read_timeout_ms=8_000)
    region = cache.create_region("r", ClientRegionShortcut.PROXY)

    results = FunctionService.on_region(region).execute("kill-on-first").get_result()

    # The killing execution dies COMMITTED_AFTER_S after it elected itself; on a loaded
    # machine the answer once came before its server was seen dead: wait for the death
    # before counting.
    wait_until(
        lambda: any(s.proc.poll() is not None for s in servers), 30, "the killing server's death"
    )
    killed = [s for s in servers if s.proc.poll() is not None]
    assert (tmp_path / "killed").exists() and len(killed) == 1, "no server was killed"
    assert killed[0].proc.returncode == -9
    # Every bucket answered exactly once; the killed server's unanswered ones (their
    # requests committed past, so no server read them again) by their re-execution.
    assert sorted(r["bucket"] for r in results) == list(range(16))
    assert any(r["duplicate"] for r in results), results
