"""Which clients' reply topics exist, so a server never produces into a topic nobody made.

With topic auto-creation off, a message for a topic that does not exist fails only after
librdkafka gives up on it, and while it waits the server's flush (and so its commit) waits
too. A client creates its reply topic before it sends anything; an operation from anyone
else (a server-side application producing to ``{ns}.ops``, a client that has closed, a
forged client id) gets no reply.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Final

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

KNOWN_TOPICS_MAX: Final = 100_000
"""Most topic answers remembered (oldest first out), so forged client ids cannot grow the
cache without bound."""
ABSENT_RECHECK_S: Final = 5.0
"""How long "absent" is believed before Kafka is asked again (a client may be starting)."""
_METADATA_TIMEOUT_S: Final = 5.0


class ClientTopicPresence:
    """Answers "does this topic exist?" from Kafka's metadata, remembering each answer.

    A present topic is believed until `forget` (a delivery to it failed because it is
    gone); an absent one for ``absent_recheck_s`` seconds.

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
        self._answers: OrderedDict[str, float | None] = OrderedDict()
        """topic -> None when present, else the monotonic time "absent" expires."""

    def exists(self, topic: str) -> bool:
        """True when the topic exists (asked of Kafka at most once per recheck period).

        A metadata request that fails counts as "exists" and is not remembered: a broker
        hiccup must not drop a real client's reply; producing then fails or succeeds on its
        own terms.
        """
        now = time.monotonic()
        if topic in self._answers:
            absent_until = self._answers[topic]
            if absent_until is None:
                return True
            if now < absent_until:
                return False
        present = self._ask(topic)
        if present is None:
            return True
        self._answers[topic] = None if present else now + self._absent_recheck_s
        self._answers.move_to_end(topic)
        while len(self._answers) > self._max_entries:
            self._answers.popitem(last=False)
        return present

    def forget(self, topic: str) -> None:
        """Drop what is known of ``topic``; the next `exists` asks Kafka again."""
        self._answers.pop(topic, None)

    def __len__(self) -> int:
        """Answers currently remembered."""
        return len(self._answers)

    def _ask(self, topic: str) -> bool | None:
        """True or False from Kafka's metadata; None when Kafka could not be asked."""
        try:
            metadata = self._admin.list_topics(topic=topic, timeout=_METADATA_TIMEOUT_S)
        except KafkaException:
            return None
        found = metadata.topics.get(topic)
        return found is not None and found.error is None and bool(found.partitions)
