"""One row per operation kind: what an operation of that kind is, in one place.

Validation (`regionbus.broker.validation`), permissions (`regionbus.broker.permissions`),
the server's batch of entry operations (`regionbus.broker.handlers`), the event a region
change causes (`regionbus.schemas.callbacks.region_event_kind`, the store) and the client's
operation builder (`regionbus.clients.server_proxy.ServerRegionProxy.operation`) all read
this table, so a new kind is its row, its Lua branch where it changes Redis, its handler
and its client method. ``tests/unit/test_operation_kinds.py`` checks that every kind has a
row and that the rows agree with themselves.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from regionbus.schemas.messages import EventKind, OperationKind


class Scope(enum.Enum):
    """What an operation is about, and so which bucket reads it."""

    ENTRY = "entry"
    """One key of a region, read in that key's bucket (``bucket_of(region, key)``)."""
    REGION_CHANGE = "region change"
    """A whole region's entries, read in the region's bucket (``region_bucket``)."""
    REGION = "region"
    """A region, in the buckets the client sends it to (each answers for its part)."""
    SERVERS = "servers"
    """Every server, reached through the buckets the client sends it to (each server's
    first copy is the one that counts); its region is empty."""
    CLIENT = "client"
    """The client itself; its region is empty."""


class Access(enum.Enum):
    """The permission an operation needs (Geode's ``ResourcePermission``s, per
    `regionbus.broker.permissions`)."""

    WRITE_KEY = "DATA:WRITE:region:key"
    WRITE_REGION = "DATA:WRITE:region"
    WRITE_DATA = "DATA:WRITE"
    """Every region's data (a function run on the servers, Geode's default for one)."""
    MANAGE_REGION = "DATA:MANAGE:region"
    READ_KEY = "DATA:READ:region:key"
    READ_KEYS_OF_INTEREST = "DATA:READ:region:key of each registered key, else region"
    READ_REGION = "DATA:READ:region"
    NONE = "none"
    """The client's own lifecycle: any authenticated principal, for its own client id."""
    SERVERS_ONLY = "servers only"
    """Produced by a bucket's primary; no client principal may send it."""


@dataclass(frozen=True)
class KindRow:
    """What operations of one kind are.

    Attributes:
        scope: What it is about (:class:`Scope`).
        change: It changes stored state and so carries an EventID (the entry and region
            changes, the expirations).
        batched: It joins the batch of entry operations applied together in one Redis
            round trip; an operation of any other kind first applies that batch.
        access: The permission it needs.
        needs_value: It carries a value (PUT, PUT_IF_ABSENT, REPLACE).
        needs_interest: It carries an interest spec.
        needs_cq: It carries a CQ spec.
        parses_query: Its CQ's query is parsed and checked by the servers (EXECUTE_CQ).
        needs_query: It carries a one-shot query (QUERY), parsed and bound by the servers.
        needs_function: It carries a function spec (function execution).
        local: A change of the store alone (a server-side function's local destroy or
            invalidate): no writer is asked and no client, CQ or gateway hears of it.
        region_event: The region event it causes, for a region change; else None.
        expiration: An entry expiration (its EventID is in the expirations' thread).
    """

    scope: Scope
    change: bool = False
    batched: bool = False
    access: Access = Access.NONE
    needs_value: bool = False
    needs_interest: bool = False
    needs_cq: bool = False
    parses_query: bool = False
    needs_query: bool = False
    needs_function: bool = False
    local: bool = False
    region_event: EventKind | None = None
    expiration: bool = False

    @property
    def servers_only(self) -> bool:
        """Produced by the servers, never by a client (the expirations and a loader's
        create by a bucket's primary for its own partition; a function's local changes)."""
        return self.access is Access.SERVERS_ONLY

    @property
    def entry_change(self) -> bool:
        """A change of one entry a client asks for (put, destroy, invalidate, ...)."""
        return self.scope is Scope.ENTRY and self.change and not self.servers_only


_ENTRY_CHANGE: Final = KindRow(Scope.ENTRY, change=True, batched=True, access=Access.WRITE_KEY)
_CONDITIONAL_PUT: Final = KindRow(
    Scope.ENTRY, change=True, batched=True, access=Access.WRITE_KEY, needs_value=True
)
"""A put that may change nothing (Geode's ``putIfAbsent`` and ``replace`` need
``DATA:WRITE`` as ``put`` does, though they answer the current value)."""
_CQ: Final = KindRow(Scope.REGION, access=Access.READ_REGION, needs_cq=True)
_EXPIRATION: Final = KindRow(Scope.ENTRY, change=True, access=Access.SERVERS_ONLY, expiration=True)
_LOCAL_CHANGE: Final = KindRow(
    Scope.ENTRY, change=True, batched=True, access=Access.SERVERS_ONLY, local=True
)

OPERATION_KINDS: Final[Mapping[OperationKind, KindRow]] = MappingProxyType(
    {
        OperationKind.PUT: KindRow(
            Scope.ENTRY, change=True, batched=True, access=Access.WRITE_KEY, needs_value=True
        ),
        OperationKind.DESTROY: _ENTRY_CHANGE,
        OperationKind.INVALIDATE: _ENTRY_CHANGE,
        OperationKind.GET: KindRow(Scope.ENTRY, batched=True, access=Access.READ_KEY),
        OperationKind.EXPIRE_DESTROY: _EXPIRATION,
        OperationKind.EXPIRE_INVALIDATE: _EXPIRATION,
        OperationKind.CLEAR: KindRow(
            Scope.REGION_CHANGE,
            change=True,
            access=Access.WRITE_REGION,
            region_event=EventKind.REGION_CLEAR,
        ),
        OperationKind.INVALIDATE_REGION: KindRow(
            Scope.REGION_CHANGE,
            change=True,
            access=Access.WRITE_REGION,
            region_event=EventKind.REGION_INVALIDATE,
        ),
        OperationKind.DESTROY_REGION: KindRow(
            Scope.REGION_CHANGE,
            change=True,
            access=Access.MANAGE_REGION,
            region_event=EventKind.REGION_DESTROY,
        ),
        OperationKind.REGISTER_INTEREST: KindRow(
            Scope.REGION, access=Access.READ_KEYS_OF_INTEREST, needs_interest=True
        ),
        OperationKind.UNREGISTER_INTEREST: KindRow(
            Scope.REGION, access=Access.READ_REGION, needs_interest=True
        ),
        OperationKind.KEYS: KindRow(Scope.REGION, access=Access.READ_REGION),
        OperationKind.EXECUTE_CQ: KindRow(
            Scope.REGION, access=Access.READ_REGION, needs_cq=True, parses_query=True
        ),
        OperationKind.STOP_CQ: _CQ,
        OperationKind.CLOSE_CQ: _CQ,
        OperationKind.READY_FOR_EVENTS: KindRow(Scope.CLIENT),
        OperationKind.DISCONNECT: KindRow(Scope.CLIENT),
        OperationKind.GET_DURABLE_CQS: KindRow(Scope.CLIENT),
        OperationKind.PUT_IF_ABSENT: _CONDITIONAL_PUT,
        OperationKind.REPLACE: _CONDITIONAL_PUT,
        OperationKind.REMOVE: _ENTRY_CHANGE,
        OperationKind.CONTAINS_KEY: KindRow(Scope.ENTRY, batched=True, access=Access.READ_KEY),
        OperationKind.SIZE: KindRow(Scope.REGION, access=Access.READ_REGION),
        OperationKind.LOAD_CREATE: KindRow(
            Scope.ENTRY, change=True, batched=True, access=Access.SERVERS_ONLY, needs_value=True
        ),
        # Geode authorizes a query with DATA:READ on each region it reads (one here).
        OperationKind.QUERY: KindRow(Scope.REGION, access=Access.READ_REGION, needs_query=True),
        # Geode's Function.getRequiredPermissions: DATA:WRITE by default (of the region when
        # run on one); a function's own permissions are not read here.
        OperationKind.EXECUTE_REGION_FUNCTION: KindRow(
            Scope.REGION, access=Access.WRITE_REGION, needs_function=True
        ),
        OperationKind.EXECUTE_FUNCTION: KindRow(
            Scope.SERVERS, access=Access.WRITE_DATA, needs_function=True
        ),
        OperationKind.GET_FUNCTION_ATTRIBUTES: KindRow(Scope.CLIENT, needs_function=True),
        OperationKind.LOCAL_DESTROY: _LOCAL_CHANGE,
        OperationKind.LOCAL_INVALIDATE: _LOCAL_CHANGE,
    }
)
"""The row of every operation kind."""


def kind_row(kind: OperationKind) -> KindRow:
    """The row of an operation kind (every kind has one: a unit test checks it)."""
    return OPERATION_KINDS[kind]


__all__ = ["OPERATION_KINDS", "Access", "KindRow", "Scope", "kind_row"]
