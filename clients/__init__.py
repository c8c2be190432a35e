"""The regionbus client library: ``ClientCache``, ``Region``, listeners, writers, interest.

Depends on :mod:`schemas` only.
"""

from clients.cache import ClientCache
from clients.region import ALL_KEYS, Region, RegionShortcut
from clients.settings import ClientSettings
from schemas.callbacks import CacheListener, CacheWriter, EntryEvent, RegionEvent
from schemas.messages import EventKind, InterestResultPolicy
from schemas.serializers import AvroSerializer, BytesSerializer, JsonSerializer, StrSerializer

__all__ = [
    "ALL_KEYS",
    "AvroSerializer",
    "BytesSerializer",
    "CacheListener",
    "CacheWriter",
    "ClientCache",
    "ClientSettings",
    "EntryEvent",
    "EventKind",
    "InterestResultPolicy",
    "JsonSerializer",
    "Region",
    "RegionEvent",
    "RegionShortcut",
    "StrSerializer",
]
