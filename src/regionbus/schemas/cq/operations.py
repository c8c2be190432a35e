"""The query operation of a change: how an entry's membership in a CQ's result set moved.

docs/behaviour.md §9 (Geode ``CqServiceImpl.processEntryEvent``): the CQ is evaluated on the entry's
old value and on its new one; a create or update has a new value, a destroy or invalidate none
(the entry leaves every result set; Geode: "Base invalidate operation is treated as
destroy").

=========== ========== ===============
was in      is in      query operation
=========== ========== ===============
no          yes        CREATE
yes         yes        UPDATE
yes         no         DESTROY
no          no         none
=========== ========== ===============

A region clear or destroy is REGION_CLEAR / REGION_DESTROY for every CQ of the region.
"""

from __future__ import annotations

from regionbus.schemas.messages import EventKind


def query_operation(was_in: bool, is_in: bool) -> EventKind | None:
    """The query operation for an entry that was (not) and is (not) in the result set.

    Returns:
        CREATE, UPDATE or DESTROY; None when the entry was not and is not in it.
    """
    if is_in:
        return EventKind.UPDATE if was_in else EventKind.CREATE
    return EventKind.DESTROY if was_in else None


def has_new_value(base: EventKind) -> bool:
    """Whether a change of this kind leaves the entry with a value to evaluate (a create
    or update); after a destroy or invalidate the entry is in no result set."""
    return base is EventKind.CREATE or base is EventKind.UPDATE


def region_query_operation(base: EventKind) -> EventKind | None:
    """The query operation of a region change: REGION_CLEAR or REGION_DESTROY; None for a
    region invalidate, which servers do not forward to clients (docs/behaviour.md §3)."""
    if base is EventKind.REGION_CLEAR or base is EventKind.REGION_DESTROY:
        return base
    return None


__all__ = ["has_new_value", "query_operation", "region_query_operation"]
