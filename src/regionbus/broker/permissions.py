"""Permissions in Apache Geode's model, and the permission each request needs.

A permission is ``RESOURCE:OPERATION[:REGION[:KEY]]`` (Geode ``ResourcePermission``):
resource ``DATA`` or ``CLUSTER``, operation ``READ``, ``WRITE`` or ``MANAGE``, ``*`` for
any of them, a missing region or key meaning every one. A granted permission *implies* a
required one when each part of the granted one is ``*`` or equal to the required one's
(Geode's ``WildcardPermission`` semantics: ``DATA:MANAGE`` does not imply ``DATA:WRITE``).

What each request needs, as in Geode's client/server security:

============================================ ===============================
request                                      permission
============================================ ===============================
put, destroy, invalidate (key K of R)        ``DATA:WRITE:R:K``
clear, invalidate region (region R)          ``DATA:WRITE:R``
destroy region R                             ``DATA:MANAGE:R``
get (key K of R)                             ``DATA:READ:R:K``
register interest in keys of R               ``DATA:READ:R:K`` for each key
register interest in all keys / a regex      ``DATA:READ:R``
unregister interest, keys on server          ``DATA:READ:R``
execute, stop, close a continuous query      ``DATA:READ:R`` (Geode ``ExecuteCQ``)
on R
execute a function on region R               ``DATA:WRITE:R`` (Geode's default
                                             ``Function.getRequiredPermissions``)
execute a function on the servers            ``DATA:WRITE``
receive an event of R in the queue           ``DATA:READ:R`` (and of its key)
status, user management, gateway config      ``CLUSTER:MANAGE``
connect, ping, close, ready-for-events,      none beyond authentication (and the client
disconnect, list durable CQs, a function's   id bound to the same principal)
attributes
============================================ ===============================
"""

from __future__ import annotations

import enum
from typing import Final, NamedTuple

from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.messages import InterestKind, Operation
from regionbus.schemas.operation_kinds import Access, kind_row

WILDCARD: Final = "*"


class Resource(enum.Enum):
    """What a permission is about (Geode ``ResourcePermission.Resource``)."""

    ALL = "*"
    DATA = "DATA"
    CLUSTER = "CLUSTER"


class Action(enum.Enum):
    """What a permission allows (Geode ``ResourcePermission.Operation``)."""

    ALL = "*"
    READ = "READ"
    WRITE = "WRITE"
    MANAGE = "MANAGE"


class ResourcePermission(NamedTuple):
    """One permission: ``RESOURCE:OPERATION[:REGION[:KEY]]``; ``*`` matches anything.

    Attributes:
        resource: ``DATA``, ``CLUSTER`` or ``*``.
        action: ``READ``, ``WRITE``, ``MANAGE`` or ``*``.
        region: A region name, or ``*`` for every region.
        key: An entry key, or ``*`` for every key.
    """

    resource: Resource
    action: Action
    region: str = WILDCARD
    key: str = WILDCARD

    @classmethod
    def parse(cls, text: str) -> ResourcePermission:
        """Parse ``"DATA:WRITE:flights"`` (case-insensitive resource and operation).

        Args:
            text: ``RESOURCE:OPERATION``, optionally ``:REGION`` and ``:KEY`` (the key may
                itself contain colons).

        Returns:
            The permission.

        Raises:
            ConfigurationError: fewer than two parts, or an unknown resource or operation.
        """
        parts = text.strip().split(":", 3)
        if len(parts) < 2:
            raise ConfigurationError(f"permission {text!r} is not RESOURCE:OPERATION[:REGION]")
        try:
            resource = Resource(parts[0].upper())
            action = Action(parts[1].upper())
        except ValueError as exc:
            raise ConfigurationError(
                f"permission {text!r}: resource is DATA, CLUSTER or *, operation is READ, "
                "WRITE, MANAGE or *"
            ) from exc
        region = parts[2] if len(parts) > 2 and parts[2] else WILDCARD
        key = parts[3] if len(parts) > 3 and parts[3] else WILDCARD
        return cls(resource, action, region, key)

    def __str__(self) -> str:
        text = f"{self.resource.value}:{self.action.value}"
        if self.region != WILDCARD or self.key != WILDCARD:
            text += f":{self.region}"
        if self.key != WILDCARD:
            text += f":{self.key}"
        return text

    def implies(self, required: ResourcePermission) -> bool:
        """Whether holding this permission grants ``required``.

        Args:
            required: The permission a request needs.

        Returns:
            True when each part of this one is ``*`` or equal to ``required``'s.
        """
        return (
            self.resource in (Resource.ALL, required.resource)
            and self.action in (Action.ALL, required.action)
            and self.region in (WILDCARD, required.region)
            and self.key in (WILDCARD, required.key)
        )


def is_granted(granted: tuple[ResourcePermission, ...], required: ResourcePermission) -> bool:
    """Whether any granted permission implies ``required``."""
    return any(p.implies(required) for p in granted)


CLUSTER_MANAGE: Final = ResourcePermission(Resource.CLUSTER, Action.MANAGE)
"""Needed for status, user management and gateway configuration."""


def data_read(region: str, key: str = WILDCARD) -> ResourcePermission:
    """``DATA:READ:region[:key]``."""
    return ResourcePermission(Resource.DATA, Action.READ, region, key)


def required_permissions(op: Operation) -> tuple[ResourcePermission, ...]:
    """The permissions an operation needs (all of them), by its kind's
    `regionbus.schemas.operation_kinds.Access`.

    Args:
        op: A decoded operation.

    Returns:
        The permissions; empty for client lifecycle operations; one no client principal
        holds for what only the servers produce.
    """
    region = op.region
    access = kind_row(op.kind).access
    if access is Access.WRITE_KEY:
        return (ResourcePermission(Resource.DATA, Action.WRITE, region, op.key or WILDCARD),)
    if access is Access.WRITE_REGION:
        return (ResourcePermission(Resource.DATA, Action.WRITE, region),)
    if access is Access.WRITE_DATA:
        return (ResourcePermission(Resource.DATA, Action.WRITE),)
    if access is Access.MANAGE_REGION:
        return (ResourcePermission(Resource.DATA, Action.MANAGE, region),)
    if access is Access.READ_KEY:
        return (data_read(region, op.key or WILDCARD),)
    if access is Access.READ_KEYS_OF_INTEREST:
        spec = op.interest
        if spec is not None and spec.kind is InterestKind.KEYS and spec.keys:
            return tuple(data_read(region, k) for k in spec.keys)
        return (data_read(region),)
    if access is Access.READ_REGION:
        return (data_read(region),)
    if access is Access.NONE:
        return ()
    return (ResourcePermission(Resource.ALL, Action.ALL, region),)


__all__ = [
    "CLUSTER_MANAGE",
    "Action",
    "Resource",
    "ResourcePermission",
    "data_read",
    "is_granted",
    "required_permissions",
]
