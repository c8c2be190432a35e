"""Issue 41, against real Kafka and Redis: the latency histograms count what a server and
its clients did, per-client series stay off by default (the deepest queues stand in),
``regionbus status`` tells each client's own lag in a shared partition, and a server's
``/healthz`` and ``/readyz`` follow its loop and its Redis."""

from __future__ import annotations

import os
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis
from support import Recorder, wait_until
from test_observability import Samples, scrape, value, wait_for_sample

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.broker.status import ClusterStatus, cluster_status
from regionbus.clients import ALL_KEYS, ClientCache, ClientSettings
from regionbus.devstack import EmbeddedRedis
from regionbus.schemas.callbacks import CacheListener, EntryEvent
from regionbus.schemas.naming import client_partition
from regionbus.schemas.topics import DEFAULT_CLIENT_PARTITIONS

_PUTS = 20
_BUCKETS = 16


def _settings(namespace: str, kafka: str, redis_url: str, **overrides: object) -> ServerSettings:
    return ServerSettings(
        namespace=namespace,
        kafka_bootstrap_servers=kafka,
        redis_url=redis_url,
        regions=["r", "other"],
        fetch_wait_max_ms=100,
        poll_timeout_ms=20,
        message_sync_interval_s=0.2,
        metrics_port=0,
        **overrides,  # type: ignore[arg-type]
    )


def _client(namespace: str, kafka: str, stack: ExitStack, **overrides: object) -> ClientCache:
    cache = ClientCache(
        ClientSettings(
            namespace=namespace,
            kafka_bootstrap_servers=kafka,
            fetch_wait_max_ms=100,
            read_timeout_ms=30_000,
            **overrides,  # type: ignore[arg-type]
        )
    )
    stack.callback(cache.close)
    return cache


def _sharing(client_id: str, prefix: str) -> str:
    """A client id whose queue partition is ``client_id``'s."""
    partitions = DEFAULT_CLIENT_PARTITIONS
    home = client_partition(client_id, partitions)
    return next(
        f"{prefix}-{n}"
        for n in range(10_000)
        if client_partition(f"{prefix}-{n}", partitions) == home
    )


def test_histograms_count_the_puts_applied_queued_heard_and_replayed_and_labels_stay_off(
    namespace: str, kafka_bootstrap_servers: str, redis_url: str
) -> None:
    with ExitStack() as stack:
        server = CacheServer(_settings(namespace, kafka_bootstrap_servers, redis_url))
        server.start()
        stack.callback(server.stop)

        recorder = Recorder()
        subscriber = _client(namespace, kafka_bootstrap_servers, stack, metrics_port=0)
        subscriber.create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
        # Two durable clients away in one queue partition: "desk" is behind by every put,
        # its neighbour by none of its own, though the partition holds desk's records past
        # its ack too.
        neighbour_id = _sharing("desk", "neighbour")
        for durable_id, region in (("desk", "r"), (neighbour_id, "other")):
            durable = _client(
                namespace, kafka_bootstrap_servers, stack, durable_client_id=durable_id
            )
            durable.create_region(region).register_interest(ALL_KEYS, durable=True)
            durable.ready_for_events()
            # Past its markers before it goes: its ack then leaves none of them behind.
            wait_until(lambda c=durable: not c.replaying, 30, f"{durable_id} live")
            durable.close(keep_alive=True)
        writer = _client(namespace, kafka_bootstrap_servers, stack).create_region("r")
        # One at a time: one batch, so one queue record, per put.
        for i in range(_PUTS):
            writer.put(f"k{i:02d}", i)
        wait_until(lambda: len(recorder.snapshot()) == _PUTS, 30, "the subscriber's events")

        # The server: one put -> queued per change queued, batches applied, markers timed.
        url = server.metrics_url
        samples = wait_for_sample(
            url, "regionbus_put_to_queued_seconds_count", lambda v: v == _PUTS
        )
        applies = value(samples, "regionbus_operation_batch_apply_seconds_count")
        assert applies is not None and 1 <= applies <= _PUTS
        assert (value(samples, "regionbus_operation_batch_apply_seconds_sum") or 0) > 0
        # Each ready_for_events: one marker per bucket.
        assert value(samples, "regionbus_durable_marker_seconds_count") == 2 * _BUCKETS
        assert value(samples, "process_cpu_seconds_total") is not None
        assert value(samples, "python_gc_collections_total", generation="0") is not None
        assert [labels for (name, labels) in samples if name == "regionbus_build_info"]
        # What the observability profile's alert rules divide by and count.
        capacity = value(samples, "regionbus_subscription_queue_capacity_events")
        assert capacity == server.settings.maximum_message_count
        assert value(samples, "regionbus_buckets_without_primary") == 0

        # No per-client series by default: totals, and the deepest queues by name.
        assert not [
            labels
            for (name, labels) in samples
            if name
            in ("regionbus_events_routed_total", "regionbus_subscription_queue_depth_events")
            and any(label == "client" for label, _ in labels)
        ]
        routed = value(samples, "regionbus_events_routed_total")
        assert routed is not None and routed >= 2 * _PUTS
        # Each queue's depth is as of its reader's last ack read, asked per sync and
        # answered later, reader by reader: the neighbour's own read (its markers acked)
        # may land a sync after desk's. Until it does, the neighbour shows at most its own
        # markers, never desk's puts.
        depth = "regionbus_subscription_queue_depth_top_events"
        tops: list[Samples] = []

        def desk_behind_and_neighbour_not() -> bool:
            tops[:] = [scrape(url)]
            neighbour = value(tops[0], depth, client=neighbour_id)
            assert neighbour is None or neighbour <= _BUCKETS, "charged with desk's records"
            return value(tops[0], depth, client="desk") == _PUTS and neighbour is None

        wait_until(desk_behind_and_neighbour_not, 30, "desk's depth and the neighbour's none")
        backlog = value(tops[0], "regionbus_subscription_backlog_events")
        assert backlog is not None and backlog >= _PUTS

        # The subscriber: put -> listener per event heard, and its queue's counters.
        heard = scrape(subscriber.metrics_url)
        assert value(heard, "regionbus_client_put_to_listener_seconds_count") == _PUTS
        assert (
            value(heard, "regionbus_client_events_delivered_total", client=subscriber.client_id)
            == _PUTS
        )
        assert value(heard, "regionbus_client_replay_seconds_count") == 0

        # regionbus status: desk is behind by its own records; its neighbour, reading the
        # same partition, by none of its own however many records follow its ack.
        client = redis.Redis.from_url(redis_url)
        stack.callback(client.close)
        kafka = {"bootstrap.servers": kafka_bootstrap_servers}
        read: list[ClusterStatus] = []

        def subscriber_acked() -> bool:
            read[:] = [cluster_status(client, namespace, _BUCKETS, kafka, 10.0)]
            return {q.client_id: q.lag_records for q in read[0].queues}[subscriber.client_id] == 0

        # The subscriber acks what it heard every subscription_ack_interval_ms.
        wait_until(subscriber_acked, 30, "the subscriber's ack")
        status = read[0]
        queues = {q.client_id: q for q in status.queues}
        desk, neighbour = queues["desk"], queues[neighbour_id]
        assert desk.queue_partition == neighbour.queue_partition
        assert desk.lag_records == _PUTS
        assert neighbour.depth_messages is not None and neighbour.depth_messages >= _PUTS
        assert neighbour.lag_records == 0
        assert not status.unreadable

        # desk comes back: its replay of every put is timed once, on its own endpoint.
        back = _client(
            namespace, kafka_bootstrap_servers, stack, durable_client_id="desk", metrics_port=0
        )
        back.create_region("r").register_interest(ALL_KEYS, durable=True)
        back.ready_for_events()
        wait_until(lambda: not back.replaying, 30, "desk's replay to end")
        replayed = scrape(back.metrics_url)
        assert value(replayed, "regionbus_client_replay_seconds_count") == 1
        assert value(replayed, "regionbus_client_events_replayed_total") == _PUTS
        assert value(replayed, "regionbus_client_put_to_listener_seconds_count") == 0
        wait_for_sample(url, "regionbus_durable_marker_seconds_count", lambda v: v == 3 * _BUCKETS)


def test_per_client_series_come_back_with_metrics_client_labels(
    namespace: str, kafka_bootstrap_servers: str, redis_url: str
) -> None:
    with ExitStack() as stack:
        server = CacheServer(
            _settings(
                namespace,
                kafka_bootstrap_servers,
                redis_url,
                metrics_client_labels=True,
                metrics_top_clients=0,
            )
        )
        server.start()
        stack.callback(server.stop)
        subscriber = _client(namespace, kafka_bootstrap_servers, stack)
        recorder = Recorder()
        subscriber.create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
        writer = _client(namespace, kafka_bootstrap_servers, stack).create_region("r")
        writer.put("k", 1)
        wait_until(lambda: len(recorder.snapshot()) == 1, 30, "the event")
        samples = wait_for_sample(
            server.metrics_url,
            "regionbus_subscription_queue_depth_events",
            lambda v: v == 0,
            client=subscriber.client_id,
        )
        assert value(samples, "regionbus_events_routed_total", client=subscriber.client_id) == 1
        assert not [n for (n, _) in samples if n == "regionbus_subscription_queue_depth_top_events"]


# --- probes -----------------------------------------------------------------------------


class _Blocking(CacheListener):
    """A server listener that holds the server's loop on the key ``block`` until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def after_create(self, event: EntryEvent) -> None:
        if event.key == "block":
            self.entered.set()
            self.release.wait(60)


def _probe(url: str | None, path: str) -> tuple[int, str]:
    assert url is not None
    try:
        with urllib.request.urlopen(url.replace("/metrics", path), timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A Redis of this test only: it is stopped (SIGSTOP) and resumed."""
    server = EmbeddedRedis(work_dir=tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        if server.pid is not None:
            os.kill(server.pid, signal.SIGCONT)
        server.close()


def test_healthz_and_readyz_follow_a_stalled_loop_and_a_hung_redis(
    namespace: str, kafka_bootstrap_servers: str, own_redis: EmbeddedRedis
) -> None:
    listener = _Blocking()
    with ExitStack() as stack:
        server = CacheServer(
            _settings(
                namespace,
                kafka_bootstrap_servers,
                own_redis.url,
                liveness_timeout_s=3.0,
                redis_socket_timeout_s=1.0,
                lease_ttl_ms=3000,
            ),
            listeners={"r": [listener]},
        )
        server.start()
        stack.callback(server.stop)
        stack.callback(listener.release.set)
        url = server.metrics_url
        wait_until(lambda: _probe(url, "/readyz") == (200, "ok\n"), 30, "ready")
        assert _probe(url, "/healthz") == (200, "ok\n")

        # A listener that does not return holds the loop: neither live nor ready.
        region = _client(namespace, kafka_bootstrap_servers, stack).create_region("r")
        pending = region.put_async("block", 1)
        assert listener.entered.wait(30)
        wait_until(lambda: _probe(url, "/healthz")[0] == 503, 30, "not live")
        _, reason = _probe(url, "/healthz")
        assert "loop has not turned for" in reason
        assert _probe(url, "/readyz")[0] == 503
        listener.release.set()
        pending.result(30)
        wait_until(lambda: _probe(url, "/healthz") == (200, "ok\n"), 30, "live again")
        wait_until(lambda: _probe(url, "/readyz") == (200, "ok\n"), 30, "ready again")

        # A hung Redis is waited out: live, not ready, until it answers again.
        assert own_redis.pid is not None
        os.kill(own_redis.pid, signal.SIGSTOP)
        try:
            wait_until(
                lambda: _probe(url, "/readyz") == (503, "waiting: Redis unavailable\n"),
                30,
                "not ready while Redis hangs",
            )
            assert _probe(url, "/healthz") == (200, "waiting: Redis unavailable\n")
        finally:
            os.kill(own_redis.pid, signal.SIGCONT)
        wait_until(lambda: _probe(url, "/readyz") == (200, "ok\n"), 60, "ready after Redis")
