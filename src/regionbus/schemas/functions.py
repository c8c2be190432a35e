"""What a function run on the cache servers implements, and what it is handed (Geode
``org.apache.geode.cache.execute``: ``Function``, ``FunctionContext``,
``RegionFunctionContext``, ``ResultSender``; ``PartitionRegionHelper``).

A function is registered on every server (the ``functions`` setting, or
``CacheServer(functions=[...])``) and executed by clients through
``regionbus.clients.function_execution.FunctionService``. On a server it runs on a worker
thread, never on the loop that serves every client (`regionbus.broker.functions`):

- ``on_region(r)`` runs it once per bucket of the region, on the bucket's primary, with a
  :class:`RegionFunctionContext`: its :attr:`~RegionFunctionContext.filter` (the keys of
  the execution's filter in this bucket), its :attr:`~RegionFunctionContext.data_set`
  (the region) and, through :meth:`PartitionRegionHelper.get_local_data_for_context`, the
  bucket's own entries. With a filter only the filter's buckets run it. Geode runs it once
  per member, over all of that member's buckets; here the bucket is the unit of
  ownership, so it is also the unit of execution and of re-execution.
- ``on_servers`` runs it once on each server that is primary of a bucket (a server reads
  requests only through the buckets it holds), with a :class:`FunctionContext`.

The region a function is handed (:class:`ServerRegion`) reads the stored entries; its
``put``, ``destroy`` and ``invalidate`` are distributed as a client's are, and its
``local_destroy`` and ``local_invalidate`` reach no client, as in Geode (see
:class:`ServerRegion` for what that means where Redis holds the region).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, Final, NamedTuple, Protocol

from regionbus.schemas.entry_checks import check_key
from regionbus.schemas.errors import FunctionError, InvalidOperationError, SerializationError
from regionbus.schemas.messages import Entry, OperationKind
from regionbus.schemas.serializers import plain_bytes, serializer_named

FUNCTION_HAS_RESULT: Final = 1
"""Bit of ``Reply.function_state``: the function sends results."""
FUNCTION_IS_HA: Final = 2
"""Bit of ``Reply.function_state``: the function may be re-executed after a failure."""
FUNCTION_OPTIMIZE_FOR_WRITE: Final = 4
"""Bit of ``Reply.function_state``: the function writes to the region it runs on."""

EXCEPTION_RESULT: Final = "(exception)"
"""The serializer name of a result sent with :meth:`ResultSender.send_exception`: its bytes
are the exception's class name and message, and the client's collector receives a
:class:`~regionbus.schemas.errors.FunctionError` in its place."""

MAX_FUNCTION_ID_CHARS: Final = 256
"""Longest function id (Geode sets none; an id travels in every execution)."""


def check_function_id(function_id: object) -> str:
    """A function id as it may travel: a ``str`` of 1 to :data:`MAX_FUNCTION_ID_CHARS`.

    Raises:
        InvalidOperationError: it is not one.
    """
    if not isinstance(function_id, str) or not 0 < len(function_id) <= MAX_FUNCTION_ID_CHARS:
        raise InvalidOperationError(
            f"a function id is a str of 1 to {MAX_FUNCTION_ID_CHARS} characters, "
            f"not {function_id!r:.80}"
        )
    return function_id


class FunctionAttributes(NamedTuple):
    """What a client needs to know of a function before it executes it (Geode's
    ``functionState`` byte, ``AbstractExecution.getFunctionState``).

    Attributes:
        has_result: The function sends results (Geode ``Function.hasResult``, default true).
        is_ha: It may be re-executed after a failure (Geode ``Function.isHA``, default true).
        optimize_for_write: It writes to the region it runs on (Geode
            ``Function.optimizeForWrite``, default false).
    """

    has_result: bool = True
    is_ha: bool = True
    optimize_for_write: bool = False

    @property
    def state(self) -> int:
        """The attributes as ``Reply.function_state`` carries them."""
        return (
            (FUNCTION_HAS_RESULT if self.has_result else 0)
            | (FUNCTION_IS_HA if self.is_ha else 0)
            | (FUNCTION_OPTIMIZE_FOR_WRITE if self.optimize_for_write else 0)
        )

    @classmethod
    def from_state(cls, state: int) -> FunctionAttributes:
        """The attributes ``Reply.function_state`` carries."""
        return cls(
            bool(state & FUNCTION_HAS_RESULT),
            bool(state & FUNCTION_IS_HA),
            bool(state & FUNCTION_OPTIMIZE_FOR_WRITE),
        )

    @classmethod
    def of(cls, function: Function) -> FunctionAttributes:
        """A function's attributes.

        Raises:
            FunctionError: it is ``is_ha`` without ``has_result`` (Geode refuses it:
                "For Functions with isHA true, hasResult must also be true.").
        """
        attributes = cls(
            bool(function.has_result), bool(function.is_ha), bool(function.optimize_for_write)
        )
        if attributes.is_ha and not attributes.has_result:
            raise FunctionError(
                f"function {function.id!r}: for Functions with isHA true, hasResult must also "
                "be true"
            )
        return attributes


class Function:
    """A function the cache servers run (Geode ``Function``): subclass it, give it an
    :attr:`id` and :meth:`execute`, and register it on every server.

    Attributes:
        id: The id it is registered and executed by (Geode ``Function.getId``); by default
            its class's module and qualified name, as Geode's default is the class's
            canonical name.
        has_result: It sends results through ``context.result_sender``, ending with
            ``last_result`` (Geode ``hasResult``, default True). Without, ``execute``
            returns at once on the client and ``get_result`` raises ``FunctionError``.
        is_ha: It may be executed again after the server running it failed, so it must be
            idempotent (Geode ``isHA``, default True); the re-execution's context says
            ``is_possible_duplicate``. Needs ``has_result``.
        optimize_for_write: It writes to the region it runs on (Geode
            ``optimizeForWrite``, default False: a read, which Geode may run on any member
            holding the bucket). regionbus always runs it on the bucket's primary, the
            one member that reads the bucket's requests, which serves both.
    """

    id: str = ""
    has_result: bool = True
    is_ha: bool = True
    optimize_for_write: bool = False

    _id_given: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Geode's getId: an overridden id is inherited, the default is each class's own name.
        if cls.__dict__.get("id"):
            cls._id_given = True
        elif not cls._id_given:
            cls.id = f"{cls.__module__}.{cls.__qualname__}"

    def execute(self, context: FunctionContext) -> None:
        """Run once per bucket (``on_region``) or per server (``on_servers``), on a worker
        thread of the server, within the servers' ``function_timeout_ms`` (Geode
        ``Function.execute``). The server's one instance runs on several threads at once,
        so it must be thread-safe, as Geode's. Send results through
        ``context.result_sender``; raise to fail the execution (the caller gets
        ``FunctionError`` naming the exception; ``FunctionInvocationTargetError`` asks for
        a re-execution of an ``is_ha`` function)."""
        raise NotImplementedError


class ResultSender:
    """Sends a function's results to the caller's ``ResultCollector`` (Geode
    ``ResultSender``): any number of :meth:`send_result`, then exactly one
    :meth:`last_result`. Thread-safe. The results are encoded as they are sent (``bytes``
    as they are, anything else as JSON) and answered once the function returns.

    Args:
        function_id: The function's id (messages).
        member_id: The server's member id, which the caller's collector gets beside each
            result (Geode's ``DistributedMember``).
        has_result: The function's ``has_result``.
        max_bytes: The servers' ``function_max_result_bytes``: most bytes of results one
            execution sends.
    """

    def __init__(self, function_id: str, member_id: str, has_result: bool, max_bytes: int) -> None:
        self._function_id = function_id
        self._member_id = member_id
        self._has_result = has_result
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._results: list[Entry] = []
        self._bytes = 0
        self.last_sent = False
        """Whether :meth:`last_result` was called."""

    def send_result(self, result: Any) -> None:
        """Send one result (Geode ``sendResult``).

        Raises:
            FunctionError: the function has no result, its last result was sent, or the
                results would exceed ``function_max_result_bytes``.
            SerializationError: the result is neither bytes nor JSON-serializable.
        """
        self._add(*plain_bytes(result))

    def last_result(self, result: Any) -> None:
        """Send the last result: the execution is complete once the function returns
        (Geode ``lastResult``).

        Raises:
            What :meth:`send_result` raises.
        """
        self._add(*plain_bytes(result), last=True)

    def send_exception(self, exception: BaseException) -> None:
        """Send an exception as a result: the collector gets a ``FunctionError`` naming it
        in its place, and the execution goes on (Geode ``sendException``).

        Raises:
            What :meth:`send_result` raises.
        """
        text = f"{type(exception).__name__}: {exception}"
        self._add(text.encode(errors="replace"), EXCEPTION_RESULT)

    def _add(self, data: bytes, serializer: str, last: bool = False) -> None:
        with self._lock:
            if not self._has_result:
                raise FunctionError(
                    f"cannot return any result as the Function#hasResult() is false "
                    f"(function {self._function_id!r})"
                )
            if self.last_sent:
                raise FunctionError(f"function {self._function_id!r} sent its last result already")
            self._bytes += len(data) + len(self._member_id)
            if self._bytes > self._max_bytes:
                raise FunctionError(
                    f"the results of function {self._function_id!r} exceed "
                    f"function_max_result_bytes={self._max_bytes}"
                )
            self._results.append(Entry(self._member_id, len(self._results), data, serializer))
            self.last_sent = last

    def results(self) -> list[Entry]:
        """The results sent so far, in order, as the replies carry them."""
        with self._lock:
            return list(self._results)


def result_value(entry: Entry) -> Any:
    """One result as the caller's collector receives it: the decoded value, or for an
    exception sent with :meth:`ResultSender.send_exception` a ``FunctionError``.

    Raises:
        SerializationError: the result does not decode.
    """
    if entry.serializer == EXCEPTION_RESULT:
        return FunctionError((entry.value or b"").decode(errors="replace"))
    return plain_value(entry.value, entry.serializer)


def plain_value(data: bytes | None, serializer: str | None) -> Any:
    """A value encoded by `regionbus.schemas.serializers.plain_bytes` (arguments, results).

    Raises:
        SerializationError: it does not decode, or the serializer is neither ``json`` nor
            ``bytes``.
    """
    if data is None:
        return None
    if serializer not in ("json", "bytes"):
        raise SerializationError(f"a function's value is json or bytes, not {serializer!r}")
    return serializer_named(serializer).loads(data)


class RegionAccess(Protocol):
    """What a server gives one execution to reach the regions with (implemented by
    `regionbus.broker.function_region`): every call checks the execution's time budget."""

    def get(self, region: str, key: str) -> Any:
        """The stored value of a key (None: absent or invalid)."""
        ...

    def change(
        self,
        kind: OperationKind,
        region: str,
        key: str,
        value: Any,
        callback_argument: bytes | None,
    ) -> None:
        """Hand a change of a key to its bucket (PUT, DESTROY, INVALIDATE, LOCAL_*)."""
        ...

    def entries(self, region: str, bucket: int) -> Iterator[tuple[str, Any]]:
        """The valid entries of one bucket, decoded."""
        ...

    def bucket_of(self, region: str, key: str) -> int:
        """The bucket of a key."""
        ...


class ServerRegion:
    """A region as a server-side function sees it (Geode's ``Region`` on a server, a
    ``RegionFunctionContext.getDataSet``).

    Reads are of the stored entries (no ``CacheLoader`` runs on a miss). The changes go
    to the key's bucket in its order, as operations of this server (EventIDs of its own,
    its member id as the originator), and return once handed over: the function's answer
    waits until every change it made is in its bucket's log, and each is applied, in the
    bucket's order, right after. So a ``get`` right after a ``put`` of the same function
    may still read the old value.

    - :meth:`put`, :meth:`destroy` and :meth:`invalidate` are distributed as a client's
      are: writers, the EventID and version rules, listeners, subscribers, CQs, gateways.
    - :meth:`local_destroy` and :meth:`local_invalidate` change the stored entry and tell
      no client, CQ or gateway; no writer is asked (Geode's local operations invoke
      none) and the server listeners of the bucket's primary hear them. In Geode such a
      change is the member's own copy; here Redis holds the one copy of the region that
      every server serves, so the entry is gone (or invalid) for every later read, while
      clients that cache it keep what they hold until their next event of it.

    Args:
        name: The region's name.
        access: The execution's way to the regions.
    """

    def __init__(self, name: str, access: RegionAccess) -> None:
        self.name = name
        self._access = access

    def get(self, key: str) -> Any:
        """The stored value, or None when the key is absent or invalid (Geode
        ``Region.get``, without a loader).

        Raises:
            InvalidKeyError: the key is not a valid key.
            RegionNotFoundError: the region is not defined on the servers.
            FunctionTimeoutError: the execution is past its ``function_timeout_ms``.
            TransportError: Redis failed.
        """
        return self._access.get(self.name, check_key(key))

    def put(self, key: str, value: Any, callback_argument: bytes | None = None) -> None:
        """Create or update an entry, distributed (Geode ``Region.put``; the old value is
        not returned: the put is applied after this returns). ``bytes`` are stored as
        they are, anything else as JSON.

        Raises:
            InvalidKeyError: the key is not a valid key.
            ValueTooLargeError: the value is over the servers' ``max_value_size_bytes``.
            SerializationError: the value is neither bytes nor JSON-serializable.
            FunctionTimeoutError: the execution is past its ``function_timeout_ms``.
        """
        self._change(OperationKind.PUT, key, value, callback_argument)

    def destroy(self, key: str, callback_argument: bytes | None = None) -> None:
        """Destroy an entry, distributed (Geode ``Region.destroy``; a missing entry is not
        reported: the destroy is applied after this returns). Raises as :meth:`put`."""
        self._change(OperationKind.DESTROY, key, None, callback_argument)

    def invalidate(self, key: str, callback_argument: bytes | None = None) -> None:
        """Invalidate an entry, distributed (Geode ``Region.invalidate``). Raises as
        :meth:`destroy`."""
        self._change(OperationKind.INVALIDATE, key, None, callback_argument)

    def local_destroy(self, key: str, callback_argument: bytes | None = None) -> None:
        """Destroy an entry without telling any client (Geode ``Region.localDestroy``;
        see the class). Raises as :meth:`destroy`."""
        self._change(OperationKind.LOCAL_DESTROY, key, None, callback_argument)

    def local_invalidate(self, key: str, callback_argument: bytes | None = None) -> None:
        """Invalidate an entry without telling any client (Geode
        ``Region.localInvalidate``; see the class). Raises as :meth:`destroy`."""
        self._change(OperationKind.LOCAL_INVALIDATE, key, None, callback_argument)

    def _change(
        self, kind: OperationKind, key: str, value: Any, callback_argument: bytes | None
    ) -> None:
        self._access.change(kind, self.name, check_key(key), value, callback_argument)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class LocalDataSet(ServerRegion):
    """The entries of the buckets an execution runs on (Geode ``LocalDataSet``, what
    :meth:`PartitionRegionHelper.get_local_data_for_context` returns): iterate them, or
    read and change them as :class:`ServerRegion`. Each iteration reads the buckets from
    the store a page at a time, so it sees the changes applied before each page is read.

    Args:
        name: The region's name.
        access: The execution's way to the regions.
        buckets: The buckets it holds.
    """

    def __init__(self, name: str, access: RegionAccess, buckets: frozenset[int]) -> None:
        super().__init__(name, access)
        self.buckets = buckets

    def get(self, key: str) -> Any:
        """The stored value of a key of these buckets; None for a key of another bucket,
        as for an absent or invalid one. Raises as :meth:`ServerRegion.get`."""
        if self._access.bucket_of(self.name, check_key(key)) not in self.buckets:
            return None
        return super().get(key)

    def items(self) -> Iterator[tuple[str, Any]]:
        """The ``(key, value)`` of every valid entry of these buckets.

        Raises:
            RegionNotFoundError: the region is not defined on the servers.
            FunctionTimeoutError: the execution is past its ``function_timeout_ms``.
            SerializationError: a value does not decode here.
            TransportError: Redis failed.
        """
        for bucket in sorted(self.buckets):
            yield from self._access.entries(self.name, bucket)

    def keys(self) -> Iterator[str]:
        """The keys of every valid entry of these buckets. Raises as :meth:`items`."""
        return (key for key, _ in self.items())

    def values(self) -> Iterator[Any]:
        """The values of every valid entry of these buckets. Raises as :meth:`items`."""
        return (value for _, value in self.items())

    def __iter__(self) -> Iterator[str]:
        return self.keys()

    def size(self) -> int:
        """How many valid entries these buckets hold (Geode ``Region.size``), counted by
        reading them. Raises as :meth:`items`."""
        return sum(1 for _ in self.items())


class ServerCache:
    """The cache of the server running a function (Geode ``FunctionContext.getCache``).

    Args:
        access: The execution's way to the regions.
    """

    def __init__(self, access: RegionAccess) -> None:
        self._access = access

    def get_region(self, name: str) -> ServerRegion:
        """A region of the servers, as :class:`ServerRegion` (Geode ``Cache.getRegion``;
        a region not defined fails at its first use with ``RegionNotFoundError``)."""
        return ServerRegion(name, self._access)


class FunctionContext:
    """What one execution of a function is handed (Geode ``FunctionContext``).

    Attributes:
        function_id: The function's id (Geode ``getFunctionId``).
        arguments: The arguments the caller set (Geode ``getArguments``), decoded; None
            when it set none.
        result_sender: Where the results go (Geode ``getResultSender``).
        is_possible_duplicate: This is a re-execution of an ``is_ha`` function after a
            failure, so it may have run before (Geode ``isPossibleDuplicate``).
        member_name: The member id of the server running it (Geode ``getMemberName``).
        cache: The server's cache, for its regions (Geode ``getCache``).
    """

    def __init__(
        self,
        function_id: str,
        arguments: Any,
        result_sender: ResultSender,
        is_possible_duplicate: bool,
        member_name: str,
        cache: ServerCache,
    ) -> None:
        self.function_id = function_id
        self.arguments = arguments
        self.result_sender = result_sender
        self.is_possible_duplicate = is_possible_duplicate
        self.member_name = member_name
        self.cache = cache


class RegionFunctionContext(FunctionContext):
    """What one bucket's execution of an ``on_region`` function is handed (Geode
    ``RegionFunctionContext``).

    Attributes:
        data_set: The region it runs on (Geode ``getDataSet``).
        filter: The keys of the execution's filter in this bucket; empty without a filter
            (Geode ``getFilter``).
        bucket: The bucket this execution runs on.
    """

    def __init__(
        self,
        base: FunctionContext,
        data_set: ServerRegion,
        filter_keys: frozenset[str],
        bucket: int,
    ) -> None:
        super().__init__(
            base.function_id,
            base.arguments,
            base.result_sender,
            base.is_possible_duplicate,
            base.member_name,
            base.cache,
        )
        self.data_set = data_set
        self.filter = filter_keys
        self.bucket = bucket


class PartitionRegionHelper:
    """Geode's ``PartitionRegionHelper``, for what a function reads of its buckets."""

    @staticmethod
    def get_local_data_for_context(context: RegionFunctionContext) -> LocalDataSet:
        """The entries of the buckets the execution runs on: the filter's, or without a
        filter every bucket it was sent to (Geode ``getLocalDataForContext``). Here one
        execution runs on one bucket.

        Raises:
            FunctionError: the context is not a region function's.
        """
        if not isinstance(context, RegionFunctionContext):
            raise FunctionError("the local data is a region function's (FunctionService.on_region)")
        region = context.data_set
        return LocalDataSet(region.name, region._access, frozenset((context.bucket,)))


__all__ = [
    "EXCEPTION_RESULT",
    "FUNCTION_HAS_RESULT",
    "FUNCTION_IS_HA",
    "FUNCTION_OPTIMIZE_FOR_WRITE",
    "MAX_FUNCTION_ID_CHARS",
    "Function",
    "FunctionAttributes",
    "FunctionContext",
    "LocalDataSet",
    "PartitionRegionHelper",
    "RegionAccess",
    "RegionFunctionContext",
    "ResultSender",
    "ServerCache",
    "ServerRegion",
    "check_function_id",
    "plain_value",
    "result_value",
]
