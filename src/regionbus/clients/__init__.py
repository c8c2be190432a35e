"""The regionbus client library: ``ClientCache``, ``Region``, listeners, writers, interest.

Depends on :mod:`schemas` only.
"""

from regionbus.clients.cache import ClientCache
from regionbus.clients.cq_query import (
    CqAttributes,
    CqEvent,
    CqListener,
    CqQuery,
    CqResult,
    CqState,
    CqStatistics,
    CqStatusListener,
    Operation,
)
from regionbus.clients.function_execution import (
    DefaultResultCollector,
    Execution,
    FunctionService,
    ResultCollector,
)
from regionbus.clients.oql_query import Query
from regionbus.clients.query_service import QueryService
from regionbus.clients.region import (
    ALL_KEYS,
    ClientRegionShortcut,
    EvictionAttributes,
    Region,
    RegionShortcut,
)
from regionbus.clients.settings import ClientSettings
from regionbus.schemas.callbacks import CacheListener, CacheWriter, EntryEvent, RegionEvent
from regionbus.schemas.messages import EventKind, InterestResultPolicy
from regionbus.schemas.serializers import (
    AvroSerializer,
    BytesSerializer,
    JsonSerializer,
    StrSerializer,
)

__all__ = [
    "ALL_KEYS",
    "AvroSerializer",
    "BytesSerializer",
    "CacheListener",
    "CacheWriter",
    "ClientCache",
    "ClientRegionShortcut",
    "ClientSettings",
    "CqAttributes",
    "CqEvent",
    "CqListener",
    "CqQuery",
    "CqResult",
    "CqState",
    "CqStatistics",
    "CqStatusListener",
    "DefaultResultCollector",
    "EntryEvent",
    "EventKind",
    "EvictionAttributes",
    "Execution",
    "FunctionService",
    "InterestResultPolicy",
    "JsonSerializer",
    "Operation",
    "Query",
    "QueryService",
    "Region",
    "RegionEvent",
    "RegionShortcut",
    "ResultCollector",
    "StrSerializer",
]
