"""The admin side of one client: its first contact with Kafka (the servers' ``{ns}.ops``
topic must exist), and the creation and deletion of its own queue and reply topics."""

from __future__ import annotations

import time
from contextlib import suppress

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from regionbus.clients.settings import ClientSettings
from regionbus.schemas.errors import ConfigurationError, TransportError, UnconnectedError
from regionbus.schemas.kafka_clients import kafka_admin
from regionbus.schemas.kafka_outage import quiet_config
from regionbus.schemas.naming import Topics
from regionbus.schemas.topics import client_topic_specs, ensure_topics
from regionbus.schemas.transport import topic_partitions


class ClientTopicAdmin:
    """The admin client of one client cache, for its own topics.

    Args:
        settings: The client's settings (address, namespace, timeouts, security).
        topics: The namespace's topic names.
        client_id: The client id (``{ns}.queue.<id>``, ``{ns}.reply.<id>``).

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

    def create(self) -> None:
        """Create this client's queue and reply topics (1 partition each) if missing, and
        wait until both have a leader.

        Raises:
            KafkaAuthorizationError: the Kafka principal may not create or describe them.
            TransportError: the broker refused, or the topics had no leader within
                ``metadata_timeout_s``.
        """
        specs = client_topic_specs(
            self._topics, self._client_id, self._settings.durable_client_timeout_s
        )
        try:
            ensure_topics(self._admin, specs, timeout_s=self._settings.metadata_timeout_s)
        except ConfigurationError as exc:
            raise TransportError(str(exc)) from exc

    def delete(self) -> None:
        """Delete this client's queue and reply topics and its committed offsets on them
        (best effort, at a non-durable close)."""
        topics = [self._topics.queue(self._client_id), self._topics.reply(self._client_id)]
        group = self._topics.client_group(self._client_id)
        with suppress(Exception):
            for future in self._admin.delete_topics(topics, operation_timeout=5).values():
                with suppress(Exception):
                    future.result(timeout=5)
        with suppress(Exception):
            deleted = self._admin.delete_consumer_groups(
                [group, self._topics.client_reply_group(self._client_id)]
            )
            for future in deleted.values():
                with suppress(Exception):
                    future.result(timeout=5)


__all__ = ["ClientTopicAdmin"]
