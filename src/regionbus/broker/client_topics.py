"""The partition counts of the shared client topics, so a server addresses a client's
partition and never produces into a topic nobody made.

Clients of one Kafka principal share a queue topic and a reply topic
(`regionbus.schemas.naming.Topics.client_queues`); a client reads the partition its id
hashes to among the topic's partitions, so a server must know how many there are. The
namespace's unscoped pair is created by the servers; a principal's own pair by its first
client. With topic auto-creation off, a message for a topic that does not exist fails only
after librdkafka gives up on it, and while it waits the server's flush (and so its commit)
waits too: a reply to a client whose topic does not exist (a forged principal, a client
that never started) is dropped instead.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Final

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from regionbus.schemas.errors import ConfigurationError, RegionBusError, TransportError
from regionbus.schemas.naming import Topics
from regionbus.schemas.topics import client_topic_specs, ensure_topic_configs
from regionbus.schemas.transport import kafka_error

log = logging.getLogger("regionbus.server.topics")

KNOWN_TOPICS_MAX: Final = 10_000
"""Most topic answers remembered (oldest first out), so forged principals cannot grow the
cache without bound."""
ABSENT_RECHECK_S: Final = 5.0
"""How long "absent" is believed before Kafka is asked again (a client may be starting)."""
_METADATA_TIMEOUT_S: Final = 5.0

CHECK_REUSE_S: Final = 1.0
"""How long the check of a principal's shared topics serves later connects: a second, so a
storm of connects admitted over many turns of the loop is not a storm of admin requests,
and a pair whose configs changed is noticed within a second."""


class ClientTopicPartitions:
    """Answers "how many partitions has this topic?" from Kafka's metadata, remembering
    each answer.

    A present topic's count is believed until `forget` (a delivery to it failed because
    it is gone); "absent" for ``absent_recheck_s`` seconds.

    Args:
        admin: An AdminClient whose configuration has ``allow.auto.create.topics=false``
            (asking about a topic must not create it).
        absent_recheck_s: Seconds an "absent" answer is kept.
        max_entries: Most answers kept.
    """

    def __init__(
        self,
        admin: AdminClient,
        *,
        absent_recheck_s: float = ABSENT_RECHECK_S,
        max_entries: int = KNOWN_TOPICS_MAX,
    ) -> None:
        self._admin = admin
        self._absent_recheck_s = absent_recheck_s
        self._max_entries = max_entries
        self._answers: OrderedDict[str, tuple[int, float]] = OrderedDict()
        """topic -> (partitions, monotonic time an "absent" answer expires)."""

    def partitions(self, topic: str) -> int:
        """The topic's partition count, 0 when it does not exist (asked of Kafka at most
        once per recheck period).

        A metadata request that fails is not remembered and answers 0: nothing can be
        addressed in a topic whose size is unknown (the servers' own pair is known from
        their start, :meth:`note`).
        """
        now = time.monotonic()
        known = self._answers.get(topic)
        if known is not None and (known[0] or now < known[1]):
            return known[0]
        count = self._ask(topic)
        if count is None:
            return 0
        self._answers[topic] = (count, now + self._absent_recheck_s)
        self._answers.move_to_end(topic)
        while len(self._answers) > self._max_entries:
            self._answers.popitem(last=False)
        return count

    def note(self, topic: str, partitions: int) -> None:
        """Remember a topic's partition count known otherwise (the server created it)."""
        self._answers[topic] = (partitions, 0.0)

    def exists(self, topic: str) -> bool:
        """True when the topic exists (see :meth:`partitions`)."""
        return self.partitions(topic) > 0

    def forget(self, topic: str) -> None:
        """Drop what is known of ``topic``; the next question asks Kafka again."""
        self._answers.pop(topic, None)

    def known(self, topic: str) -> int:
        """The partition count remembered for ``topic`` without asking Kafka; 0 if none."""
        answer = self._answers.get(topic)
        return answer[0] if answer is not None else 0

    def __len__(self) -> int:
        """Answers currently remembered."""
        return len(self._answers)

    def _ask(self, topic: str) -> int | None:
        """The partition count from Kafka's metadata (0: absent); None when Kafka could
        not be asked."""
        try:
            metadata = self._admin.list_topics(topic=topic, timeout=_METADATA_TIMEOUT_S)
        except KafkaException:
            return None
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            return 0
        return len(found.partitions)


_ABSENT = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})


class SharedTopicGuard:
    """Checks the shared queue and reply topics of a client's Kafka principal when the
    client connects, on what the brokers hold (not on what a server remembers), and sets
    back what would lose or refuse the principal's records (`config_repairs`).

    A principal's first client creates its pair, with whatever configs it chose; another
    client of the principal may be durable and trust that the queue keeps what it misses.
    So every connect is checked, and a pair that cannot be repaired refuses the connect.
    The connects of one poll batch share one check (:meth:`new_batch`), and so do those
    of the batches within :data:`CHECK_REUSE_S` of it: a storm of connects costs one round
    trip per principal per second, not one per client, nor one per turn of the loop that
    admits a few of them (:class:`regionbus.broker.pacing.ConnectAdmission`).

    Args:
        admin: An AdminClient allowed to describe and alter the topics' configs.
        topics: The namespace's topic names.
        partitions: The partition counts the server addresses clients by; each check
            notes the count the brokers report.
        queue_retention_ms: The least ``retention.ms`` of a queue topic, in ms (the longest
            durable-client timeout the servers accept, plus an hour).
        timeout_s: Longest wait for each admin request, in seconds.
    """

    def __init__(
        self,
        admin: AdminClient,
        topics: Topics,
        partitions: ClientTopicPartitions,
        queue_retention_ms: int,
        timeout_s: float = _METADATA_TIMEOUT_S,
    ) -> None:
        self._admin = admin
        self._topics = topics
        self._partitions = partitions
        self._queue_retention_ms = queue_retention_ms
        self._timeout_s = timeout_s
        self._checked: dict[str | None, RegionBusError | None] = {}
        self._checked_at_s = 0.0
        self.repaired_total = 0
        """Topics whose configs a check set back since the server started."""

    def new_batch(self) -> None:
        """A new poll batch: its connects are checked afresh, unless the last checks are
        younger than :data:`CHECK_REUSE_S`."""
        if time.monotonic() - self._checked_at_s >= CHECK_REUSE_S:
            self._checked.clear()

    def check(self, kafka_principal: str | None) -> None:
        """Check (and repair) the principal's shared topics, once per poll batch.

        Args:
            kafka_principal: The principal whose pair is checked; None for the namespace's
                unscoped pair.

        Raises:
            ConfigurationError: a topic of the pair does not exist, or needed a repair the
                cluster refused.
            KafkaAuthorizationError: the server's principal may not describe the topics.
            TransportError: the cluster did not answer within ``timeout_s``.
        """
        if kafka_principal in self._checked:
            error = self._checked[kafka_principal]
            if error is not None:
                raise error
            return
        if not self._checked:
            self._checked_at_s = time.monotonic()
        try:
            self._check(kafka_principal)
        except RegionBusError as exc:
            self._checked[kafka_principal] = exc
            raise
        self._checked[kafka_principal] = None

    def _check(self, kafka_principal: str | None) -> None:
        specs = client_topic_specs(
            self._topics, kafka_principal, queue_retention=self._queue_retention_ms
        )
        names = [spec.name for spec in specs]
        try:
            described = self._admin.describe_topics(
                TopicCollection(names), request_timeout=self._timeout_s
            )
            counts = {
                name: len(future.result(timeout=self._timeout_s).partitions)
                for name, future in described.items()
            }
        except KafkaException as exc:
            if exc.args[0].code() in _ABSENT:
                raise ConfigurationError(
                    f"the shared client topics {' and '.join(names)} do not all exist"
                ) from exc
            raise kafka_error(exc, "shared client topics") from exc
        except TimeoutError as exc:
            raise TransportError(f"shared client topics: no answer in {self._timeout_s} s") from exc
        repaired = ensure_topic_configs(self._admin, specs, timeout_s=self._timeout_s)
        for name, configs in repaired.items():
            self.repaired_total += 1
            log.warning("topic %s would lose or refuse clients' records: set %s", name, configs)
        for name, count in counts.items():
            before = self._partitions.known(name)
            if before and before != count:
                log.error(
                    "topic %s has %d partitions, not %d as when first seen: clients that "
                    "connected before read their records by the old count",
                    name,
                    count,
                    before,
                )
            self._partitions.note(name, count)


__all__ = ["ClientTopicPartitions", "SharedTopicGuard"]
