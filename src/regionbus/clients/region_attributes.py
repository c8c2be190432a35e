"""What a client region is made with besides its name: how it stores data (Geode
``ClientRegionShortcut``) and how it bounds its local cache (Geode ``EvictionAttributes``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from regionbus.schemas.errors import ConfigurationError


@dataclass(frozen=True)
class EvictionAttributes:
    """How a client region bounds its local cache (Geode ``EvictionAttributes``): LRU by
    entry count, evicting by a local destroy (Geode
    ``createLRUEntryAttributes(maximum, EvictionAction.LOCAL_DESTROY)``). An evicted entry
    stays on the server; its listeners hear ``after_destroy`` with ``is_eviction``; its
    interest stays, so a later change of the key reaches the client again.

    Attributes:
        maximum: Entries kept (Geode's default is 900 for an LRU entry count).
    """

    maximum: int = 900

    def __post_init__(self) -> None:
        if self.maximum < 1:
            raise ConfigurationError("an LRU entry count keeps at least one entry")

    @classmethod
    def lru_entry_count(cls, maximum: int = 900) -> EvictionAttributes:
        """Geode's ``EvictionAttributes.createLRUEntryAttributes(maximum)``, with its one
        client action, the local destroy.

        Raises:
            ConfigurationError: ``maximum`` is below 1.
        """
        return cls(maximum)


class RegionShortcut(enum.Enum):
    """How a client region stores data (Geode ``ClientRegionShortcut``, also importable by
    that name)."""

    PROXY = "PROXY"
    CACHING_PROXY = "CACHING_PROXY"


ClientRegionShortcut = RegionShortcut
"""Geode's name of :class:`RegionShortcut`."""


__all__ = ["ClientRegionShortcut", "EvictionAttributes", "RegionShortcut"]
