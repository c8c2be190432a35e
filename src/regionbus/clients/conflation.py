"""Subscription conflation's rule (docs/behaviour.md §4, Geode client ``conflate-events``): which of
the events a client read together are updates a newer update of the same key supersedes.

The subscription queue (`regionbus.clients.subscription`) applies it to each poll's
events; the rule itself is pure, and tested alone."""

from __future__ import annotations

from regionbus.schemas.messages import CqEvent, Event, EventKind, Marker


def superseded_updates(messages: list[Event | Marker | CqEvent]) -> set[int]:
    """Indexes of updates followed, in ``messages``, by a newer update of the same key with
    no other change of that key (or of its region) in between: those conflation drops.

    A CQ event is conflated the same way, apart from the interest events: when every CQ
    it names has query operation UPDATE and a newer CQ event of the key names the same CQs,
    all UPDATE (Geode conflates a CQ message only when each of its CQ operations is an
    update).
    """
    superseded: set[int] = set()
    newer_update: set[tuple[str, str]] = set()
    newer_cq_update: dict[tuple[str, str], tuple[str, ...]] = {}
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, CqEvent):
            _conflate_cq(message, index, newer_cq_update, superseded)
            continue
        if not isinstance(message, Event):
            continue
        if message.kind.is_region_event:
            newer_update = {k for k in newer_update if k[0] != message.region}
            continue
        if message.key is None:
            continue
        entry = (message.region, message.key)
        if message.kind is EventKind.UPDATE:
            if entry in newer_update:
                superseded.add(index)
            newer_update.add(entry)
        else:
            newer_update.discard(entry)
    return superseded


def _conflate_cq(
    message: CqEvent,
    index: int,
    newer_update: dict[tuple[str, str], tuple[str, ...]],
    superseded: set[int],
) -> None:
    event = message.event
    if event.key is None:
        for entry in [k for k in newer_update if k[0] == event.region]:
            del newer_update[entry]
        return
    entry = (event.region, event.key)
    if not all(m.query_operation is EventKind.UPDATE for m in message.cqs):
        newer_update.pop(entry, None)
        return
    names = tuple(m.name for m in message.cqs)
    if newer_update.get(entry) == names:
        superseded.add(index)
    newer_update[entry] = names
