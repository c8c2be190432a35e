"""What the outbox gathers in a poll batch, per address: the runs of framed messages for
one client's queue, one group's record or one client's replies
(`regionbus.broker.outbox.Outbox`), and the recipients of a record for several clients."""

from __future__ import annotations

from regionbus.broker.client_proxy import QueueAccount, SharedQueue
from regionbus.schemas.addressing import recipients


class Recipients:
    """The clients of one record for several (`regionbus.schemas.addressing`): an audience's
    members who read one partition, as they were when an event was routed to them.

    Attributes:
        topic: Their shared queue topic.
        partition: Their partition of it.
        key: The record key (`regionbus.schemas.addressing.shared_key`).
        members: The client ids.
        listed: The :data:`regionbus.schemas.addressing.RECIPIENTS_HEADER` value.
        signer: A member whose principal's key signs the record (all members share it).
        queue: The account of what is queued for them.
    """

    __slots__ = ("key", "listed", "members", "partition", "queue", "signer", "topic")

    def __init__(
        self, topic: str, partition: int, key: bytes, members: frozenset[str], queue: SharedQueue
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.key = key
        self.members = members
        self.listed = recipients(members)
        self.signer = min(members)
        self.queue = queue


class Addressed:
    """What one poll batch gathered for one address, in a row: where it goes, its framed
    messages, whose principal signs them, the queue's account (None for replies) and how
    many events it had queued before them, and the recipients of a record for several
    clients; the clients whose queue it goes to (none for replies) and the originators of
    its events (whose replies wait while it is parked); the number reserved for it while
    it is parked (-1 when it is not); with tracing on, ``{position in framed: traceparent}``
    of its traced events (`regionbus.broker.tracing`), else None; and whether it is bulk
    (initial results, sent by the lingering producer: `regionbus.broker.deliveries`)."""

    __slots__ = (
        "account",
        "bulk",
        "client_id",
        "framed",
        "key",
        "listed",
        "members",
        "originators",
        "partition",
        "reserved",
        "start",
        "topic",
        "traced",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        key: bytes,
        client_id: str,
        account: QueueAccount | None,
        listed: bytes | None = None,
        members: frozenset[str] = frozenset(),
        *,
        bulk: bool = False,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.key = key
        self.client_id = client_id
        self.account = account
        self.start = account.queued if account is not None else 0
        self.listed = listed
        self.framed: list[bytes] = []
        self.members = members
        self.originators: set[str] = set()
        self.reserved = -1
        self.traced: dict[int, bytes] | None = None
        self.bulk = bulk


class OpenRuns:
    """The runs of one queue partition still open to more events in this poll batch: a
    client's events must reach it in the order they were queued, and they may go in its
    own records and in those of the groups it is in, so queuing for one address closes
    the open runs of the others that share a client with it (their next events start a
    new run, produced after this one)."""

    __slots__ = ("groups", "own")

    def __init__(self) -> None:
        self.own: dict[str, Addressed] = {}
        self.groups: dict[Recipients, Addressed] = {}


__all__ = ["Addressed", "OpenRuns", "Recipients"]
