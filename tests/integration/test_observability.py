"""Issue 7: the metrics endpoints and ``regionbus status`` show the live figures of a
running local stack (real Kafka and Redis), scraped over HTTP and run as the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from gateway_sites import Site, running_sites, start_async_event_queue
from prometheus_client.parser import text_string_to_metric_families
from support import Recorder, wait_until

from regionbus.broker.config import GatewayQueueSpec, ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.broker.status import cluster_status
from regionbus.clients import ALL_KEYS
from regionbus.gateways.async_event_queue import AsyncEvent, AsyncEventListener
from regionbus.gateways.receiver import GatewayReceiver, GatewayReceiverSettings
from regionbus.gateways.sender import GatewaySender
from regionbus.gateways.sender_settings import GatewaySenderSettings
from regionbus.schemas.kafka_clients import kafka_producer
from regionbus.schemas.naming import Topics, client_partition

_PUTS = 20
_REGIONBUS = Path(sys.executable).with_name("regionbus")


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str | None) -> Samples:
    """GET a metrics endpoint and parse it with ``prometheus_client.parser``."""
    assert url is not None, "no metrics endpoint is running"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of the one sample named ``name`` whose labels include ``labels``."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, f"several samples of {name} {labels}"
    return found[0] if found else None


def wait_for_sample(
    url: str | None, name: str, expected: Any, timeout_s: float = 30, **labels: str
) -> Samples:
    """Scrape until ``expected(value)`` holds for the sample; return that scrape."""
    last: list[Samples] = []

    def holds() -> bool:
        last[:] = [scrape(url)]
        found = value(last[0], name, **labels)
        return found is not None and bool(expected(found))

    wait_until(holds, timeout_s, f"{name}{labels} on {url}")
    return last[0]


class _Accepting(AsyncEventListener):
    """Counts the events it accepts; refuses the first ``refusals`` batches."""

    def __init__(self, refusals: int = 0) -> None:
        self.refusals = refusals
        self.events = 0
        self.lock = threading.Lock()

    def process_events(self, events: list[AsyncEvent]) -> bool:
        with self.lock:
            if self.refusals:
                self.refusals -= 1
                return False
            self.events += len(events)
            return True


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as exits:
        yield exits


def _run_status(namespace: str, kafka: str, redis_url: str, *args: str) -> str:
    env = {
        **os.environ,
        "REGIONBUS_NAMESPACE": namespace,
        "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS": kafka,
        "REGIONBUS_REDIS_URL": redis_url,
        "COLUMNS": "300",
    }
    done = subprocess.run(
        [str(_REGIONBUS), "status", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_server_endpoint_and_regionbus_status_show_the_live_figures_of_a_local_stack(
    namespace: str, kafka_bootstrap_servers: str, redis_url: str, stack: ExitStack
) -> None:
    remote_namespace = f"{namespace}.b"
    server = CacheServer(
        ServerSettings(
            namespace=namespace,
            kafka_bootstrap_servers=kafka_bootstrap_servers,
            redis_url=redis_url,
            regions=["r"],
            fetch_wait_max_ms=100,
            poll_timeout_ms=20,
            message_sync_interval_s=0.2,
            distributed_system_id=1,
            gateway_senders={"to-b": GatewayQueueSpec(remote_distributed_system_id=2)},
            async_event_queues={"audit": GatewayQueueSpec()},
            region_gateway_senders={"r": ["to-b"]},
            region_async_event_queues={"r": ["audit"]},
            metrics_port=0,
            metrics_client_labels=True,
        )
    )
    server.start()
    stack.callback(server.stop)
    url = server.metrics_url
    assert server.metrics_port and url == f"http://127.0.0.1:{server.metrics_port}/metrics"

    # Workers of the site: an async event queue that accepts everything, a sender whose
    # remote site has no receiver (so its backlog stays), and a receiver of this site.
    site = Site(stack, namespace, kafka_bootstrap_servers, redis_url, 1)
    listener = _Accepting()
    aeq = start_async_event_queue(site, "audit", listener)
    sender = GatewaySender(
        GatewaySenderSettings(
            sender_id="to-b",
            namespace=namespace,
            kafka_bootstrap_servers=kafka_bootstrap_servers,
            redis_url=redis_url,
            distributed_system_id=1,
            remote_distributed_system_id=2,
            remote_namespace=remote_namespace,
            remote_kafka_bootstrap_servers=kafka_bootstrap_servers,
            batch_time_interval_ms=100,
            lease_ttl_ms=3000,
        )
    )
    sender.start()
    stack.callback(sender.stop)
    assert sender.wait_primary(30)
    receiver = GatewayReceiver(
        GatewayReceiverSettings(
            namespace=namespace,
            kafka_bootstrap_servers=kafka_bootstrap_servers,
            redis_url=redis_url,
            distributed_system_id=1,
            fetch_wait_max_ms=100,
        )
    )
    receiver.start()
    stack.callback(receiver.stop)

    # A subscribed client, a durable client that goes away, and a writer. The subscriber
    # reads the durable client's partition of the queue topic, so the two share one record
    # per event (one interest): the subscriber's depth must still be its own, not the
    # backlog the away client leaves in that shared queue.
    partitions = server.settings.client_topic_partitions
    live_id = next(
        f"live-{n}"
        for n in range(10_000)
        if client_partition(f"live-{n}", partitions) == client_partition("desk", partitions)
    )
    recorder = Recorder()
    subscriber = site.client(client_id=live_id)
    subscriber.create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
    durable = site.client(durable_client_id="desk", durable_client_timeout_s=600)
    durable.create_region("r").register_interest(ALL_KEYS, durable=True)
    durable.ready_for_events()
    durable.close(keep_alive=True)
    writer = site.client().create_region("r")
    for future in [writer.put_async(f"k{i:02d}", i) for i in range(_PUTS)]:
        future.result(30)
    wait_until(lambda: len(recorder.snapshot()) == _PUTS, 30, "the subscriber's events")

    samples = scrape(url)
    member = server.settings.member_id
    assert value(samples, "regionbus_operations_applied_total", region="r", kind="put") == _PUTS
    assert value(samples, "regionbus_operations_applied_total", namespace=namespace, member=member)
    routed = value(samples, "regionbus_events_routed_total", client=subscriber.client_id)
    assert routed is not None and routed >= _PUTS
    assert value(samples, "regionbus_events_routed_total", client="desk") == _PUTS
    assert value(samples, "regionbus_bucket_primaries") == 16
    assert value(samples, "regionbus_bucket_primaries_gained_total") == 16
    assert value(samples, "regionbus_bucket_primaries_fenced_total") == 0
    assert value(samples, "regionbus_durable_clients", state="away") == 1
    assert value(samples, "regionbus_durable_clients", state="connected") == 0
    # The away durable client acks nothing: its depth holds every event queued for it;
    # the live subscriber acks, so its depth comes back to 0.
    wait_for_sample(
        url, "regionbus_subscription_queue_depth_events", lambda v: v >= _PUTS, client="desk"
    )
    wait_for_sample(
        url,
        "regionbus_subscription_queue_depth_events",
        lambda v: v == 0,
        client=subscriber.client_id,
    )

    # One broken message on {ns}.ops is one more dead letter, categorised.
    before = value(scrape(url), "regionbus_dead_letters_total", category="undecodable") or 0
    producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers})
    producer.produce(Topics(namespace).ops, b"\x00not a regionbus message", partition=3)
    assert producer.flush(10) == 0
    samples = wait_for_sample(
        url,
        "regionbus_dead_letters_total",
        lambda v: v == before + 1,
        category="undecodable",
    )
    assert server.stats.dead_letters == before + 1

    # regionbus status, as the CLI: wait in-process for the live figures to settle first.
    wait_until(lambda: listener.events == _PUTS, 30, "the async event queue's listener")
    wait_until(
        lambda: (
            [
                q.backlog_events
                for q in _status(namespace, kafka_bootstrap_servers, redis_url).async_event_queues
            ]
            == [0]
        ),
        30,
        "the async event queue's backlog to drain",
    )
    shown = json.loads(_run_status(namespace, kafka_bootstrap_servers, redis_url, "--json"))
    assert shown["namespace"] == namespace
    assert [m["member_id"] for m in shown["members"]] == [member]
    assert shown["members"][0]["primaries"] == 16
    assert len(shown["buckets"]) == 16 and {b["primary"] for b in shown["buckets"]} == {member}
    queues = {q["client_id"]: q for q in shown["queues"]}
    assert queues[subscriber.client_id]["state"] == "connected"
    assert queues["desk"]["durable"] and queues["desk"]["state"] == "away"
    assert queues["desk"]["depth_messages"] >= 1
    [desk] = shown["durable_clients"]
    assert desk["client_id"] == "desk" and desk["state"] == "away"
    assert desk["durable_client_timeout_s"] == 600
    assert desk["expires_at_ms"] == desk["away_since_ms"] + 600_000
    [to_b] = shown["gateway_senders"]
    assert to_b["queue_id"] == "to-b" and to_b["topic"] == f"{namespace}.gw.to-b"
    assert to_b["primary"] == sender.member_id and to_b["epoch"] >= 1
    # The remote site never acks: every event queued for it is backlog (one record each).
    assert to_b["backlog_events"] == _PUTS
    [audit] = shown["async_event_queues"]
    assert audit["queue_id"] == "audit" and audit["primary"] == aeq.member_id
    assert audit["backlog_events"] == 0
    [inbound] = shown["gateway_receivers"]
    assert inbound["receiver_id"] == "receiver" and inbound["pending_batches"] == 0

    table = _run_status(namespace, kafka_bootstrap_servers, redis_url)
    for section in (
        f"members of {namespace}",
        "buckets",
        "subscription queues",
        "durable clients",
        "gateway senders",
        "gateway receivers",
        "async event queues",
    ):
        assert section in table, section
    for shown_id in (member, "desk", "to-b", "audit", sender.member_id, aeq.member_id):
        assert shown_id in table, shown_id


def _status(namespace: str, kafka: str, redis_url: str) -> Any:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return cluster_status(client, namespace, 16, {"bootstrap.servers": kafka})
    finally:
        client.close()


@pytest.fixture
def sites(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[list[Site]]:
    with running_sites(namespace, kafka_bootstrap_servers, redis_url, 2) as started:
        yield started


def test_gateway_sender_and_receiver_endpoints_count_batches_acks_resends_and_backlog(
    sites: list[Site],
) -> None:
    a, b = sites
    b.start_server()
    a.start_server(senders={"to-b": 2})
    sender = a.start_sender(
        "to-b", b, ack_timeout_ms=1000, batch_time_interval_ms=100, metrics_port=0
    )
    region = a.client().create_region("r")
    for future in [region.put_async(f"k{i}", i) for i in range(10)]:
        future.result(30)

    # No receiver yet: the batch is sent, not acked, resent; its events stay queued.
    samples = wait_for_sample(
        sender.metrics_url, "regionbus_gateway_sender_batches_resent_total", lambda v: v >= 1
    )
    assert value(samples, "regionbus_gateway_sender_batches_acked_total", sender="to-b") == 0
    backlog = value(samples, "regionbus_gateway_sender_backlog_events")
    assert backlog is not None and backlog >= 1
    assert value(samples, "regionbus_gateway_sender_primary") == 1

    receiver = b.start_receiver(metrics_port=0)
    samples = wait_for_sample(
        sender.metrics_url, "regionbus_gateway_sender_events_acked_total", lambda v: v == 10
    )
    acked = value(samples, "regionbus_gateway_sender_batches_acked_total")
    # Each acked batch's round trip, from its last send to its ack.
    trips = value(samples, "regionbus_gateway_sender_batch_round_trip_seconds_count")
    assert trips == acked
    assert (value(samples, "regionbus_gateway_sender_batch_round_trip_seconds_sum") or 0) > 0
    sent = value(samples, "regionbus_gateway_sender_batches_sent_total")
    resent = value(samples, "regionbus_gateway_sender_batches_resent_total")
    assert acked is not None and acked >= 1
    assert sent is not None and resent is not None and sent >= acked + resent
    wait_for_sample(sender.metrics_url, "regionbus_gateway_sender_backlog_events", lambda v: v == 0)

    wait_for_sample(
        receiver.metrics_url,
        "regionbus_gateway_receiver_events_applied_total",
        lambda v: v == 10,
        receiver="receiver",
        namespace=b.namespace,
    )
    # An ack is counted at its delivery report, which the receiver's loop serves at its
    # next poll: it may come after the sender read the ack.
    wait_for_sample(
        receiver.metrics_url, "regionbus_gateway_receiver_batches_acked_total", lambda v: v >= 1
    )
    # The resends, flagged possible duplicate, may be read after the first sends were
    # applied and acked (a later fetch): counted once the receiver reaches them.
    wait_for_sample(
        receiver.metrics_url,
        "regionbus_gateway_receiver_possible_duplicate_batches_total",
        lambda v: v >= 1,
    )
    assert receiver.metrics_port != sender.metrics_port


def test_async_event_queue_endpoint_counts_a_refused_batch_as_one_retry(
    namespace: str, kafka_bootstrap_servers: str, redis_url: str, stack: ExitStack
) -> None:
    site = Site(stack, namespace, kafka_bootstrap_servers, redis_url, 1)
    site.start_server(async_event_queues=("audit",))
    listener = _Accepting(refusals=1)
    queue = start_async_event_queue(site, "audit", listener, retry_interval_ms=10, metrics_port=0)
    region = site.client().create_region("r")
    region.put_all({f"k{i}": i for i in range(5)})

    samples = wait_for_sample(
        queue.metrics_url,
        "regionbus_async_event_queue_events_dispatched_total",
        lambda v: v == 5,
        queue="audit",
    )
    assert value(samples, "regionbus_async_event_queue_retries_total") == 1
    dispatched = value(samples, "regionbus_async_event_queue_batches_dispatched_total")
    assert dispatched is not None and dispatched >= 1
    assert value(samples, "regionbus_async_event_queue_primary") == 1
    assert value(samples, "regionbus_async_event_queue_paused") == 0
    wait_for_sample(
        queue.metrics_url, "regionbus_async_event_queue_backlog_events", lambda v: v == 0
    )
    port = queue.metrics_port
    queue.stop()
    assert queue.metrics_url is None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)


def test_regionbus_serve_prints_its_metrics_url_and_logs_json_lines_with_member_and_namespace(
    namespace: str, kafka_bootstrap_servers: str, redis_url: str
) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "regionbus",
            "serve",
            "--namespace",
            namespace,
            "--kafka",
            kafka_bootstrap_servers,
            "--redis",
            redis_url,
            "--region",
            "r",
            "--metrics-port",
            "0",
            "--log-format",
            "json",
        ],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    assert process.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(process.stdout or []), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any(line.startswith("metrics at ") for line in lines), 60, "the URL")
        url = next(line for line in lines if line.startswith("metrics at ")).split()[-1]
        samples = wait_for_sample(url, "regionbus_bucket_primaries", lambda v: v == 16)
        assert value(samples, "regionbus_bucket_primaries", namespace=namespace) == 16
    finally:
        process.send_signal(signal.SIGTERM)
        _, errors = process.communicate(timeout=60)
    assert process.returncode == 0, errors
    logged = [json.loads(line) for line in errors.splitlines() if line.startswith("{")]
    assert logged, errors
    assert all(r["namespace"] == namespace and r["member"].startswith("server-") for r in logged)
    assert any("serving" in r["message"] for r in logged)
