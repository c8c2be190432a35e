"""A client region's interest registrations: what the application asked for, how a
registration reaches the server and the local copy, and how it is made again.

The region keeps its registrations in order, so that after a non-HA failover (the
client's subscription queue is gone, docs/behaviour.md §3) it can clear its local copy and register
each again. Registering drops the local entries it may affect, adds the registration on
the server, then bulk-loads the matching entries per its ``InterestResultPolicy`` without
firing a listener (docs/behaviour.md §3); `regionbus.clients.local_store.LocalStore` keeps keys
destroyed meanwhile from being revived (docs/behaviour.md §5).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from regionbus.clients.arguments import check_interest
from regionbus.clients.local_store import LocalStore
from regionbus.clients.server_proxy import CacheConnection, ServerRegionProxy
from regionbus.schemas.limits import (
    MAX_KEYS_PER_CLIENT,
    MAX_KEYS_PER_REGISTRATION,
    MAX_REGEXES_PER_CLIENT,
    check_count,
)
from regionbus.schemas.messages import (
    InterestKind,
    InterestResultPolicy,
    InterestSpec,
    OperationKind,
)


class _AllKeys:
    def __repr__(self) -> str:
        return "ALL_KEYS"


ALL_KEYS: Any = _AllKeys()
"""Pass to ``register_interest`` for every key of the region (Geode ``"ALL_KEYS"``; that
string is accepted too)."""


def registered_keys(specs: Iterable[InterestSpec]) -> set[str]:
    """The keys of the key registrations among ``specs``."""
    return {key for spec in specs if spec.kind is InterestKind.KEYS for key in spec.keys}


def keys_interest(
    keys: str | Iterable[str] | Any,
    policy: InterestResultPolicy = InterestResultPolicy.KEYS_VALUES,
    durable: bool = False,
    receive_values: bool = True,
) -> InterestSpec:
    """The registration of one key, an iterable of keys, or every key (:data:`ALL_KEYS`
    or the string ``"ALL_KEYS"``)."""
    if keys is ALL_KEYS or keys == "ALL_KEYS":
        return InterestSpec(InterestKind.ALL_KEYS, (), None, policy, durable, receive_values)
    key_list = (keys,) if isinstance(keys, str) else tuple(keys)
    return InterestSpec(InterestKind.KEYS, key_list, None, policy, durable, receive_values)


def regex_interest(
    regex: str,
    policy: InterestResultPolicy = InterestResultPolicy.KEYS_VALUES,
    durable: bool = False,
    receive_values: bool = True,
) -> InterestSpec:
    """The registration of every key ``regex`` matches in full.

    Raises:
        InvalidInterestError: the regex is refused, with the reason (RE2 syntax and the
            limits of :func:`regionbus.schemas.interest_regex.compile_interest_regex`).
    """
    return check_interest(
        InterestSpec(InterestKind.REGEX, (), regex, policy, durable, receive_values)
    )


class RegionInterest:
    """The interest registrations of one client region, in the order they were made.

    Args:
        cache: The cache the region belongs to (it must have a subscription queue).
        server: The region's requests to the servers.
        store: The region's local copy, which registrations drop entries from and load.
    """

    def __init__(
        self, cache: CacheConnection, server: ServerRegionProxy, store: LocalStore
    ) -> None:
        self._cache = cache
        self._server = server
        self._store = store
        self._specs: list[InterestSpec] = []
        self._lock = threading.Lock()

    @property
    def specs(self) -> list[InterestSpec]:
        """The registrations, in order (a copy)."""
        with self._lock:
            return list(self._specs)

    def keys(self) -> set[str]:
        """The keys of this region's key registrations."""
        return registered_keys(self.specs)

    def register(self, spec: InterestSpec) -> None:
        """Drop the local entries ``spec`` may affect, add it on the server, and load what
        its policy asks for (no listener fires), each reply chunk's entries as it arrives:
        however many there are, they are never all held at once beside the local copy (an
        LRU-bounded region stays within its bound). A registration that fails drops what
        it loaded.

        Raises:
            RegionNotFoundError: the region is not defined on the server.
            ServerTimeoutError: not every bucket answered within ``read_timeout_ms``.
            UnconnectedError: the cache is closed or has no subscription queue.
            InvalidInterestError, InvalidKeyError: ``spec`` is refused (nothing is sent).
            RequestLimitError: more keys than `regionbus.schemas.limits.MAX_KEYS_PER_REGISTRATION`,
                keys past the client's `regionbus.schemas.limits.MAX_KEYS_PER_CLIENT`, or a
                regex past its `regionbus.schemas.limits.MAX_REGEXES_PER_CLIENT` (nothing is
                sent).
        """
        check_interest(spec)
        check_count("keys per registration", len(spec.keys), MAX_KEYS_PER_REGISTRATION)
        if spec.kind is InterestKind.KEYS:
            new = len(set(spec.keys) - self.keys())
            check_count(
                "keys per client", self._cache.key_registrations() + new, MAX_KEYS_PER_CLIENT
            )
        if spec.kind is InterestKind.REGEX and spec not in self.specs:
            check_count(
                "regexes per client", self._cache.regex_registrations() + 1, MAX_REGEXES_PER_CLIENT
            )
        self._cache.require_subscription()
        affected = spec.keys if spec.kind is InterestKind.KEYS else None
        self._store.begin_registration(affected)
        take = None
        if spec.policy is not InterestResultPolicy.NONE and self._store.caching:
            take = self._store.load_all
        try:
            replies = self._server.interest(OperationKind.REGISTER_INTEREST, spec, take)
            if not replies:
                return
            with self._lock:
                self._specs.append(spec)
            for reply in replies:
                if reply.version is not None:
                    self._store.registered(reply.bucket, reply.version)
        except BaseException:
            if take is not None:
                self._store.drop(affected)
            raise
        finally:
            self._store.end_registration()

    def unregister(self, spec: InterestSpec) -> None:
        """Remove ``spec`` on the server, and every registration here it covers.

        Raises:
            ServerTimeoutError, UnconnectedError: as :meth:`register`.
        """
        self._server.interest(OperationKind.UNREGISTER_INTEREST, spec)
        with self._lock:
            self._specs = [s for s in self._specs if not _covers(spec, s)]

    def reinitialize(self) -> None:
        """Clear the local copy and make every registration again, in order.

        Raises:
            RegionNotFoundError, ServerTimeoutError, UnconnectedError: as :meth:`register`.
        """
        with self._lock:
            specs, self._specs = self._specs, []
        self._store.reset()
        for spec in specs:
            self.register(spec)


def _covers(removed: InterestSpec, spec: InterestSpec) -> bool:
    if removed.kind is not spec.kind:
        return False
    if removed.kind is InterestKind.KEYS:
        return set(spec.keys) <= set(removed.keys)
    return removed.regex == spec.regex


__all__ = ["ALL_KEYS", "RegionInterest", "keys_interest", "regex_interest"]
