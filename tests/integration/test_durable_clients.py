"""Durable clients (docs/behaviour.md §5): keep-alive, marker-based replay, timeouts, reconnect.

The durable client of the replay tests runs in its own OS process
(``durable_client_process.py``) that is closed, killed with SIGKILL and started again.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from support import (
    Recorder,
    consumer_groups,
    entry_operation,
    send_raw_operation,
    settle,
    wait_until,
)

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients.server_proxy import ServerRegionProxy
from regionbus.schemas.errors import (
    ConfigurationError,
    DuplicateDurableClientError,
    UnconnectedError,
)
from regionbus.schemas.messages import OperationKind
from regionbus.schemas.naming import RedisKeys, Topics

_SCRIPT = Path(__file__).with_name("durable_client_process.py")
_LIVENESS_MS = 2_000


@pytest.fixture
def durable_server(server_settings: ServerSettings) -> Iterator[CacheServer]:
    """A server with regions ``r`` and ``r2``, a 2 s liveness window and a fast reaper."""
    settings = server_settings.model_copy(
        update={
            "regions": ["r", "r2"],
            "maximum_time_between_pings_ms": _LIVENESS_MS,
            "durable_client_reaper_interval_s": 0.5,
        }
    )
    with CacheServer(settings) as server:
        yield server


@pytest.fixture
def client_factory(client_factory: Any) -> Callable[..., Any]:
    """The shared factory, with pings well inside the servers' 2 s liveness window."""

    def make(**overrides: Any) -> Any:
        return client_factory(**{"ping_interval_ms": 300, **overrides})

    return make


class DurableProcess:
    """A durable client process and the JSON lines it writes."""

    def __init__(self, out: Path, config: dict[str, Any]) -> None:
        self.out = out
        config = {**config, "out": str(out)}
        self.proc = subprocess.Popen(
            [sys.executable, str(_SCRIPT), json.dumps(config)],
            stdin=subprocess.PIPE,
            text=True,
        )

    def records(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line]

    def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], bool], what: str, timeout_s: float = 30
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            records = self.records()
            if predicate(records):
                return records
            assert self.proc.poll() is None, f"client process exited ({self.proc.returncode})"
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; records: {self.records()}")

    def command(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self, keep_alive: bool) -> None:
        self.command("close_keep_alive" if keep_alive else "close")
        assert self.proc.wait(30) == 0

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def spawn(
    tmp_path: Path, namespace: str, kafka_bootstrap_servers: str
) -> Iterator[Callable[..., DurableProcess]]:
    """Starts durable client processes (id ``desk``); kills leftovers at the end."""
    started: list[DurableProcess] = []

    def start(**config: Any) -> DurableProcess:
        base = {
            "namespace": namespace,
            "bootstrap": kafka_bootstrap_servers,
            "durable_id": "desk",
            "regions": ["r", "r2"],
        }
        process = DurableProcess(tmp_path / f"desk-{len(started)}.jsonl", {**base, **config})
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def _ready(records: list[dict[str, Any]]) -> bool:
    return any(r["ev"] == "ready" for r in records)


def _entry_events(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["ev"] in ("create", "update", "destroy", "invalidate")]


def _until_live(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    first_live = next(i for i, r in enumerate(records) if r["ev"] == "live")
    return _entry_events(records[:first_live])


def _client_record(redis_client: redis.Redis, namespace: str) -> dict[str, Any] | None:
    raw = redis_client.hget(RedisKeys(namespace).clients, "desk")
    return None if raw is None else json.loads(raw)


@pytest.mark.redis_modes
def test_keep_alive_close_then_reconnect_replays_the_missed_events_before_the_marker_without_changing_the_cache(  # noqa: E501
    durable_server: CacheServer, spawn: Callable[..., DurableProcess], client_factory: Any
) -> None:
    first = spawn(durable_keys={"r": ["k1", "k2", "k3"]})
    first.wait_for(_ready, "first connection ready")
    first.close(keep_alive=True)

    writer = client_factory().create_region("r")
    for i, key in enumerate(["k1", "k2", "k3"], start=1):
        writer.put(key, i)

    second = spawn()
    records = second.wait_for(
        lambda rs: sum(r["ev"] == "live" for r in rs) == 2, "after_region_live of r and r2"
    )
    connected = records[0]
    assert connected == {"ev": "connected", "state": "RECONNECTED", "pending": 3}
    replayed = _until_live(records)
    assert [(e["ev"], e["key"], e["value"]) for e in replayed] == [
        ("create", "k1", 1),
        ("create", "k2", 2),
        ("create", "k3", 3),
    ]
    assert all(e["cached"] is None for e in replayed), "replayed events changed the cache"
    live = [r for r in records if r["ev"] == "live"]
    assert sorted(r["region"] for r in live) == ["r", "r2"]
    assert live[0]["cache"] == {} and live[1]["cache"] == {}

    writer.put("k1", 10)
    after = second.wait_for(
        lambda rs: any(e["value"] == 10 for e in _entry_events(rs)), "the live update"
    )
    live_update = [e for e in _entry_events(after) if e["value"] == 10]
    assert live_update[0]["cached"] == 10, "after the marker events are applied to the cache"
    assert sum(r["ev"] == "live" for r in after) == 2, "after_region_live fires once per region"
    second.close(keep_alive=False)


def test_a_change_to_a_key_of_non_durable_interest_is_not_replayed(
    durable_server: CacheServer, spawn: Callable[..., DurableProcess], client_factory: Any
) -> None:
    first = spawn(durable_keys={"r": ["kept"]}, keys={"r": ["dropped"]})
    first.wait_for(_ready, "first connection ready")
    first.close(keep_alive=True)

    writer = client_factory().create_region("r")
    writer.put("dropped", "x")
    writer.put("kept", "y")

    second = spawn()
    records = second.wait_for(lambda rs: any(r["ev"] == "live" for r in rs), "the marker")
    assert [(e["key"], e["value"]) for e in _until_live(records)] == [("kept", "y")]
    second.close(keep_alive=False)


@pytest.mark.redis_modes
def test_after_kill_minus_9_a_restart_gets_everything_queued_since_the_last_ack_once(
    durable_server: CacheServer,
    spawn: Callable[..., DurableProcess],
    client_factory: Any,
    redis_client: redis.Redis,
    namespace: str,
    kafka_bootstrap_servers: str,
) -> None:
    keys = [f"s{i:02d}" for i in range(60)] + ["dup"]
    first = spawn(durable_keys={"r": keys})
    first.wait_for(_ready, "first connection ready")
    writer = client_factory().create_region("r")
    for key in keys[:30]:
        writer.put(key, 1)
    first.wait_for(lambda rs: len(_entry_events(rs)) >= 20, "some events before the kill")
    first.kill()
    seen_before_kill = {e["key"] for e in _entry_events(first.records())}

    for key in keys[30:60]:
        writer.put(key, 2)
    # The same EventID twice: the server recognises the second and re-emits its event, so the
    # queue holds it twice; the restarted client must deliver it once.
    op, bucket = entry_operation("app", OperationKind.PUT, "dup", 0, b'"d"')
    send_raw_operation(kafka_bootstrap_servers, namespace, op, bucket)
    send_raw_operation(kafka_bootstrap_servers, namespace, op._replace(request_id=2), bucket)

    wait_until(
        lambda: (_client_record(redis_client, namespace) or {}).get("connected") is False,
        timeout_s=_LIVENESS_MS / 1000 + 10,
        what="the server to notice the killed client",
    )
    second = spawn()
    records = second.wait_for(
        lambda rs: (
            any(r["ev"] == "live" for r in rs) and any(e["key"] == "dup" for e in _entry_events(rs))
        ),
        "the replay up to the marker",
    )
    replayed = _until_live(records)
    keys_after = [e["key"] for e in replayed]
    assert len(keys_after) == len(set(keys_after)), "an event reached the listener twice"
    assert seen_before_kill | set(keys_after) == set(keys), "an event was lost"
    assert set(keys[30:]) <= set(keys_after), "events queued while dead were not all replayed"
    assert records[0]["state"] == "RECONNECTED"
    assert records[0]["pending"] >= len(keys_after)
    second.close(keep_alive=False)


def test_close_without_keep_alive_removes_the_queue_and_interest_at_once(
    durable_server: CacheServer,
    client_factory: Any,
    redis_client: redis.Redis,
    namespace: str,
    kafka_bootstrap_servers: str,
) -> None:
    client = client_factory(durable_client_id="desk")
    client.create_region("r").register_interest(["a"], durable=True)
    client.ready_for_events()
    acks = Topics(namespace).client_group("desk")
    wait_until(lambda: acks in consumer_groups(kafka_bootstrap_servers), what="its first ack")
    client.close(keep_alive=False)
    assert acks not in consumer_groups(kafka_bootstrap_servers)
    keys = RedisKeys(namespace)
    wait_until(
        lambda: (
            not redis_client.exists(keys.interest("desk"))
            and _client_record(redis_client, namespace) is None
        ),
        what="the server to drop the client's interest and record",
    )


@pytest.mark.redis_modes
def test_a_client_away_past_its_timeout_is_unregistered_with_an_alert_and_reconnects_as_new(
    durable_server: CacheServer,
    client_factory: Any,
    redis_client: redis.Redis,
    namespace: str,
    kafka_bootstrap_servers: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="regionbus.server")
    client = client_factory(durable_client_id="desk", durable_client_timeout_s=2)
    client.create_region("r").register_interest(["a"], durable=True)
    client.ready_for_events()
    client.close(keep_alive=True)
    client_factory().create_region("r").put("a", 1)
    keys = RedisKeys(namespace)
    assert redis_client.exists(keys.interest("desk")), "durable interest is kept while away"

    wait_until(
        lambda: _client_record(redis_client, namespace) is None,
        timeout_s=15,
        what="the reaper to unregister the client",
    )
    assert not redis_client.exists(keys.interest("desk"))
    wait_until(
        lambda: (
            Topics(namespace).client_group("desk") not in consumer_groups(kafka_bootstrap_servers)
        ),
        what="the reaper to delete its acks",
    )
    alerts = [r for r in caplog.records if "ALERT" in r.getMessage() and "desk" in r.getMessage()]
    assert len(alerts) == 1

    again = client_factory(durable_client_id="desk", durable_client_timeout_s=2)
    assert again.client_state == "NEW"
    assert again.pending_event_count == 0


def test_nothing_is_delivered_before_ready_for_events(
    durable_server: CacheServer, client_factory: Any
) -> None:
    recorder = Recorder()
    durable = client_factory(durable_client_id="desk")
    durable.create_region("r", listeners=[recorder]).register_interest(["a"], durable=True)
    writer = client_factory().create_region("r")
    writer.put("a", 1)
    time.sleep(1.0)
    assert recorder.snapshot() == []
    durable.ready_for_events()
    wait_until(lambda: ("region_live", "r", None) in recorder.snapshot(), what="the marker")
    assert recorder.snapshot() == [("create", "a", 1), ("region_live", "r", None)]


def test_a_second_live_client_with_the_same_durable_id_is_refused(
    durable_server: CacheServer, client_factory: Any
) -> None:
    client_factory(durable_client_id="desk")
    with pytest.raises(DuplicateDurableClientError, match="already connected"):
        client_factory(durable_client_id="desk")


def test_ready_for_events_on_a_non_durable_client_raises(
    durable_server: CacheServer, client_factory: Any
) -> None:
    with pytest.raises(ConfigurationError, match="durable"):
        client_factory().ready_for_events()


def test_while_disconnected_local_reads_work_and_writes_raise_unconnected(
    durable_server: CacheServer, client_factory: Any
) -> None:
    client = client_factory(durable_client_id="desk")
    region = client.create_region("r")
    region.put("a", 1)
    client.ready_for_events()
    client.close(keep_alive=True)
    assert region.get("a") == 1
    with pytest.raises(UnconnectedError):
        region.put("a", 2)
    with pytest.raises(UnconnectedError):
        region.destroy("a")


def test_interest_responses_do_not_override_application_operations_made_during_registration(
    durable_server: CacheServer, client_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = client_factory().create_region("r")
    for key in ("valid", "invalid", "destroyed", "gone"):
        writer.put(key, "server")
    client = client_factory()
    region = client.create_region("r")
    real_interest = ServerRegionProxy.interest

    def answer_then_operate(
        proxy: ServerRegionProxy, kind: Any, spec: Any, take_entries: Any = None
    ) -> Any:
        chunks: list[Any] = []
        replies = real_interest(proxy, kind, spec, chunks.append)
        monkeypatch.setattr(ServerRegionProxy, "interest", real_interest)
        # The responses were read on the server; the application now operates on the
        # region before they are applied to the cache.
        region.put("valid", "application")
        assert region.get("invalid") == "server"
        region.invalidate("invalid")
        assert region.get("destroyed") == "server"
        region.local_destroy("destroyed")
        region.destroy("gone")
        for chunk in chunks:
            take_entries(chunk)
        return replies

    monkeypatch.setattr(ServerRegionProxy, "interest", answer_then_operate)
    region.register_interest(["valid", "invalid", "destroyed", "gone"])
    entries = region.local_entries()
    assert entries["valid"] == "application", "a valid entry is not overwritten"
    assert entries["invalid"] == "server", "an invalid entry takes the response's value"
    assert "destroyed" not in entries, "a locally destroyed entry is not revived"
    assert "gone" not in entries, "a destroyed entry is not revived"


@pytest.mark.redis_modes
def test_a_client_whose_queue_is_gone_refetches_its_interest_without_listener_events(
    server_settings: ServerSettings,
    client_factory: Any,
    redis_client: redis.Redis,
    namespace: str,
) -> None:
    settings = server_settings.model_copy(update={"maximum_time_between_pings_ms": 500})
    with CacheServer(settings):
        recorder = Recorder()
        # Pings far less often than the server's limit: the server drops the client soon
        # after one ping, and the puts below land well before the next one re-initialises it.
        client = client_factory(ping_interval_ms=8_000)
        region = client.create_region("r", listeners=[recorder])
        region.register_interest(["a", "b"])
        writer = client_factory(ping_interval_ms=100).create_region("r")
        keys = RedisKeys(namespace)
        # The drop reaches the buckets as DISCONNECT operations: wait for it to be applied,
        # not only for the client record to go.
        wait_until(
            lambda: (
                redis_client.hget(keys.clients, client.client_id) is None
                and not redis_client.exists(keys.interest(client.client_id))
            ),
            what="the server to drop the silent client",
        )
        writer.put("a", 1)
        writer.put("b", 2)
        wait_until(
            lambda: region.local_entries() == {"a": 1, "b": 2},
            timeout_s=30,
            what="the re-initialised client to re-fetch its entries of interest",
        )
        settle(client)
        assert recorder.snapshot() == [], "the re-fetch fired listener events"
        writer.put("a", 3)
        wait_until(lambda: ("update", "a", 3) in recorder.snapshot(), what="live events again")


def test_every_replayed_event_reaches_listeners_and_a_key_seen_in_replay_stays_known_to_them(
    durable_server: CacheServer, client_factory: Any
) -> None:
    first = client_factory(durable_client_id="desk")
    first.create_region("r").register_interest(["a", "b"], durable=True)
    first.ready_for_events()
    first.close(keep_alive=True)
    writer = client_factory().create_region("r")
    writer.put("a", 1)
    writer.put("a", 2)
    writer.destroy("a")
    writer.put("b", 1)

    recorder = Recorder()
    second = client_factory(durable_client_id="desk")
    region = second.create_region("r", listeners=[recorder])
    second.ready_for_events()
    wait_until(lambda: ("region_live", "r", None) in recorder.snapshot(), what="the marker")
    assert region.local_entries() == {}, "replayed events changed the cache"
    # "b" was created in replay only, so the cache does not hold it; its listener still
    # sees the live update as an update and the live destroy at all.
    writer.put("b", 2)
    writer.destroy("b")
    wait_until(lambda: ("destroy", "b", None) in recorder.snapshot(), what="the live destroy")
    assert recorder.snapshot() == [
        ("create", "a", 1),
        ("update", "a", 2),
        ("destroy", "a", None),
        ("create", "b", 1),
        ("region_live", "r", None),
        ("update", "b", 2),
        ("destroy", "b", None),
    ]
    assert region.local_entries() == {}
