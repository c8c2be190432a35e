"""``EventID``: the identity of one operation, and the tracking key derived from it."""

from __future__ import annotations

from typing import Final, NamedTuple

EXPIRY_MEMBER: Final = "(expiry)"
"""The member of every entry expiration's EventID, whichever server produced it
(:mod:`regionbus.broker.expiration`); not a legal client or member id
(`regionbus.schemas.naming.check_name`),
and refused in any other operation (:mod:`regionbus.broker.validation`), so nothing else shares its
message tracking."""
EXPIRY_THREAD: Final = 1
"""The thread of every entry expiration's EventID: with the bucket, one sequence per
bucket."""


LOAD_MEMBER: Final = "(load)"
"""The member of every loader create's EventID (:mod:`regionbus.broker.loading`); its
thread is drawn at random by each server process, so a restarted server's loads are never
taken for duplicates of its last run's. Not a legal client or member id, and refused in
any other operation."""


class EventID(NamedTuple):
    """Identity of one operation (Geode ``EventID``).

    Attributes:
        member: Id of the originating member (client or server), e.g. ``"c-host-4711-9f2a"``.
        thread: Id of the originating thread within that member (small int, from 1).
        sequence: The thread's sequence id: 0 for its first operation, +1 for each next.
        bucket: The bucket the operation was applied in, -1 before routing. Geode's
            ``ThreadIdentifier`` widens the thread id with the bucket (bits 32-47) so that
            ordering and duplicate detection are per (member, thread, bucket); here the
            bucket is its own field and :attr:`tracking_key` combines them.
    """

    member: str
    thread: int
    sequence: int
    bucket: int = -1

    @property
    def tracking_key(self) -> tuple[str, int, int]:
        """The key message tracking is kept under: (member, thread, bucket)."""
        return (self.member, self.thread, self.bucket)

    def __str__(self) -> str:
        return f"{self.member}:{self.thread}:{self.sequence}@{self.bucket}"
