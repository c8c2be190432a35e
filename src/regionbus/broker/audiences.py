"""Audiences: the clients a change reaches, grouped so that one record serves all who share
an interest.

Routing client by client costs a server work for every subscriber of every event; a
thousand clients with the same registration (every key of a region, one regex) made it a
thousand records an event. Here the clients of one region are grouped by the registration
that reaches them: every key, one regex, or one key, with the same ``receive_values``.
The members of such a group get the same payload of an event, so the notifier sends it
once per partition of the shared queue topic they read, addressed to all of them
(`regionbus.schemas.addressing`), whatever their number. A client with two or more
registrations on a region that can match the same change (every key, a regex, its keys)
is routed alone there (its union, docs/behaviour.md §3: values when any matching registration wants
them), as before; a client's exact keys never match the same change, and count as one.

An audience is a snapshot, taken at the event: a client that registers, or leaves, is in
the audiences of the changes after that point of its bucket, and of none before (the
routing of a registration is exactly per bucket, invariant 3). Audiences are computed once
per bucket and kept until the region's registrations change.

The registrations of a region, as routed (:class:`RegionRegistrations`), are kept here with
the audiences they form; `regionbus.broker.interest` installs, stores and routes by them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from regionbus.schemas.interest_regex import InterestRegex


@dataclass(slots=True)
class Registration:
    """One registration of a client, as routed: values or invalidations, durable or
    not, and the buckets it is installed in."""

    receive_values: bool
    durable: bool
    buckets: set[int]


@dataclass(slots=True)
class RegexRegistration(Registration):
    """A regex registration, with its compiled pattern."""

    pattern: InterestRegex


@dataclass(slots=True)
class RegionRegistrations:
    """Every registration on one region: all keys, by key, and by (client, pattern)."""

    all_keys: dict[str, Registration] = field(default_factory=dict)
    keys: dict[str, dict[str, Registration]] = field(default_factory=dict)
    regexes: dict[tuple[str, str], RegexRegistration] = field(default_factory=dict)
    keys_of: dict[str, set[str]] = field(default_factory=dict)
    """``{client id: its keys in keys}``: what touches one client's registrations (forget
    it, count them for its audiences) costs its own keys, not every registered key (a
    fleet's clients come and go, and a large registration arrives in many steps)."""
    patterns_of: dict[str, set[str]] = field(default_factory=dict)
    """``{client id: its patterns in regexes}``, for the same reason."""
    audiences: RegionAudiences | None = None
    """Built from the registrations when first routed by, dropped when they change."""

    def clients(self) -> set[str]:
        return set(self.all_keys) | set(self.keys_of) | set(self.patterns_of)


class Audience(NamedTuple):
    """Clients reached by one registration of a region, who get the same payload.

    Attributes:
        source: What reaches them, stable while the registrations last: ``("all",
            region)``, ``("regex", region, pattern)`` or ``("key", region, key)``.
        receive_values: Whether they get values (else invalidations) of creates and
            updates.
        clients: The client ids.
    """

    source: tuple[str, ...]
    receive_values: bool
    clients: frozenset[str]


class Route(NamedTuple):
    """Who an event reaches.

    Attributes:
        audiences: The clients with one registration on the region that can match a
            change (a client's keys count as one), by registration.
        individual: ``{client id: receive_values}`` of the clients with two or more (the
            union of theirs).
    """

    audiences: tuple[Audience, ...]
    individual: dict[str, bool]


@dataclass(slots=True)
class RegionAudiences:
    """The audiences of one region, built from its registrations and kept until they
    change (:func:`build`)."""

    region: str
    overlapping: frozenset[str]
    all_keys: Mapping[str, Registration]
    regexes: dict[str, tuple[InterestRegex, dict[str, RegexRegistration]]]
    client_patterns: dict[str, list[str]]
    by_bucket_all: dict[int, tuple[Audience, ...]] = field(default_factory=dict)
    by_bucket_regex: dict[int, tuple[tuple[InterestRegex, tuple[Audience, ...]], ...]] = field(
        default_factory=dict
    )
    by_key: dict[tuple[str, int], tuple[Audience, ...]] = field(default_factory=dict)
    interned: dict[Audience, Audience] = field(default_factory=dict)
    """One object per distinct audience, whatever the bucket: the notifier keeps an
    audience's targets by it, and a lookup by the same object stops at identity instead of
    comparing its clients one by one."""


def build(region: str, ri: RegionRegistrations) -> RegionAudiences:
    """The audiences of a region: who has registrations there that can match the same
    change, routed alone with their union, and who has not.

    Two exact keys never match the same change, so a client's keys count as one
    registration: a client of several keys and nothing else on the region is in each of
    its keys' audiences. Routed alone, a fleet of durable clients of a few keys each made
    every change of the region walk all of them (10,000 such clients held a server at
    200 puts/s to seconds of latency).
    """
    entries: dict[str, int] = {}
    for client_id in ri.all_keys:
        entries[client_id] = 1
    for client_id, keys in ri.keys_of.items():
        if keys:
            entries[client_id] = entries.get(client_id, 0) + 1
    client_patterns: dict[str, list[str]] = {}
    for client_id, pattern in ri.regexes:
        entries[client_id] = entries.get(client_id, 0) + 1
        client_patterns.setdefault(client_id, []).append(pattern)
    overlapping = frozenset(c for c, n in entries.items() if n > 1)
    regexes: dict[str, tuple[InterestRegex, dict[str, RegexRegistration]]] = {}
    for (client_id, pattern), reg in ri.regexes.items():
        if client_id not in overlapping:
            regexes.setdefault(pattern, (reg.pattern, {}))[1][client_id] = reg
    return RegionAudiences(
        region,
        overlapping,
        ri.all_keys,
        regexes,
        {c: p for c, p in client_patterns.items() if c in overlapping},
    )


def _split(
    audiences: RegionAudiences,
    source: tuple[str, ...],
    members: Mapping[str, Registration],
    bucket: int,
    skip: frozenset[str],
) -> tuple[Audience, ...]:
    """One audience per ``receive_values`` of the members active in ``bucket``, the same
    object as an equal one of another bucket (:attr:`RegionAudiences.interned`)."""
    with_values: set[str] = set()
    without: set[str] = set()
    for client_id, reg in members.items():
        if bucket in reg.buckets and client_id not in skip:
            (with_values if reg.receive_values else without).add(client_id)
    interned = audiences.interned
    return tuple(
        interned.setdefault(audience, audience)
        for receive_values, clients in ((True, with_values), (False, without))
        if clients
        for audience in (Audience(source, receive_values, frozenset(clients)),)
    )


def route(audiences: RegionAudiences, ri: RegionRegistrations, key: str, bucket: int) -> Route:
    """Who a change of ``key`` in ``bucket`` reaches (see :class:`Route`)."""
    region = audiences.region
    found: list[Audience] = []
    everyone = audiences.by_bucket_all.get(bucket)
    if everyone is None:
        everyone = audiences.by_bucket_all[bucket] = _split(
            audiences, ("all", region), audiences.all_keys, bucket, audiences.overlapping
        )
    found.extend(everyone)
    patterns = audiences.by_bucket_regex.get(bucket)
    if patterns is None:
        patterns = audiences.by_bucket_regex[bucket] = tuple(
            (compiled, split)
            for text, (compiled, members) in audiences.regexes.items()
            if (split := _split(audiences, ("regex", region, text), members, bucket, frozenset()))
        )
    for compiled, split in patterns:
        if compiled.fullmatch(key) is not None:
            found.extend(split)
    by_client = ri.keys.get(key)
    if by_client:
        keyed = audiences.by_key.get((key, bucket))
        if keyed is None:
            keyed = audiences.by_key[(key, bucket)] = _split(
                audiences, ("key", region, key), by_client, bucket, audiences.overlapping
            )
        found.extend(keyed)
    return Route(tuple(found), _individual(audiences, ri, key, bucket))


def _individual(
    audiences: RegionAudiences, ri: RegionRegistrations, key: str, bucket: int
) -> dict[str, bool]:
    """The union route of the clients with two or more registrations on the region."""
    out: dict[str, bool] = {}
    if not audiences.overlapping:
        return out
    by_key = ri.keys.get(key, {})
    for client_id in audiences.overlapping:
        wanted: bool | None = None
        reg = ri.all_keys.get(client_id)
        if reg is not None and bucket in reg.buckets:
            wanted = reg.receive_values
        key_reg = by_key.get(client_id)
        if key_reg is not None and bucket in key_reg.buckets:
            wanted = bool(wanted) or key_reg.receive_values
        for pattern in audiences.client_patterns.get(client_id, ()):
            if wanted:
                break
            regex_reg = ri.regexes[(client_id, pattern)]
            if bucket in regex_reg.buckets and regex_reg.pattern.fullmatch(key) is not None:
                wanted = bool(wanted) or regex_reg.receive_values
        if wanted is not None:
            out[client_id] = wanted
    return out


__all__ = ["Audience", "RegionAudiences", "Route", "build", "route"]
