"""regionbus: Geode-style client caches kept current by server-pushed events, on Kafka and Redis.

The documented entry point for applications::

    from regionbus import ALL_KEYS, CacheListener, ClientCache

Subpackages (each a folder of the repository): ``regionbus.clients`` (the client library),
``regionbus.broker`` (the cache server and the ``regionbus`` command line),
``regionbus.gateways`` (gateway senders and receivers, async event queues),
``regionbus.schemas`` (the wire contract), ``regionbus.spark`` (Spark jobs; needs the
``spark`` extra), ``regionbus.demo`` (the flights demo; needs the ``demo`` extra),
``regionbus.devstack`` (the embedded Kafka and Redis) and ``regionbus.runtime`` (what every
worker shares). Importing this package imports the client library only.
"""

from importlib.metadata import PackageNotFoundError, version

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
from regionbus.schemas.callbacks import (
    CacheListener,
    CacheLoader,
    CacheWriter,
    EntryEvent,
    LoaderHelper,
    RegionEvent,
)
from regionbus.schemas.errors import (
    AuthenticationError,
    BulkOperationError,
    CacheLoaderError,
    CacheWriterError,
    ConfigurationError,
    CqClosedError,
    CqError,
    CqEvaluationError,
    CqExistsError,
    CqInvalidError,
    CqStateError,
    DuplicateClientError,
    DuplicateDurableClientError,
    EntryExistsError,
    EntryNotFoundError,
    ExtraNotInstalledError,
    FunctionError,
    FunctionInvocationTargetError,
    FunctionNotRegisteredError,
    FunctionTimeoutError,
    InvalidInterestError,
    InvalidKeyError,
    InvalidOperationError,
    InvalidRegionNameError,
    NotAuthorizedError,
    QueryError,
    QueryExecutionTimeoutError,
    QueryFunctionDomainError,
    QueryInvalidError,
    QueryInvocationTargetError,
    QueryRowLimitError,
    QueryTypeMismatchError,
    RegionBusError,
    RegionNotFoundError,
    RequestLimitError,
    RetriableError,
    SerializationError,
    ServerOperationError,
    ServerTimeoutError,
    TransportError,
    UnconnectedError,
    ValueTooLargeError,
)
from regionbus.schemas.eventid import EventID
from regionbus.schemas.functions import (
    Function,
    FunctionContext,
    LocalDataSet,
    PartitionRegionHelper,
    RegionFunctionContext,
    ResultSender,
    ServerRegion,
)
from regionbus.schemas.messages import EventKind, InterestResultPolicy
from regionbus.schemas.query import Struct
from regionbus.schemas.serializers import (
    AvroSerializer,
    BytesSerializer,
    JsonSerializer,
    StrSerializer,
)

try:
    __version__ = version("regionbus")
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ALL_KEYS",
    "AuthenticationError",
    "AvroSerializer",
    "BulkOperationError",
    "BytesSerializer",
    "CacheListener",
    "CacheLoader",
    "CacheLoaderError",
    "CacheWriter",
    "CacheWriterError",
    "ClientCache",
    "ClientRegionShortcut",
    "ClientSettings",
    "ConfigurationError",
    "CqAttributes",
    "CqClosedError",
    "CqError",
    "CqEvaluationError",
    "CqEvent",
    "CqExistsError",
    "CqInvalidError",
    "CqListener",
    "CqQuery",
    "CqResult",
    "CqState",
    "CqStateError",
    "CqStatistics",
    "CqStatusListener",
    "DefaultResultCollector",
    "DuplicateClientError",
    "DuplicateDurableClientError",
    "EntryEvent",
    "EntryExistsError",
    "EntryNotFoundError",
    "EventID",
    "EventKind",
    "EvictionAttributes",
    "Execution",
    "ExtraNotInstalledError",
    "Function",
    "FunctionContext",
    "FunctionError",
    "FunctionInvocationTargetError",
    "FunctionNotRegisteredError",
    "FunctionService",
    "FunctionTimeoutError",
    "InterestResultPolicy",
    "InvalidInterestError",
    "InvalidKeyError",
    "InvalidOperationError",
    "InvalidRegionNameError",
    "JsonSerializer",
    "LoaderHelper",
    "LocalDataSet",
    "NotAuthorizedError",
    "Operation",
    "PartitionRegionHelper",
    "Query",
    "QueryError",
    "QueryExecutionTimeoutError",
    "QueryFunctionDomainError",
    "QueryInvalidError",
    "QueryInvocationTargetError",
    "QueryRowLimitError",
    "QueryService",
    "QueryTypeMismatchError",
    "Region",
    "RegionBusError",
    "RegionEvent",
    "RegionFunctionContext",
    "RegionNotFoundError",
    "RegionShortcut",
    "RequestLimitError",
    "ResultCollector",
    "ResultSender",
    "RetriableError",
    "SerializationError",
    "ServerOperationError",
    "ServerRegion",
    "ServerTimeoutError",
    "StrSerializer",
    "Struct",
    "TransportError",
    "UnconnectedError",
    "ValueTooLargeError",
    "__version__",
]
