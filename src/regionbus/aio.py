"""An asyncio face of the client: awaitable region operations, one-shot queries and
function executions, and ``async for`` over a region's events and a continuous query's
events.

The client underneath is the threaded :class:`regionbus.clients.cache.ClientCache`: writes
that have a pipelined form (``put``, ``destroy``) await its futures; every other call runs
on a worker thread (:func:`asyncio.to_thread`), so no call blocks the event loop.

Events reach a stream from the client's subscription thread. A stream holds at most
``max_buffered`` events not yet taken; when it is full, the subscription thread waits for
the consumer to take one (back-pressure): the client reads its queue no faster than the
application consumes, and the servers' queue capacity rules (``maximum_message_count``)
then apply to this client as to any slow one. That thread serves every region and CQ of
the cache, so one stream left full holds back the others: close a stream (leave its
``async for``, or call :meth:`EventStream.aclose`) when done with it.

Example:
    >>> async def main():
    ...     async with await AsyncClientCache.connect(namespace="regionbus") as cache:
    ...         flights = cache.create_region("flights")
    ...         await flights.register_interest_regex("UA-.*")
    ...         await flights.put("UA-1", {"dep_delay": 2})
    ...         async with flights.events() as events:
    ...             async for event in events:
    ...                 print(event.key, event.new_value)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Generic, TypeVar

from regionbus.clients.cache import ClientCache
from regionbus.clients.cq_query import CqAttributes, CqEvent, CqListener, CqQuery, CqResult
from regionbus.clients.function_execution import Execution, FunctionService, ResultCollector
from regionbus.clients.region import Region, RegionShortcut
from regionbus.clients.settings import ClientSettings
from regionbus.schemas.callbacks import CacheListener, EntryEvent, RegionEvent
from regionbus.schemas.functions import Function
from regionbus.schemas.messages import InterestResultPolicy
from regionbus.schemas.serializers import Serializer

T = TypeVar("T")

DEFAULT_MAX_BUFFERED: Final = 1000
"""Events a stream holds before the subscription thread waits for its consumer."""

_WAIT_SLICE_S: Final = 0.5
"""How often a waiting subscription thread looks whether its stream was closed."""

_END: Final = object()
"""Put in a stream's queue at close: the consumer waiting on it ends."""


class EventStream(Generic[T]):
    """Events handed over from the subscription thread to ``async for``, at most
    ``max_buffered`` held (see the module for the back-pressure this gives). Close it when
    done: ``async with region.events() as events: async for event in events: ...``, or
    :meth:`aclose`.

    Args:
        loop: The event loop the consumer runs on.
        max_buffered: Events held before the producing thread waits.

    Raises:
        ValueError: ``max_buffered`` is below 1.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, max_buffered: int) -> None:
        if max_buffered < 1:
            raise ValueError("max_buffered must be at least 1")
        self._loop = loop
        self._queue: asyncio.Queue[T | object] = asyncio.Queue()
        self._room = threading.Semaphore(max_buffered)
        self._closed = threading.Event()
        self._on_close: list[Callable[[], None]] = []

    def offer(self, item: T) -> None:
        """Hand one event over (on the producing thread): waits while the stream is full;
        dropped once the stream is closed."""
        while not self._room.acquire(timeout=_WAIT_SLICE_S):
            if self._closed.is_set():
                return
        if self._closed.is_set():
            return
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody will take it
            self._closed.set()

    def when_closed(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` (e.g. remove the listener feeding the stream) when it closes."""
        self._on_close.append(undo)

    def __aiter__(self) -> EventStream[T]:
        return self

    async def __anext__(self) -> T:
        if self._closed.is_set() and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is _END:
            raise StopAsyncIteration
        self._room.release()
        return item  # type: ignore[return-value]

    async def aclose(self) -> None:
        """Stop the stream: its listener is removed, a waiting producer goes on, and a
        consumer waiting in ``async for`` ends."""
        if self._closed.is_set():
            return
        self._closed.set()
        for undo in self._on_close:
            undo()
        self._queue.put_nowait(_END)

    async def __aenter__(self) -> EventStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def closed(self) -> bool:
        """True once closed."""
        return self._closed.is_set()


class _StreamListener(CacheListener):
    """Hands every region event of a region over to a stream."""

    def __init__(self, stream: EventStream[EntryEvent | RegionEvent]) -> None:
        self._stream = stream

    def after_create(self, event: EntryEvent) -> None:
        self._stream.offer(event)

    def after_update(self, event: EntryEvent) -> None:
        self._stream.offer(event)

    def after_invalidate(self, event: EntryEvent) -> None:
        self._stream.offer(event)

    def after_destroy(self, event: EntryEvent) -> None:
        self._stream.offer(event)

    def after_region_clear(self, event: RegionEvent) -> None:
        self._stream.offer(event)

    def after_region_destroy(self, event: RegionEvent) -> None:
        self._stream.offer(event)

    def after_region_invalidate(self, event: RegionEvent) -> None:
        self._stream.offer(event)

    def after_region_live(self, event: RegionEvent) -> None:
        self._stream.offer(event)


class _CqStreamListener(CqListener):
    def __init__(self, stream: EventStream[CqEvent]) -> None:
        self._stream = stream

    def on_event(self, event: CqEvent) -> None:
        self._stream.offer(event)

    def on_error(self, event: CqEvent) -> None:
        self._stream.offer(event)


class AsyncRegion:
    """A region's awaitable operations; :attr:`region` is the threaded
    :class:`regionbus.clients.region.Region` underneath (its local reads, ``keys``,
    ``contains_key``, ``local_entries``, need no await). Each method raises what the
    region's method of the same name raises."""

    def __init__(self, region: Region) -> None:
        self.region = region
        self.name = region.name

    def events(
        self, max_buffered: int = DEFAULT_MAX_BUFFERED
    ) -> EventStream[EntryEvent | RegionEvent]:
        """A stream of this region's events as its listeners get them (entry and region
        events), from now until the stream is closed."""
        stream: EventStream[EntryEvent | RegionEvent] = EventStream(
            asyncio.get_running_loop(), max_buffered
        )
        listener = _StreamListener(stream)
        # A new list, not a change of the one the subscription thread may be iterating:
        # removing from it there could skip another listener's call.
        self.region.listeners = [*self.region.listeners, listener]
        stream.when_closed(lambda: _remove(self.region, listener))
        return stream

    async def put(self, key: str, value: Any, callback_argument: bytes | None = None) -> None:
        """:meth:`Region.put`, awaited on its pipelined form."""
        await asyncio.wrap_future(self.region.put_async(key, value, callback_argument))

    async def destroy(self, key: str, callback_argument: bytes | None = None) -> None:
        """:meth:`Region.destroy`, awaited on its pipelined form."""
        await asyncio.wrap_future(self.region.destroy_async(key, callback_argument))

    async def get(self, key: str) -> Any:
        """:meth:`Region.get`."""
        return await asyncio.to_thread(self.region.get, key)

    async def get_all(self, keys: list[str] | tuple[str, ...]) -> dict[str, Any]:
        """:meth:`Region.get_all`."""
        return await asyncio.to_thread(self.region.get_all, keys)

    async def put_all(self, entries: Mapping[str, Any]) -> None:
        """:meth:`Region.put_all`."""
        await asyncio.to_thread(self.region.put_all, entries)

    async def remove_all(self, keys: Iterable[str]) -> None:
        """:meth:`Region.remove_all`."""
        await asyncio.to_thread(self.region.remove_all, list(keys))

    async def create(self, key: str, value: Any) -> None:
        """:meth:`Region.create`."""
        await asyncio.to_thread(self.region.create, key, value)

    async def put_if_absent(self, key: str, value: Any) -> Any:
        """:meth:`Region.put_if_absent`."""
        return await asyncio.to_thread(self.region.put_if_absent, key, value)

    async def replace(self, key: str, *values: Any) -> Any:
        """:meth:`Region.replace`: ``(key, value)`` or ``(key, old_value, new_value)``."""
        return await asyncio.to_thread(self.region.replace, key, *values)

    async def remove(self, key: str, value: Any) -> bool:
        """:meth:`Region.remove`."""
        return await asyncio.to_thread(self.region.remove, key, value)

    async def contains_key_on_server(self, key: str) -> bool:
        """:meth:`Region.contains_key_on_server`."""
        return await asyncio.to_thread(self.region.contains_key_on_server, key)

    async def size_on_server(self) -> int:
        """:meth:`Region.size_on_server`."""
        return await asyncio.to_thread(self.region.size_on_server)

    async def query(self, predicate: str, *params: Any) -> list[Any]:
        """:meth:`Region.query`."""
        return await asyncio.to_thread(self.region.query, predicate, *params)

    async def exists_value(self, predicate: str, *params: Any) -> bool:
        """:meth:`Region.exists_value`."""
        return await asyncio.to_thread(self.region.exists_value, predicate, *params)

    async def select_value(self, predicate: str, *params: Any) -> Any:
        """:meth:`Region.select_value`."""
        return await asyncio.to_thread(self.region.select_value, predicate, *params)

    async def keys_on_server(self) -> list[str]:
        """:meth:`Region.keys_on_server`."""
        return await asyncio.to_thread(self.region.keys_on_server)

    async def register_interest(
        self,
        keys: Any,
        policy: InterestResultPolicy = InterestResultPolicy.KEYS_VALUES,
        *,
        durable: bool = False,
        receive_values: bool = True,
    ) -> None:
        """:meth:`Region.register_interest`."""
        await asyncio.to_thread(
            self.region.register_interest,
            keys,
            policy,
            durable=durable,
            receive_values=receive_values,
        )

    async def register_interest_regex(
        self,
        regex: str,
        policy: InterestResultPolicy = InterestResultPolicy.KEYS_VALUES,
        *,
        durable: bool = False,
        receive_values: bool = True,
    ) -> None:
        """:meth:`Region.register_interest_regex`."""
        await asyncio.to_thread(
            self.region.register_interest_regex,
            regex,
            policy,
            durable=durable,
            receive_values=receive_values,
        )

    async def clear(self) -> None:
        """:meth:`Region.clear`."""
        await asyncio.to_thread(self.region.clear)


class AsyncCq:
    """A continuous query made through :meth:`AsyncClientCache.new_cq`: its events stream
    through :meth:`events`; :attr:`cq` is the threaded
    :class:`regionbus.clients.cq_query.CqQuery` underneath."""

    def __init__(self, cq: CqQuery, stream: EventStream[CqEvent]) -> None:
        self.cq = cq
        self.name = cq.name
        self._stream = stream

    def events(self) -> EventStream[CqEvent]:
        """The stream of this CQ's events (its one stream, made with the CQ)."""
        return self._stream

    async def execute(self) -> None:
        """:meth:`CqQuery.execute`."""
        await asyncio.to_thread(self.cq.execute)

    async def execute_with_initial_results(self) -> list[CqResult]:
        """:meth:`CqQuery.execute_with_initial_results`."""
        return await asyncio.to_thread(self.cq.execute_with_initial_results)

    async def stop(self) -> None:
        """:meth:`CqQuery.stop`."""
        await asyncio.to_thread(self.cq.stop)

    async def close(self) -> None:
        """:meth:`CqQuery.close`; its stream ends."""
        await asyncio.to_thread(self.cq.close)
        await self._stream.aclose()


class AsyncClientCache:
    """An asyncio client cache. Make it with ``await AsyncClientCache.connect(...)``;
    :attr:`cache` is the threaded :class:`regionbus.clients.cache.ClientCache` underneath.
    """

    def __init__(self, cache: ClientCache) -> None:
        self.cache = cache

    @classmethod
    async def connect(
        cls, settings: ClientSettings | None = None, **overrides: Any
    ) -> AsyncClientCache:
        """Connect, as ``ClientCache(settings, **overrides)`` does, off the event loop.

        Raises:
            What :class:`ClientCache` raises.
        """
        return cls(await asyncio.to_thread(ClientCache, settings, **overrides))

    def create_region(
        self,
        name: str,
        shortcut: RegionShortcut = RegionShortcut.CACHING_PROXY,
        *,
        listeners: Iterable[CacheListener] = (),
        serializer: Serializer | None = None,
    ) -> AsyncRegion:
        """:meth:`ClientCache.create_region` (local: nothing to await)."""
        return AsyncRegion(
            self.cache.create_region(name, shortcut, listeners=listeners, serializer=serializer)
        )

    async def new_cq(
        self,
        name: str | None,
        query: str,
        *,
        durable: bool = False,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
    ) -> AsyncCq:
        """A continuous query whose events stream (``QueryService.new_cq``); execute it
        to start.

        Raises:
            What ``QueryService.new_cq`` raises.
        """
        stream: EventStream[CqEvent] = EventStream(asyncio.get_running_loop(), max_buffered)
        attributes = CqAttributes([_CqStreamListener(stream)])
        cq = await asyncio.to_thread(
            self.cache.query_service().new_cq, name, query, attributes, durable
        )
        return AsyncCq(cq, stream)

    async def query(self, oql: str, *params: Any) -> list[Any]:
        """Run a one-shot OQL query off the event loop:
        ``cache.query_service().new_query(oql).execute(*params)``.

        Raises:
            What :meth:`regionbus.clients.query_service.QueryService.new_query` and
            :meth:`regionbus.clients.oql_query.Query.execute` raise.
        """
        query = self.cache.query_service().new_query(oql)
        return await asyncio.to_thread(query.execute, *params)

    async def ready_for_events(self) -> None:
        """:meth:`ClientCache.ready_for_events`."""
        await asyncio.to_thread(self.cache.ready_for_events)

    async def close(self, keep_alive: bool = False) -> None:
        """:meth:`ClientCache.close`, off the event loop."""
        await asyncio.to_thread(self.cache.close, keep_alive)

    async def __aenter__(self) -> AsyncClientCache:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncExecution:
    """A function execution being built, awaited when executed (Geode ``Execution``): each
    ``with_``/``set_`` method returns a new one, as the threaded
    :class:`regionbus.clients.function_execution.Execution` underneath (:attr:`execution`)
    does. Make it with :class:`AsyncFunctionService`."""

    def __init__(self, execution: Execution) -> None:
        self.execution = execution

    def with_filter(self, keys: Iterable[str]) -> AsyncExecution:
        """:meth:`Execution.with_filter` (Geode ``withFilter``); raises what it raises."""
        return AsyncExecution(self.execution.with_filter(keys))

    def set_arguments(self, arguments: Any) -> AsyncExecution:
        """:meth:`Execution.set_arguments` (Geode ``setArguments``)."""
        return AsyncExecution(self.execution.set_arguments(arguments))

    def with_collector(self, collector: ResultCollector) -> AsyncExecution:
        """:meth:`Execution.with_collector` (Geode ``withCollector``)."""
        return AsyncExecution(self.execution.with_collector(collector))

    async def execute(self, function: str | Function) -> ResultCollector:
        """Run a function registered on the servers, off the event loop, and return its
        collector once every result came (:meth:`Execution.execute`; Geode
        ``Execution.execute``). The wait, and an ``is_ha`` function's re-executions, run
        on a worker thread: cancelling the awaiting task does not stop the execution.

        Args:
            function: Its id, or a ``Function`` whose id and attributes are used.

        Returns:
            The collector, ended: its ``get_result()`` answers at once.

        Raises:
            What :meth:`Execution.execute` raises (``FunctionError``,
            ``FunctionNotRegisteredError``, ``FunctionTimeoutError``,
            ``FunctionInvocationTargetError``, ``ServerTimeoutError``, ...).
        """
        return await asyncio.to_thread(self.execution.execute, function)


class AsyncFunctionService:
    """Where awaitable function executions start (Geode ``FunctionService``; the threaded
    :class:`regionbus.clients.function_execution.FunctionService` underneath)."""

    @staticmethod
    def on_region(region: AsyncRegion) -> AsyncExecution:
        """An execution on a region's buckets (Geode ``onRegion``): every bucket's primary
        runs the function once, or with ``with_filter`` only the filter's buckets'."""
        return AsyncExecution(FunctionService.on_region(region.region))

    @staticmethod
    def on_servers(cache: AsyncClientCache) -> AsyncExecution:
        """An execution on the servers (Geode ``onServers``): each server that is primary
        of a bucket runs the function once."""
        return AsyncExecution(FunctionService.on_servers(cache.cache))


def _remove(region: Region, listener: CacheListener) -> None:
    region.listeners = [other for other in region.listeners if other is not listener]


__all__ = [
    "DEFAULT_MAX_BUFFERED",
    "AsyncClientCache",
    "AsyncCq",
    "AsyncExecution",
    "AsyncFunctionService",
    "AsyncRegion",
    "EventStream",
]
