"""What a client region is made with besides its name: how it stores data (Geode
``ClientRegionShortcut``) and how it bounds its local cache (Geode ``EvictionAttributes``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from regionbus.schemas.errors import ConfigurationError


class EvictionAlgorithm(enum.Enum):
    """What an LRU counts (Geode ``EvictionAlgorithm``)."""

    LRU_ENTRY = "LRU_ENTRY"
    LRU_MEMORY = "LRU_MEMORY"


@dataclass(frozen=True)
class EvictionAttributes:
    """How a client region bounds its local cache (Geode ``EvictionAttributes``): LRU by
    entry count or by memory size, evicting by a local destroy (Geode
    ``createLRUEntryAttributes(maximum, EvictionAction.LOCAL_DESTROY)``,
    ``createLRUMemoryAttributes(megabytes, sizer, LOCAL_DESTROY)``). An evicted entry stays
    on the server; its listeners hear ``after_destroy`` with ``is_eviction``; its interest
    stays, so a later change of the key reaches the client again.

    Attributes:
        maximum: Entries kept (LRU_ENTRY; Geode's default 900), or megabytes of entries
            kept (LRU_MEMORY; Geode's default 10), each entry counted as its key's and
            value's bytes and a per-entry overhead
            (`regionbus.clients.local_store.entry_bytes`).
        algorithm: What ``maximum`` counts.
    """

    maximum: int = 900
    algorithm: EvictionAlgorithm = EvictionAlgorithm.LRU_ENTRY

    def __post_init__(self) -> None:
        if self.maximum < 1:
            raise ConfigurationError(
                f"an {self.algorithm.value} eviction keeps at least 1, not {self.maximum}"
            )

    @classmethod
    def lru_entry_count(cls, maximum: int = 900) -> EvictionAttributes:
        """Geode's ``EvictionAttributes.createLRUEntryAttributes(maximum)``, with its one
        client action, the local destroy.

        Raises:
            ConfigurationError: ``maximum`` is below 1.
        """
        return cls(maximum)

    @classmethod
    def lru_memory_size(cls, maximum_megabytes: int = 10) -> EvictionAttributes:
        """Geode's ``EvictionAttributes.createLRUMemoryAttributes(maximumMegabytes)`` (default
        10 MB), with the local destroy: the least recently used entries go once the
        entries held count more than ``maximum_megabytes`` MiB.

        Raises:
            ConfigurationError: ``maximum_megabytes`` is below 1.
        """
        return cls(maximum_megabytes, EvictionAlgorithm.LRU_MEMORY)

    @property
    def max_entries(self) -> int:
        """Entries kept, for an entry LRU (0: not one)."""
        return self.maximum if self.algorithm is EvictionAlgorithm.LRU_ENTRY else 0

    @property
    def max_bytes(self) -> int:
        """Bytes of entries kept, for a memory LRU (0: not one)."""
        return self.maximum * 1024 * 1024 if self.algorithm is EvictionAlgorithm.LRU_MEMORY else 0


class RegionShortcut(enum.Enum):
    """How a client region stores data (Geode ``ClientRegionShortcut``, also importable by
    that name)."""

    PROXY = "PROXY"
    CACHING_PROXY = "CACHING_PROXY"


ClientRegionShortcut = RegionShortcut
"""Geode's name of :class:`RegionShortcut`."""


__all__ = [
    "ClientRegionShortcut",
    "EvictionAlgorithm",
    "EvictionAttributes",
    "RegionShortcut",
]
