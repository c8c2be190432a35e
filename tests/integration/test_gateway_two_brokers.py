"""docs/behaviour.md §6 with the remote site on its own Kafka broker: while the remote Kafka
cannot be reached the batch stays queued and is retried on an interval; once the remote
site is up, everything queued arrives."""

from __future__ import annotations

from contextlib import ExitStack

from gateway_sites import Site, site_namespaces
from support import wait_until

from regionbus.devstack import EmbeddedKafka, free_port


def test_remote_site_on_its_own_kafka_unreachable_at_first_then_gets_every_queued_event(
    namespace: str, kafka_bootstrap_servers: str, redis_url: str
) -> None:
    ns_a, ns_b = site_namespaces(namespace, 2)
    remote_port = free_port()
    with ExitStack() as stack:
        a = Site(stack, ns_a, kafka_bootstrap_servers, redis_url, 1)
        b = Site(stack, ns_b, f"127.0.0.1:{remote_port}", redis_url, 2)
        a.start_server(senders={"to-b": 2})
        sender = a.start_sender("to-b", b, retry_interval_ms=300, ack_timeout_ms=20_000)
        region = a.client().create_region("r")
        region.put_all({f"k{i}": i for i in range(50)})
        wait_until(lambda: sender.stats.unreachable_retries >= 2, 60, "retries while down")
        region.put("late", "queued while down")

        remote_kafka = stack.enter_context(EmbeddedKafka(port=remote_port))
        assert remote_kafka.bootstrap_servers == b.kafka
        b.start_server()
        receiver = b.start_receiver()
        b.wait_for("late", b'"queued while down"', timeout_s=90)

        wait_until(lambda: b.values() == a.values(), 60, "every queued event on site B")
        assert len(b.values()) == 51
        # the receiver counts replies after the servers applied: wait for its ack
        wait_until(lambda: sender.stats.events_dispatched == 51, 30, "the ack")
        assert receiver.stats.events_applied == 51
        assert sender.stats.batches_redispatched == 0
