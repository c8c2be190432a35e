"""The admin side of one client: its first contact with Kafka (the servers' ``{ns}.ops``
topic must exist), the shared queue and reply topics of its Kafka principal (made if it is
the principal's first client), its partition of each, and the deletion of its acks."""

from __future__ import annotations

import time
from contextlib import suppress
from typing import NamedTuple

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from regionbus.clients.settings import ClientSettings
from regionbus.schemas.errors import ConfigurationError, TransportError, UnconnectedError
from regionbus.schemas.kafka_clients import kafka_admin
from regionbus.schemas.kafka_outage import quiet_config
from regionbus.schemas.naming import Topics, client_partition
from regionbus.schemas.topics import client_topic_specs, ensure_topics
from regionbus.schemas.transport import kafka_error, leader_moving, topic_partitions


class ClientAddress(NamedTuple):
    """Where one client's subscription queue and replies are.

    Attributes:
        queue_topic: Its Kafka principal's shared queue topic.
        queue_partition: The partition of it the client reads.
        reply_topic: Its Kafka principal's shared reply topic.
        reply_partition: The partition of it the client reads.
        key: The record key addressing the client (its id, UTF-8).
    """

    queue_topic: str
    queue_partition: int
    reply_topic: str
    reply_partition: int
    key: bytes


class ClientTopicAdmin:
    """The admin client of one client cache, for its own topics.

    Args:
        settings: The client's settings (address, namespace, timeouts, security).
        topics: The namespace's topic names.
        client_id: The client id (the key of its records, its consumer group).

    Raises:
        confluent_kafka.KafkaException: librdkafka refused the settings.
    """

    def __init__(self, settings: ClientSettings, topics: Topics, client_id: str) -> None:
        self._settings = settings
        self._topics = topics
        self._client_id = client_id
        self._handle: AdminClient | None = kafka_admin(settings.librdkafka(**quiet_config()))

    @property
    def _admin(self) -> AdminClient:
        """The admin client, until :meth:`close`.

        Raises:
            UnconnectedError: the client cache was closed.
        """
        if self._handle is None:
            raise UnconnectedError("the client cache was closed")
        return self._handle

    def close(self) -> None:
        """Destroy the admin client now. It has no close of its own, and a Region <->
        ClientCache cycle would otherwise keep it, reconnecting to a broker that may be
        gone, until garbage collection."""
        self._handle = None

    def wait_for_ops_topic(self) -> int:
        """The partition count of ``{ns}.ops`` once it exists.

        Raises:
            TransportError: Kafka did not answer, or the topic did not appear, within
                ``first_contact_timeout_s``; the message names the address and the namespace and
                says how to fix them.
        """
        timeout_s = self._settings.first_contact_timeout_s
        deadline = time.monotonic() + timeout_s
        servers = self._settings.kafka_bootstrap_servers
        while True:
            remaining_s = deadline - time.monotonic()
            try:
                partitions = topic_partitions(
                    self._admin, self._topics.ops, min(5.0, max(remaining_s, 0.1))
                )
            except TransportError as exc:
                # Serves the admin client's librdkafka log lines, so the WARNING naming
                # the unreachable broker is logged before the error.
                self._admin.poll(0)
                if time.monotonic() >= deadline:
                    raise TransportError(
                        f"Kafka at {servers} did not answer within {timeout_s * 1000:.0f} ms "
                        f"({exc}): is Kafka running there? Set kafka_bootstrap_servers (env "
                        "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS) to its address, or start a local "
                        "one with `regionbus stack`"
                    ) from exc
                continue
            if partitions:
                return partitions
            if time.monotonic() >= deadline:
                raise TransportError(self._no_servers_message(timeout_s))
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))

    def _no_servers_message(self, timeout_s: float) -> str:
        namespace = self._settings.namespace
        message = (
            f"no cache server of namespace {namespace!r} on Kafka at "
            f"{self._settings.kafka_bootstrap_servers}: topic {self._topics.ops} did not appear "
            f"within {timeout_s * 1000:.0f} ms. Start one (`regionbus serve --namespace "
            f"{namespace}` or `regionbus stack --namespace {namespace}`), or set namespace "
            "(env REGIONBUS_NAMESPACE) to that of running servers"
        )
        try:
            names = self._admin.list_topics(timeout=2.0).topics
        except KafkaException:
            return message
        found = sorted(t.removesuffix(".ops") for t in names if t.endswith(".ops"))
        return f"{message}; namespaces with servers there: {', '.join(found)}" if found else message

    def address(self) -> ClientAddress:
        """Where this client's queue and replies are: the shared topics of its Kafka
        principal, made if missing (the principal's first client makes its pair; the
        servers make the namespace's unscoped pair), waited for until both have a leader.

        Raises:
            KafkaAuthorizationError: the Kafka principal may not create or describe them.
            TransportError: the broker refused, or the topics had no leader within
                ``metadata_timeout_s``.
        """
        principal = self._settings.topic_principal
        specs = client_topic_specs(self._topics, principal)
        timeout_s = self._settings.metadata_timeout_s
        counts = [topic_partitions(self._admin, spec.name, timeout_s) for spec in specs]
        if not all(counts):
            try:
                ensure_topics(self._admin, specs, timeout_s=timeout_s)
            except ConfigurationError as exc:
                raise TransportError(str(exc)) from exc
            counts = [topic_partitions(self._admin, spec.name, timeout_s) for spec in specs]
        queue, reply = specs[0].name, specs[1].name
        return ClientAddress(
            queue,
            client_partition(self._client_id, counts[0]),
            reply,
            client_partition(self._client_id, counts[1]),
            self._client_id.encode(),
        )

    def end_of(self, topic: str, partition: int) -> int:
        """The high watermark of one partition (asked of its leader by the admin client,
        whose connection no long-polling fetch holds).

        Raises:
            KafkaAuthorizationError: the principal may not describe the topic.
            TransportError: Kafka did not answer within ``metadata_timeout_s``.
        """
        timeout_s = self._settings.metadata_timeout_s
        wanted = TopicPartition(topic, partition)
        try:
            for attempt in Retrying(
                stop=stop_after_delay(timeout_s),
                wait=wait_exponential(multiplier=0.02, max=0.5),
                retry=retry_if_exception(leader_moving),
                reraise=True,
            ):
                with attempt:
                    answer = self._admin.list_offsets(
                        {wanted: OffsetSpec.latest()}, request_timeout=timeout_s
                    )[wanted].result(timeout=timeout_s)
        except KafkaException as exc:
            raise kafka_error(exc, f"end of {topic}[{partition}]", f"topic {topic}") from exc
        except TimeoutError as exc:
            where = f"{topic}[{partition}]"
            raise TransportError(f"end of {where}: no answer in {timeout_s} s") from exc
        return max(int(answer.offset), 0)

    def delete_acks(self) -> None:
        """Delete this client's consumer group (its acks), best effort, at a non-durable
        close; the reaper deletes it otherwise once the servers have forgotten it."""
        with suppress(Exception):
            deleted = self._admin.delete_consumer_groups(
                [self._topics.client_group(self._client_id)]
            )
            for future in deleted.values():
                with suppress(Exception):
                    future.result(timeout=5)


__all__ = ["ClientAddress", "ClientTopicAdmin"]
