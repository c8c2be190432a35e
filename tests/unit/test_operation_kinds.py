"""The table of operation kinds: every kind has a row, and the rows agree with what the
server and the client do with each kind."""

from __future__ import annotations

import pytest

from regionbus.broker.permissions import required_permissions
from regionbus.schemas.callbacks import region_event_kind
from regionbus.schemas.messages import EventKind, Operation, OperationKind
from regionbus.schemas.operation_kinds import OPERATION_KINDS, Access, Scope, kind_row


def test_every_operation_kind_has_a_row() -> None:
    assert set(OPERATION_KINDS) == set(OperationKind)


@pytest.mark.parametrize("kind", list(OperationKind))
def test_each_row_agrees_with_itself(kind: OperationKind) -> None:
    row = kind_row(kind)
    if row.expiration:
        assert row.scope is Scope.ENTRY and row.change and not row.batched
        assert row.servers_only
    if row.servers_only:
        assert row.scope is Scope.ENTRY and row.change and not row.entry_change
    if row.batched:
        assert row.scope is Scope.ENTRY, "only entry operations join the batch"
    assert (row.region_event is not None) is (row.scope is Scope.REGION_CHANGE)
    if row.scope is Scope.REGION_CHANGE:
        assert row.change
    if row.scope is Scope.CLIENT:
        assert row.access is Access.NONE and not row.change
    assert not row.parses_query or row.needs_cq
    if row.scope is Scope.SERVERS:
        assert row.needs_function and not row.change
    if row.local:
        assert row.servers_only and row.batched


def test_the_changes_are_the_entry_changes_region_changes_expirations_loads_and_locals() -> None:
    changes = {k for k in OperationKind if kind_row(k).change}
    assert changes == {
        OperationKind.PUT,
        OperationKind.DESTROY,
        OperationKind.INVALIDATE,
        OperationKind.CLEAR,
        OperationKind.INVALIDATE_REGION,
        OperationKind.DESTROY_REGION,
        OperationKind.EXPIRE_DESTROY,
        OperationKind.EXPIRE_INVALIDATE,
        OperationKind.PUT_IF_ABSENT,
        OperationKind.REPLACE,
        OperationKind.REMOVE,
        OperationKind.LOAD_CREATE,
        OperationKind.LOCAL_DESTROY,
        OperationKind.LOCAL_INVALIDATE,
    }
    assert {k for k in OperationKind if kind_row(k).servers_only} == {
        OperationKind.EXPIRE_DESTROY,
        OperationKind.EXPIRE_INVALIDATE,
        OperationKind.LOAD_CREATE,
        OperationKind.LOCAL_DESTROY,
        OperationKind.LOCAL_INVALIDATE,
    }
    assert {k for k in OperationKind if kind_row(k).local} == {
        OperationKind.LOCAL_DESTROY,
        OperationKind.LOCAL_INVALIDATE,
    }
    assert {k for k in OperationKind if kind_row(k).entry_change} == {
        OperationKind.PUT,
        OperationKind.DESTROY,
        OperationKind.INVALIDATE,
        OperationKind.PUT_IF_ABSENT,
        OperationKind.REPLACE,
        OperationKind.REMOVE,
    }


def test_the_region_event_of_each_region_change() -> None:
    assert region_event_kind(OperationKind.CLEAR) is EventKind.REGION_CLEAR
    assert region_event_kind(OperationKind.DESTROY_REGION) is EventKind.REGION_DESTROY
    assert region_event_kind(OperationKind.INVALIDATE_REGION) is EventKind.REGION_INVALIDATE
    with pytest.raises(ValueError, match="not a region change"):
        region_event_kind(OperationKind.PUT)


@pytest.mark.parametrize("kind", list(OperationKind))
def test_every_kind_has_its_permissions(kind: OperationKind) -> None:
    op = Operation(1, "c", kind, "r", 0, key="k")
    needed = required_permissions(op)
    access = kind_row(kind).access
    if access is Access.NONE:
        assert needed == ()
    elif access is Access.SERVERS_ONLY:
        assert [str(p) for p in needed] == ["*:*:r"]
    elif access is Access.WRITE_DATA:
        assert [str(p) for p in needed] == ["DATA:WRITE"]
    else:
        assert needed and all(p.region == "r" for p in needed)
