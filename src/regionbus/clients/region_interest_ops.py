"""A region's interest registrations (docs/behaviour.md §3; Geode ``Region.registerInterest`` and
``registerInterestRegex``): what it asks of
:class:`regionbus.clients.interest.RegionInterest`, which keeps them and loads their
entries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from regionbus.clients.interest import RegionInterest, keys_interest, regex_interest
from regionbus.schemas.messages import InterestKind, InterestResultPolicy, InterestSpec


class _Region(Protocol):
    """What these operations use of the region they are mixed into."""

    _interest: RegionInterest

    def _check_alive(self) -> None: ...


class RegionInterestOperations:
    """Mixed into :class:`regionbus.clients.region.Region` (its methods run on a region)."""

    def register_interest(
        self: _Region,
        keys: str | Iterable[str] | Any,
        policy: InterestResultPolicy = InterestResultPolicy.KEYS_VALUES,
        *,
        durable: bool = False,
        receive_values: bool = True,
    ) -> None:
        """Register interest in keys, or in every key with :data:`ALL_KEYS` (docs/behaviour.md §3).

        Steps (docs/behaviour.md §3): the local entries of those keys are silently destroyed; the
        registration is added on the server (keys need not exist yet); then, per
        ``policy``, the matching entries are loaded before this returns, firing no
        listener. From then on every change of a matching key reaches this client.

        Args:
            keys: One key, an iterable of keys, or ``ALL_KEYS``.
            policy: What to bulk-load (Geode default ``KEYS_VALUES``).
            durable: Keep the registration while a durable client is away.
            receive_values: False to receive invalidations instead of values for creates
                and updates.

        Raises:
            InvalidKeyError: a key is refused, as for :meth:`Region.put` (nothing is sent).
            RegionNotFoundError: the region is not defined on the server.
            ServerTimeoutError: not every bucket answered within ``read_timeout_ms``.
            UnconnectedError: the cache is closed or has no subscription queue.
        """
        self._check_alive()
        self._interest.register(keys_interest(keys, policy, durable, receive_values))

    def register_interest_regex(
        self: _Region,
        regex: str,
        policy: InterestResultPolicy = InterestResultPolicy.KEYS_VALUES,
        *,
        durable: bool = False,
        receive_values: bool = True,
    ) -> None:
        """Register interest in every key the regex matches in full (Geode's
        ``registerInterestRegex`` uses ``Matcher.matches()``). Every local entry is silently
        destroyed first.

        The syntax is RE2's (matching time linear in the key's length): what Python ``re``
        and Java regexes share for keys, without backreferences, lookahead/lookbehind,
        possessive quantifiers or atomic groups; at most 1,000 characters and a bounded
        compiled size (see :mod:`regionbus.schemas.interest_regex`).

        Raises:
            InvalidInterestError: the regex is refused, with the reason (nothing is sent).
            RegionNotFoundError, ServerTimeoutError, UnconnectedError: as
                :meth:`register_interest`.
        """
        spec = regex_interest(regex, policy, durable, receive_values)
        self._check_alive()
        self._interest.register(spec)

    def unregister_interest(self: _Region, keys: str | Iterable[str] | Any) -> None:
        """Remove interest in keys (or the ``ALL_KEYS`` registration). Local entries stay.

        Raises:
            ServerTimeoutError, UnconnectedError: as :meth:`register_interest`.
        """
        self._check_alive()
        self._interest.unregister(keys_interest(keys))

    def unregister_interest_regex(self: _Region, regex: str) -> None:
        """Remove a regex registration. Local entries stay.

        Raises:
            ServerTimeoutError, UnconnectedError: as :meth:`register_interest`.
        """
        self._check_alive()
        self._interest.unregister(InterestSpec(InterestKind.REGEX, (), regex))

    @property
    def interest(self: _Region) -> list[InterestSpec]:
        """This client's registrations on the region, in order."""
        return self._interest.specs

    def reinitialize(self: _Region) -> None:
        """Clear the local cache and register this region's interest again, loading the
        entries of interest; fires no listener (docs/behaviour.md §3, non-HA failover: the client's
        queue is gone).

        Raises:
            RegionNotFoundError, ServerTimeoutError, UnconnectedError: as
                :meth:`register_interest`.
        """
        self._interest.reinitialize()


__all__ = ["RegionInterestOperations"]
