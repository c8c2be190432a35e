"""High availability (docs/behaviour.md §4): bucket primaries and secondaries in separate server
processes, killed with SIGKILL or paused with SIGSTOP, with writers in processes of their
own and an interested listener here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from support import Recorder, entry_operation, send_raw_operation, settle, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.broker.status import ClusterStatus, cluster_status
from regionbus.clients import (
    ALL_KEYS,
    CacheListener,
    CqAttributes,
    CqEvent,
    CqListener,
    EntryEvent,
    RegionShortcut,
)
from regionbus.schemas.messages import InterestKind, InterestSpec, Operation, OperationKind
from regionbus.schemas.naming import RedisKeys, bucket_of, bucket_role

_TOTAL_BUCKETS = 16
_LEASE_TTL_MS = 2_000
_HERE = Path(__file__).parent


class ServerProcess:
    """``python -m regionbus serve`` as a child process with its own member id."""

    def __init__(self, member_id: str, env: dict[str, str], log: Path) -> None:
        self.member_id = member_id
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "regionbus", "serve", "--region", "r"],
                env={**os.environ, **env, "REGIONBUS_MEMBER_ID": member_id},
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=_HERE.parents[1],
            )

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class WriterProcess:
    """``ha_writer_process.py``: sustained ``put_async`` until told to stop."""

    def __init__(self, tmp_path: Path, writer: str, config: dict[str, Any]) -> None:
        self.out = tmp_path / f"{writer}.jsonl"
        self.stop_file = tmp_path / f"{writer}.stop"
        config = {**config, "writer": writer, "out": str(self.out), "stop": str(self.stop_file)}
        self.proc = subprocess.Popen(
            [sys.executable, str(_HERE / "ha_writer_process.py"), json.dumps(config)]
        )

    def finish(self) -> list[dict[str, Any]]:
        self.stop_file.touch()
        assert self.proc.wait(90) == 0
        return [json.loads(line) for line in self.out.read_text().splitlines()]


class Tap(CacheListener):
    """Records every create/update: key, the put's ``i`` and send time, EventID, arrival."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, float, tuple[str, int, int, int], float]] = []
        self._lock = threading.Lock()

    def _add(self, event: EntryEvent) -> None:
        assert event.event_id is not None
        value = event.new_value
        eid = event.event_id
        with self._lock:
            self.events.append(
                (
                    event.key,
                    value["i"],
                    value["sent_ms"],
                    (eid.member, eid.thread, eid.sequence, eid.bucket),
                    time.time() * 1000,
                )
            )

    def after_create(self, event: EntryEvent) -> None:
        self._add(event)

    def after_update(self, event: EntryEvent) -> None:
        self._add(event)

    def snapshot(self) -> list[tuple[str, int, float, tuple[str, int, int, int], float]]:
        with self._lock:
            return list(self.events)


class CqTap(CqListener):
    """A :class:`Tap` of a continuous query's events (every put of the writers is in its
    result set: a CREATE, then UPDATEs)."""

    def __init__(self) -> None:
        self.tap = Tap()
        self.errors: list[CqEvent] = []
        self.operations: dict[str, list[str]] = {}

    def on_event(self, event: CqEvent) -> None:
        eid = event.event_id
        with self.tap._lock:
            assert event.query_operation is not None
            self.operations.setdefault(str(event.key), []).append(event.query_operation.name)
            self.tap.events.append(
                (
                    str(event.key),
                    event.new_value["i"],
                    event.new_value["sent_ms"],
                    (eid.member, eid.thread, eid.sequence, eid.bucket),
                    time.time() * 1000,
                )
            )

    def on_error(self, event: CqEvent) -> None:
        self.errors.append(event)


@pytest.fixture
def cluster(
    tmp_path: Path, namespace: str, kafka_bootstrap_servers: str, redis_url: str
) -> Iterator[Callable[..., ServerProcess]]:
    """Starts cache server processes of this test's namespace, ``start(member_id,
    redundancy, **more_env)``; stops them at the end."""
    started: list[ServerProcess] = []

    def start(member_id: str, redundancy: int = 0, **more_env: str) -> ServerProcess:
        env = {
            "REGIONBUS_NAMESPACE": namespace,
            "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap_servers,
            "REGIONBUS_REDIS_URL": redis_url,
            "REGIONBUS_SUBSCRIPTION_REDUNDANCY": str(redundancy),
            "REGIONBUS_LEASE_TTL_MS": str(_LEASE_TTL_MS),
            "REGIONBUS_FETCH_WAIT_MAX_MS": "100",
            "REGIONBUS_POLL_TIMEOUT_MS": "20",
            "REGIONBUS_MESSAGE_SYNC_INTERVAL_S": "0.5",
            **more_env,
        }
        server = ServerProcess(member_id, env, tmp_path / f"{member_id}.log")
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _status(redis_client: redis.Redis, namespace: str) -> ClusterStatus:
    return cluster_status(redis_client, namespace, _TOTAL_BUCKETS)


def _settled(
    redis_client: redis.Redis, namespace: str, members: set[str], redundancy: int
) -> Callable[[], bool]:
    """Every bucket has a live primary and ``redundancy`` secondaries, primaries balanced."""

    def check() -> bool:
        status = _status(redis_client, namespace)
        if {m.member_id for m in status.members} != members:
            return False
        if any(b.primary not in members for b in status.buckets):
            return False
        if any(len(b.secondaries) < redundancy for b in status.buckets):
            return False
        counts = [m.primaries for m in status.members]
        return max(counts) - min(counts) <= 1

    return check


def _start_in_order(
    cluster: Callable[..., ServerProcess],
    redis_client: redis.Redis,
    namespace: str,
    names: list[str],
    redundancy: int,
) -> dict[str, ServerProcess]:
    """Start servers one after the other, so their start times (and ages) are distinct."""
    servers = {}
    for name in names:
        servers[name] = cluster(name, redundancy)
        wait_until(
            lambda name=name: redis_client.hexists(RedisKeys(namespace).members, name),
            timeout_s=60,
            what=f"{name} to join",
        )
        time.sleep(0.05)
    wait_until(
        _settled(redis_client, namespace, set(names), min(redundancy, len(names) - 1)),
        timeout_s=60,
        what="every bucket to have a primary and its secondaries",
    )
    return servers


def _taker(servers: dict[str, ServerProcess], bucket: int, epoch: int) -> str | None:
    """The server that took ``bucket`` with fencing ``epoch`` (from the servers' logs: a
    later rebalance may have handed the bucket on since)."""
    line = f"is now primary of bucket {bucket} (epoch {epoch})"
    for name, server in servers.items():
        if line in server.log.read_text():
            return name
    return None


def _check_delivery(
    acks: list[dict[str, Any]], tap: Tap
) -> list[tuple[str, int, float, tuple[str, int, int, int], float]]:
    """Every acknowledged put reached the listener once, in per-(member, thread, bucket)
    sequence order (invariants 1 and 2)."""
    events = tap.snapshot()
    seen = [(key, i) for key, i, *_ in events]
    assert len(seen) == len(set(seen)), "an event reached the listener twice"
    acked = {(a["key"], a["i"]) for a in acks if a["ok"]}
    missing = acked - set(seen)
    assert not missing, f"{len(missing)} acknowledged puts never reached the listener"
    last: dict[tuple[str, int, int], int] = {}
    for *_, (member, thread, sequence, bucket), _arrival in events:
        stream = (member, thread, bucket)
        assert sequence > last.get(stream, -1), f"out of order in {stream}"
        last[stream] = sequence
    return events


def _kill_the_busiest_primary(
    servers: dict[str, ServerProcess], redis_client: redis.Redis, namespace: str
) -> dict[int, Any]:
    """SIGKILL the server with the most primaries, wait until each of its buckets has a new
    primary and two seconds more; returns the bucket views it was primary of."""
    before = _status(redis_client, namespace)
    victim = max(before.members, key=lambda m: m.primaries).member_id
    orphaned = {b.bucket: b for b in before.buckets if b.primary == victim}
    servers[victim].kill()
    survivors = {m.member_id for m in before.members} - {victim}
    wait_until(
        lambda: all(
            _status(redis_client, namespace).buckets[b].primary in survivors for b in orphaned
        ),
        timeout_s=_LEASE_TTL_MS / 1000 + 15,
        what="the orphaned buckets to get new primaries",
    )
    time.sleep(2.0)
    return orphaned


@pytest.mark.redis_modes
def test_kill_minus_9_of_a_primary_loses_nothing_duplicates_nothing_and_resumes_in_time(
    cluster: Callable[..., ServerProcess],
    redis_client: redis.Redis,
    namespace: str,
    kafka_bootstrap_servers: str,
    client_factory: Any,
    tmp_path: Path,
) -> None:
    servers = _start_in_order(cluster, redis_client, namespace, ["s1", "s2", "s3"], 1)
    tap = Tap()
    listener = client_factory(read_timeout_ms=30_000)
    listener.create_region("r", listeners=[tap]).register_interest(ALL_KEYS)
    writers = [
        WriterProcess(
            tmp_path,
            name,
            {"namespace": namespace, "bootstrap": kafka_bootstrap_servers, "rate": 150},
        )
        for name in ("w1", "w2")
    ]
    wait_until(lambda: len(tap.snapshot()) > 300, timeout_s=60, what="a steady stream")

    kill_ms = time.time() * 1000
    orphaned = _kill_the_busiest_primary(servers, redis_client, namespace)
    acks = [a for w in writers for a in w.finish()]
    settle(listener, idle_s=1.0)

    for bucket, was in orphaned.items():
        assert _taker(servers, bucket, was.epoch + 1) == was.secondaries[0], (
            f"bucket {bucket}: the new primary is not its longest-lived secondary"
        )
    events = _check_delivery(acks, tap)
    assert sum(a["ok"] for a in acks) > 600
    for bucket in orphaned:
        resumed = [
            arrival - kill_ms
            for _key, _i, sent_ms, eid, arrival in events
            if eid[3] == bucket and sent_ms > kill_ms
        ]
        assert resumed, f"no put sent after the kill reached bucket {bucket}"
        assert min(resumed) <= _LEASE_TTL_MS + 2_000, (
            f"bucket {bucket} resumed {min(resumed):.0f} ms after the kill"
        )


def test_cq_events_survive_the_kill_minus_9_of_a_primary_without_loss_or_duplicate(
    cluster: Callable[..., ServerProcess],
    redis_client: redis.Redis,
    namespace: str,
    kafka_bootstrap_servers: str,
    client_factory: Any,
    tmp_path: Path,
) -> None:
    """docs/behaviour.md §9: CQ events travel in the subscription queue with EventIDs, so a bucket's
    new primary re-evaluates the changes it processes again (against the old values kept with
    their results) and the client's message tracking drops what it had."""
    servers = _start_in_order(cluster, redis_client, namespace, ["s1", "s2", "s3"], 1)
    cq_tap = CqTap()
    listener = client_factory(read_timeout_ms=30_000)
    listener.create_region("r", RegionShortcut.PROXY)
    cq = listener.query_service().new_cq(
        "all", "SELECT * FROM /r v WHERE v.i >= 0", CqAttributes([cq_tap])
    )
    cq.execute()
    writers = [
        WriterProcess(
            tmp_path,
            name,
            {"namespace": namespace, "bootstrap": kafka_bootstrap_servers, "rate": 150},
        )
        for name in ("w1", "w2")
    ]
    wait_until(lambda: len(cq_tap.tap.snapshot()) > 300, timeout_s=60, what="a steady stream")
    _kill_the_busiest_primary(servers, redis_client, namespace)
    acks = [a for w in writers for a in w.finish()]
    settle(listener, idle_s=1.0)
    _check_delivery(acks, cq_tap.tap)
    assert sum(a["ok"] for a in acks) > 600
    assert cq_tap.errors == []
    assert listener.subscription_stats.cq_events_delivered == len(cq_tap.tap.snapshot())
    for key, operations in cq_tap.operations.items():
        # re-evaluated on the old value kept with the result: an update stays an UPDATE
        assert operations == ["CREATE"] + ["UPDATE"] * (len(operations) - 1), key


def test_a_paused_primary_that_lost_its_lease_changes_nothing_when_it_resumes(
    cluster: Callable[..., ServerProcess],
    redis_client: redis.Redis,
    namespace: str,
    kafka_bootstrap_servers: str,
    client_factory: Any,
    tmp_path: Path,
) -> None:
    servers = _start_in_order(cluster, redis_client, namespace, ["s1", "s2"], 1)
    tap = Tap()
    listener = client_factory(read_timeout_ms=30_000)
    listener.create_region("r", listeners=[tap]).register_interest(ALL_KEYS)
    writer = WriterProcess(
        tmp_path, "w1", {"namespace": namespace, "bootstrap": kafka_bootstrap_servers}
    )
    wait_until(lambda: len(tap.snapshot()) > 200, timeout_s=60, what="a steady stream")

    paused = servers["s1"]
    held = {b.bucket for b in _status(redis_client, namespace).buckets if b.primary == "s1"}
    paused.signal(signal.SIGSTOP)
    wait_until(
        lambda: all(_status(redis_client, namespace).buckets[b].primary == "s2" for b in held),
        timeout_s=_LEASE_TTL_MS / 1000 + 15,
        what="s2 to take over the paused server's buckets",
    )
    time.sleep(1.0)
    acks = writer.finish()
    settle(listener, idle_s=1.0)
    keys = RedisKeys(namespace)
    region_state = {
        bucket: (
            redis_client.hgetall(keys.region_values("r", bucket)),
            redis_client.hgetall(keys.region_meta("r", bucket)),
        )
        for bucket in range(_TOTAL_BUCKETS)
    }
    delivered = len(tap.snapshot())

    paused.signal(signal.SIGCONT)
    wait_until(
        lambda: (
            "lost the lease" in paused.log.read_text() or "fenced out" in paused.log.read_text()
        ),
        timeout_s=15,
        what="the resumed server to notice it is no longer primary",
    )
    time.sleep(1.5)
    assert region_state == {
        bucket: (
            redis_client.hgetall(keys.region_values("r", bucket)),
            redis_client.hgetall(keys.region_meta("r", bucket)),
        )
        for bucket in range(_TOTAL_BUCKETS)
    }, "the resumed old primary changed the region in Redis"
    settle(listener, idle_s=1.0)
    assert len(tap.snapshot()) == delivered, "the resumed old primary caused a listener event"
    _check_delivery(acks, tap)


def test_failover_without_a_spare_completes_and_a_joining_server_restores_redundancy(
    cluster: Callable[..., ServerProcess], redis_client: redis.Redis, namespace: str
) -> None:
    servers = _start_in_order(cluster, redis_client, namespace, ["s1", "s2", "s3"], 2)
    before = _status(redis_client, namespace)
    victim = before.buckets[0].primary
    assert victim is not None
    orphaned = {b.bucket: b.epoch for b in before.buckets if b.primary == victim}
    servers[victim].kill()
    survivors = {"s1", "s2", "s3"} - {victim}
    oldest = min(survivors)  # started first
    wait_until(
        lambda: all(
            _status(redis_client, namespace).buckets[b].primary in survivors for b in orphaned
        ),
        timeout_s=_LEASE_TTL_MS / 1000 + 15,
        what="failover with no spare server",
    )
    for bucket, epoch in orphaned.items():
        assert _taker(servers, bucket, epoch + 1) == oldest, "not the longest-lived secondary"
    # The dead server stays a listed secondary of the other buckets until its membership
    # expires, which need not come before the takeovers.
    wait_until(
        lambda: all(len(b.secondaries) <= 1 for b in _status(redis_client, namespace).buckets),
        timeout_s=_LEASE_TTL_MS / 1000 + 15,
        what="one secondary per bucket, as only one other server is left",
    )

    cluster("s4", 2)
    wait_until(
        _settled(redis_client, namespace, survivors | {"s4"}, 2),
        timeout_s=60,
        what="the fourth server to restore two secondaries per bucket",
    )


@pytest.mark.redis_modes
def test_a_primary_whose_fencing_epoch_is_stale_changes_nothing_and_drops_the_bucket(
    server_settings: ServerSettings,
    client_factory: Any,
    redis_client: redis.Redis,
    namespace: str,
    kafka_bootstrap_servers: str,
) -> None:
    # A long lease: the server does not notice the takeover through its lease before the
    # next operation reaches it, so only the epoch check in the Lua script can stop it.
    settings = server_settings.model_copy(update={"lease_ttl_ms": 60_000})
    with CacheServer(settings) as server:
        writer = client_factory().create_region("r")
        writer.put("k", 1)
        bucket = bucket_of("r", "k", _TOTAL_BUCKETS)
        redis_client.incr(RedisKeys(namespace).epoch(bucket_role(bucket)))  # a takeover
        op, op_bucket = entry_operation("app", OperationKind.PUT, "k", 0, b'"stale"')
        send_raw_operation(kafka_bootstrap_servers, namespace, op, op_bucket)
        wait_until(lambda: server.stats.buckets_lost == 1, what="the server to be fenced out")
        assert server.store.entries("r")["k"].value == b"1"
        assert server.stats.operations_applied == 1


def test_an_unanswered_change_is_sent_again_with_its_event_id_and_applied_once(
    server_settings: ServerSettings, client_factory: Any
) -> None:
    recorder = Recorder()
    first = CacheServer(server_settings)
    first.start()
    try:
        writer_cache = client_factory(retry_interval_ms=300, read_timeout_ms=30_000)
        writer = writer_cache.create_region("r", RegionShortcut.PROXY)
        reader = client_factory(read_timeout_ms=30_000)
        reader.create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
    finally:
        first.stop()
    # No server answers now: the put waits in Kafka while the client resends it.
    applied = writer.put_async("k", 1)
    wait_until(lambda: writer_cache.pool.retries >= 2, what="the client to resend the put")
    successor = server_settings.model_copy(update={"member_id": "successor"})
    with CacheServer(successor) as second:
        applied.result(timeout=30)
        wait_until(lambda: ("create", "k", 1) in recorder.snapshot(), what="the event")
        wait_until(
            lambda: second.stats.duplicates >= writer_cache.pool.retries,
            what="every resend to be recognised",
        )
        settle(reader)
        assert recorder.snapshot() == [("create", "k", 1)]
        assert second.stats.operations_applied == 1
        writer_cache.close()
        reader.close()


@pytest.mark.redis_modes
def test_a_primary_whose_epoch_is_stale_writes_no_interest_registration(
    server_settings: ServerSettings,
    redis_client: redis.Redis,
    namespace: str,
    kafka_bootstrap_servers: str,
) -> None:
    settings = server_settings.model_copy(update={"lease_ttl_ms": 60_000})
    with CacheServer(settings) as server:
        bucket = bucket_of("r", "k", _TOTAL_BUCKETS)
        redis_client.incr(RedisKeys(namespace).epoch(bucket_role(bucket)))  # a takeover
        register = Operation(
            request_id=5,
            client_id="ghost",
            kind=OperationKind.REGISTER_INTEREST,
            region="r",
            timestamp_ms=int(time.time() * 1000),
            interest=InterestSpec(InterestKind.KEYS, ("k",)),
        )
        send_raw_operation(kafka_bootstrap_servers, namespace, register, bucket)
        wait_until(lambda: server.stats.buckets_lost == 1, what="the server to be fenced out")
        assert not redis_client.exists(RedisKeys(namespace).interest("ghost"))
