"""The admin side of one client: its first contact with Kafka (the servers' ``{ns}.ops``
topic must exist), the shared queue and reply topics of its Kafka principal (made if it is
the principal's first client), its partition of each, and the deletion of its acks.

A client cache needs its admin client only while it connects and when it closes, so it
holds one only then: a connected cache is three librdkafka clients (producer, queue and
reply consumers), not four, and a fleet of thousands keeps that many fewer broker
connections and threads."""

from __future__ import annotations

import time
from contextlib import suppress
from typing import NamedTuple

from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import OffsetSpec
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from regionbus.clients.settings import ClientSettings
from regionbus.schemas.errors import ConfigurationError, TransportError, UnconnectedError
from regionbus.schemas.kafka_clients import KafkaAdmin, kafka_admin
from regionbus.schemas.kafka_outage import quiet_config
from regionbus.schemas.naming import Topics, client_partition
from regionbus.schemas.topics import client_topic_specs, ensure_topics
from regionbus.schemas.transport import kafka_error, leader_moving

_ABSENT = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})


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

    The admin client made at construction is kept until :meth:`release` (the cache is
    connected); a later call makes one for itself and drops it when done.

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
        self._handle: KafkaAdmin | None = self._new_admin()
        self._held = True
        self._closed = False

    def _new_admin(self) -> KafkaAdmin:
        return kafka_admin(self._settings.librdkafka(**quiet_config()))

    @property
    def _admin(self) -> KafkaAdmin:
        """The admin client: the held one, or a new one for a call after :meth:`release`
        (dropped again by :meth:`_done`).

        Raises:
            UnconnectedError: the client cache was closed.
        """
        if self._closed:
            raise UnconnectedError("the client cache was closed")
        handle = self._handle
        if handle is None:
            handle = self._handle = self._new_admin()
        return handle

    def _done(self) -> None:
        """A call is over: drop its admin client unless it is held (while connecting)."""
        if not self._held:
            self._handle = None

    def release(self) -> None:
        """The cache is connected: drop the admin client (each later call makes its own).
        An admin client has no close of its own; dropping the last reference destroys it."""
        self._held = False
        self._handle = None

    def close(self) -> None:
        """Destroy the admin client now and refuse later calls. A Region <-> ClientCache
        cycle would otherwise keep it, reconnecting to a broker that may be gone, until
        garbage collection."""
        self._closed = True
        self._handle = None

    def first_contact(self) -> tuple[int, ClientAddress]:
        """The partition count of ``{ns}.ops`` once it exists, and where this client's
        queue and replies are: the shared topics of its Kafka principal, made if missing
        (the principal's first client makes its pair; the servers make the namespace's
        unscoped pair) and waited for until they have leaders. The three topics are asked
        in one request.

        Raises:
            KafkaAuthorizationError: the Kafka principal may not describe a topic, or
                create its shared topics.
            TransportError: Kafka did not answer, or ``{ns}.ops`` did not appear, within
                ``first_contact_timeout_s`` (the message names the address and the
                namespace and says how to fix them); or the shared topics had no leader
                within ``metadata_timeout_s``.
        """
        specs = client_topic_specs(self._topics, self._settings.topic_principal)
        names = [self._topics.ops, *(spec.name for spec in specs)]
        timeout_s = self._settings.first_contact_timeout_s
        deadline = time.monotonic() + timeout_s
        servers = self._settings.kafka_bootstrap_servers
        while True:
            remaining_s = deadline - time.monotonic()
            try:
                counts = self._describe(names, min(5.0, max(remaining_s, 0.1)))
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
            if counts[self._topics.ops]:
                break
            if time.monotonic() >= deadline:
                raise TransportError(self._no_servers_message(timeout_s))
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))
        if not all(counts[spec.name] for spec in specs):
            try:
                ensure_topics(self._admin, specs, timeout_s=self._settings.metadata_timeout_s)
            except ConfigurationError as exc:
                raise TransportError(str(exc)) from exc
            counts = self._describe(names, self._settings.metadata_timeout_s)
        queue, reply = specs[0].name, specs[1].name
        address = ClientAddress(
            queue,
            client_partition(self._client_id, counts[queue]),
            reply,
            client_partition(self._client_id, counts[reply]),
            self._client_id.encode(),
        )
        return counts[self._topics.ops], address

    def _describe(self, names: list[str], timeout_s: float) -> dict[str, int]:
        """``{topic: partitions}`` in one request, 0 for a topic that does not exist.

        Raises:
            KafkaAuthorizationError: the principal may not describe a topic.
            TransportError: Kafka did not answer within ``timeout_s``, or failed.
        """
        try:
            futures = self._admin.describe_topics(TopicCollection(names), request_timeout=timeout_s)
        except KafkaException as exc:
            raise kafka_error(exc, "topic metadata") from exc
        counts: dict[str, int] = {}
        for name, future in futures.items():
            try:
                counts[name] = len(future.result(timeout=timeout_s).partitions)
            except KafkaException as exc:
                if exc.args[0].code() not in _ABSENT:
                    raise kafka_error(exc, f"metadata of {name}", f"topic {name}") from exc
                counts[name] = 0
            except TimeoutError as exc:
                raise TransportError(f"metadata of {name}: no answer in {timeout_s} s") from exc
        return counts

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

    def ends(self, partitions: list[tuple[str, int]]) -> list[int]:
        """The high watermarks of partitions, in one request (the admin client's
        connection, which no long-polling fetch holds).

        Raises:
            KafkaAuthorizationError: the principal may not describe a topic.
            TransportError: Kafka did not answer within ``metadata_timeout_s``.
        """
        return self._offsets(partitions, OffsetSpec.latest())

    def starts(self, partitions: list[tuple[str, int]]) -> list[int]:
        """The log start offsets (the first offset kept) of partitions, in one request.

        Raises:
            KafkaAuthorizationError: the principal may not describe a topic.
            TransportError: Kafka did not answer within ``metadata_timeout_s``.
        """
        return self._offsets(partitions, OffsetSpec.earliest())

    def _offsets(self, partitions: list[tuple[str, int]], spec: OffsetSpec) -> list[int]:
        timeout_s = self._settings.metadata_timeout_s
        wanted = [TopicPartition(t, p) for t, p in partitions]
        admin = self._admin
        try:
            for attempt in Retrying(
                stop=stop_after_delay(timeout_s),
                wait=wait_exponential(multiplier=0.02, max=0.5),
                retry=retry_if_exception(leader_moving),
                reraise=True,
            ):
                with attempt:
                    answers = admin.list_offsets(
                        {tp: spec for tp in wanted}, request_timeout=timeout_s
                    )
                    offsets = [answers[tp].result(timeout=timeout_s).offset for tp in wanted]
        except KafkaException as exc:
            topic = wanted[0].topic
            raise kafka_error(exc, f"offsets of {topic}", f"topic {topic}") from exc
        except TimeoutError as exc:
            raise TransportError(f"offsets of {partitions}: no answer in {timeout_s} s") from exc
        finally:
            self._done()
        return [max(int(offset), 0) for offset in offsets]

    def delete_acks(self) -> None:
        """Delete this client's consumer group (its acks), best effort, at a non-durable
        close; the reaper deletes it otherwise once the servers have forgotten it."""
        with suppress(Exception):
            # Held here until the futures are done, whatever another call drops meanwhile.
            admin = self._admin
            deleted = admin.delete_consumer_groups([self._topics.client_group(self._client_id)])
            for future in deleted.values():
                with suppress(Exception):
                    future.result(timeout=5)
        self._done()


__all__ = ["ClientAddress", "ClientTopicAdmin"]
