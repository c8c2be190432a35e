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

import time
from collections import OrderedDict
from typing import Final

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

KNOWN_TOPICS_MAX: Final = 10_000
"""Most topic answers remembered (oldest first out), so forged principals cannot grow the
cache without bound."""
ABSENT_RECHECK_S: Final = 5.0
"""How long "absent" is believed before Kafka is asked again (a client may be starting)."""
_METADATA_TIMEOUT_S: Final = 5.0


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


__all__ = ["ClientTopicPartitions"]
