"""Function execution from a client (Geode ``FunctionService``, ``Execution``,
``ResultCollector``; the client half of ``ExecuteRegionFunctionOp`` and
``ExecuteFunctionOp``).

``FunctionService.on_region(region)`` runs a function registered on the servers on the
primary of each bucket of the region, or with ``with_filter(keys)`` of the filter's
buckets only (each execution is given the filter's keys in its bucket);
``FunctionService.on_servers(cache)`` runs it once on each server
(`regionbus.broker.functions`). ``execute`` blocks until every bucket answered, as a
Geode client's does, and returns the collector holding the results.

High availability (Geode ``Function.isHA``, ``ExecuteRegionFunctionOp.execute``): the
buckets whose server stopped, lost the bucket or did not answer within
``read_timeout_ms`` are executed again, ``is_possible_duplicate``, up to
``retry_attempts`` times; the results of each bucket reach the collector once, from the
execution that answered it whole. A function that is not ``is_ha`` is never executed
again: its caller gets the failure.
"""

from __future__ import annotations

import secrets
import threading
import weakref
from collections.abc import Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Final

from regionbus.clients.server_proxy import CacheConnection, ServerRegionProxy
from regionbus.schemas.entry_checks import check_key
from regionbus.schemas.errors import (
    FunctionError,
    FunctionInvocationTargetError,
    FunctionTimeoutError,
    RegionBusError,
    ServerTimeoutError,
    ValueTooLargeError,
    error_from_wire,
)
from regionbus.schemas.functions import (
    Function,
    FunctionAttributes,
    check_function_id,
    result_value,
)
from regionbus.schemas.limits import MAX_FUNCTION_FILTER_KEYS, check_count
from regionbus.schemas.messages import Entry, FunctionSpec, OperationKind, Reply
from regionbus.schemas.naming import bucket_of
from regionbus.schemas.serializers import plain_bytes

_REPLY_GRACE_S: Final = 5.0
"""Beyond ``read_timeout_ms``, how long a wait for a bucket's answer lasts (the pool fails
an unanswered request at ``read_timeout_ms`` itself; this only guards against a lost
callback)."""

_ATTRIBUTES: weakref.WeakKeyDictionary[object, dict[str, FunctionAttributes]] = (
    weakref.WeakKeyDictionary()
)
"""The attributes of the functions each pool asked the servers for (Geode's pool keeps
them too, ``GetFunctionAttributeOp``)."""
_ATTRIBUTES_LOCK: Final = threading.Lock()


class ResultCollector:
    """Gathers the results of one execution (Geode ``ResultCollector``): subclass it to
    aggregate them as they come. ``execute`` calls :meth:`add_result` for each result, in
    bucket order and each bucket's results in the order its function sent them, then
    :meth:`end_results`, on the calling thread."""

    def add_result(self, member_id: str, result: Any) -> None:
        """Take one result (Geode ``addResult``).

        Args:
            member_id: The member id of the server that sent it (Geode's
                ``DistributedMember``).
            result: The result; a ``FunctionError`` for an exception the function sent
                with ``send_exception``.
        """
        raise NotImplementedError

    def end_results(self) -> None:
        """Every result was added (Geode ``endResults``)."""

    def clear_results(self) -> None:
        """Forget the results added so far (Geode ``clearResults``, called before a
        re-execution; here the results of a bucket are added once it answered whole, so
        ``execute`` never needs it)."""

    def get_result(self, timeout_ms: int | None = None) -> Any:
        """The execution's result (Geode ``getResult``).

        Args:
            timeout_ms: Longest wait for :meth:`end_results`; None waits as long as it takes.

        Raises:
            FunctionTimeoutError: not every result came within ``timeout_ms``.
        """
        raise NotImplementedError


class DefaultResultCollector(ResultCollector):
    """Collects the results in a list (Geode ``DefaultResultCollector``); thread-safe."""

    def __init__(self) -> None:
        self._results: list[Any] = []
        self._lock = threading.Lock()
        self._ended = threading.Event()

    def add_result(self, member_id: str, result: Any) -> None:
        with self._lock:
            self._results.append(result)

    def end_results(self) -> None:
        self._ended.set()

    def clear_results(self) -> None:
        with self._lock:
            self._results.clear()

    def get_result(self, timeout_ms: int | None = None) -> list[Any]:
        """The results, in the order they were added.

        Raises:
            FunctionTimeoutError: not every result came within ``timeout_ms`` (Geode: "All
                results not received in time provided").
        """
        if not self._ended.wait(None if timeout_ms is None else timeout_ms / 1000):
            raise FunctionTimeoutError("All results not received in time provided")
        with self._lock:
            return list(self._results)


class _NoResult(ResultCollector):
    """The collector of a function without results (Geode ``NoResult``)."""

    def __init__(self, function_id: str) -> None:
        self._function_id = function_id

    def add_result(self, member_id: str, result: Any) -> None:
        return

    def get_result(self, timeout_ms: int | None = None) -> Any:
        raise FunctionError(
            f"Cannot return any result as the Function#hasResult() is false "
            f"(function {self._function_id!r})"
        )


class Execution:
    """A function execution being built (Geode ``Execution``): each ``with_``/``set_``
    method returns a new one. Make it with :class:`FunctionService`.

    Args:
        cache: The client cache (its pool).
        region: The region, for ``on_region``; None for ``on_servers``.
        filter_keys: The filter (``on_region`` only).
        arguments: The arguments (encoded when executed).
        collector: The collector the results go to; None for a new
            :class:`DefaultResultCollector` each execution.
    """

    def __init__(
        self,
        cache: CacheConnection,
        region: str | None,
        filter_keys: tuple[str, ...] = (),
        arguments: Any = None,
        collector: ResultCollector | None = None,
    ) -> None:
        self._cache = cache
        self._region = region
        self._filter = filter_keys
        self._arguments = arguments
        self._collector = collector

    def with_filter(self, keys: Iterable[str]) -> Execution:
        """Run only on the buckets of these keys, each execution given its bucket's keys
        (Geode ``withFilter``); an empty filter is none.

        Raises:
            FunctionError: on ``on_servers`` (Geode: "Cannot specify filter for data
                independent functions").
            InvalidKeyError: a key is not a valid key.
            RequestLimitError: more than
                `regionbus.schemas.limits.MAX_FUNCTION_FILTER_KEYS` keys.
        """
        if self._region is None:
            raise FunctionError("Cannot specify filter for data independent functions")
        unique = tuple(dict.fromkeys(check_key(key) for key in keys))
        check_count("keys in a function filter", len(unique), MAX_FUNCTION_FILTER_KEYS)
        return Execution(self._cache, self._region, unique, self._arguments, self._collector)

    def set_arguments(self, arguments: Any) -> Execution:
        """Hand these arguments to the function (Geode ``setArguments``): ``bytes`` as they
        are, anything else as JSON; the function reads them decoded from
        ``context.arguments``."""
        return Execution(self._cache, self._region, self._filter, arguments, self._collector)

    def with_collector(self, collector: ResultCollector) -> Execution:
        """Gather the results in this collector (Geode ``withCollector``)."""
        return Execution(self._cache, self._region, self._filter, self._arguments, collector)

    def execute(self, function: str | Function) -> ResultCollector:
        """Run a function registered on the servers and wait for every result (Geode
        ``Execution.execute``; a client's blocks until all results came).

        Args:
            function: Its id, or a ``Function`` whose id and attributes are used (its code
                runs on the servers, as registered there; none travels).

        Returns:
            The collector, ended; for a function without results one whose
            ``get_result`` raises ``FunctionError`` (returned once the executions were
            sent, not run).

        Raises:
            FunctionNotRegisteredError: no function of that id is registered on the server
                asked.
            FunctionError: the function raised on a server (the message names the
                exception), did not send its last result, or sent more than the servers'
                ``function_max_result_bytes``; a result does not decode here; or the
                function is ``is_ha`` without ``has_result``.
            FunctionTimeoutError: an execution ran longer than the servers'
                ``function_timeout_ms``.
            FunctionInvocationTargetError: a server stopped or lost the bucket while it
                ran the function, and the function is not ``is_ha`` or was executed
                ``retry_attempts`` times more.
            ServerTimeoutError: a bucket did not answer within ``read_timeout_ms``, as
                above.
            RequestLimitError: a server had ``max_pending_functions`` executions pending.
            ValueTooLargeError: the encoded arguments are over the servers'
                ``max_value_size_bytes``.
            SerializationError: the arguments are neither bytes nor JSON-serializable.
            UnconnectedError, TransportError: the request could not be sent.
        """
        function_id, attributes = self._attributes_of(function)
        data, serializer = (None, None)
        if self._arguments is not None:
            data, serializer = plain_bytes(self._arguments)
            if len(data) > self._cache.max_value_size_bytes:
                raise ValueTooLargeError(
                    f"function arguments of {len(data)} bytes exceed the servers' "
                    f"max_value_size_bytes={self._cache.max_value_size_bytes}"
                )
        spec = FunctionSpec(function_id, secrets.randbits(62), data, serializer)
        targets = self._targets()
        if not attributes.has_result:
            self._send(spec, targets)  # Geode's no-ack execution: nothing is awaited
            return _NoResult(function_id)
        results = self._run(spec, targets, attributes)
        collector = self._collector or DefaultResultCollector()
        for bucket in sorted(results):
            for entry in results[bucket]:
                collector.add_result(entry.key, _decoded(entry))
        collector.end_results()
        return collector

    def _attributes_of(self, function: str | Function) -> tuple[str, FunctionAttributes]:
        if isinstance(function, Function):
            return check_function_id(function.id), FunctionAttributes.of(function)
        function_id = check_function_id(function)
        pool = self._cache.pool
        with _ATTRIBUTES_LOCK:
            known = _ATTRIBUTES.setdefault(pool, {}).get(function_id)
        if known is not None:
            return function_id, known
        proxy = ServerRegionProxy(self._cache, "", "")
        op = proxy.operation(
            OperationKind.GET_FUNCTION_ATTRIBUTES, function=FunctionSpec(function_id)
        )
        attributes = FunctionAttributes.from_state(proxy.one(op, 0).function_state)
        with _ATTRIBUTES_LOCK:
            _ATTRIBUTES.setdefault(pool, {})[function_id] = attributes
        return function_id, attributes

    def _targets(self) -> dict[int, tuple[str, ...]]:
        """The buckets to run on, each with its keys of the filter."""
        total = self._cache.total_buckets
        if self._region is None or not self._filter:
            return {bucket: () for bucket in range(total)}
        targets: dict[int, list[str]] = {}
        for key in self._filter:
            targets.setdefault(bucket_of(self._region, key, total), []).append(key)
        return {bucket: tuple(keys) for bucket, keys in targets.items()}

    def _send(
        self, spec: FunctionSpec, targets: dict[int, tuple[str, ...]]
    ) -> list[tuple[int, Future[list[Reply]]]]:
        """Send one execution per target bucket, each its own request."""
        if self._region is None:
            proxy, kind = ServerRegionProxy(self._cache, "", ""), OperationKind.EXECUTE_FUNCTION
        else:
            kind = OperationKind.EXECUTE_REGION_FUNCTION
            proxy = ServerRegionProxy(self._cache, self._region, "")
        ops = [
            (proxy.operation(kind, function=spec._replace(filter=keys)), bucket)
            for bucket, keys in targets.items()
        ]
        futures = self._cache.pool.request_each(ops)
        return [(bucket, future) for (_, bucket), future in zip(ops, futures, strict=True)]

    def _run(
        self,
        spec: FunctionSpec,
        targets: dict[int, tuple[str, ...]],
        attributes: FunctionAttributes,
    ) -> dict[int, list[Entry]]:
        """Execute on every target bucket, again on those that failed while an ``is_ha``
        function has re-executions left; each bucket's results, from one execution."""
        retries = self._cache.settings.retry_attempts if attributes.is_ha else 0
        results: dict[int, list[Entry]] = {}
        pending = targets
        while True:
            failed: dict[int, RegionBusError] = {}
            for bucket, outcome in self._answers(self._send(spec, pending)):
                if isinstance(outcome, RegionBusError):
                    failed[bucket] = outcome
                else:
                    results[bucket] = outcome
            if not failed:
                return results
            errors = list(failed.values())
            fatal = next((e for e in errors if not _re_executable(e)), None)
            if fatal is not None or retries <= 0:
                raise fatal or errors[0]
            retries -= 1
            pending = {bucket: targets[bucket] for bucket in sorted(failed)}
            spec = spec._replace(re_execute=True)

    def _answers(
        self, sent: list[tuple[int, Future[list[Reply]]]]
    ) -> list[tuple[int, list[Entry] | RegionBusError]]:
        """Each bucket's results, or the error it answered (its own, or a timeout)."""
        wait_s = self._cache.settings.read_timeout_ms / 1000 + _REPLY_GRACE_S
        answers: list[tuple[int, list[Entry] | RegionBusError]] = []
        for bucket, future in sent:
            try:
                replies = future.result(wait_s)
            except FutureTimeout:
                answers.append((bucket, ServerTimeoutError(f"no answer from bucket {bucket}")))
                continue
            except RegionBusError as exc:
                answers.append((bucket, exc))
                continue
            failure = next((r for r in replies if not r.ok), None)
            if failure is not None:
                answers.append((bucket, error_from_wire(failure.error_type, failure.error_message)))
            else:
                answers.append((bucket, [e for r in replies for e in r.entries]))
        return answers


def _re_executable(error: RegionBusError) -> bool:
    """Whether an execution that failed so may be executed again (an ``is_ha`` one)."""
    return isinstance(error, FunctionInvocationTargetError | ServerTimeoutError)


def _decoded(entry: Entry) -> Any:
    try:
        return result_value(entry)
    except RegionBusError as exc:
        raise FunctionError(f"a result from {entry.key} does not decode here: {exc}") from None


class FunctionService:
    """Where function executions start (Geode ``FunctionService``)."""

    @staticmethod
    def on_region(region: Any) -> Execution:
        """An execution on a region's buckets (Geode ``onRegion``): every bucket's
        primary runs the function once for its bucket, or with ``with_filter`` only the
        filter's buckets' primaries do.

        Args:
            region: A region of a client cache
                (:class:`regionbus.clients.region.Region`).
        """
        return Execution(region.region_service, region.name)

    @staticmethod
    def on_servers(cache: CacheConnection) -> Execution:
        """An execution on the servers (Geode ``onServers``): each server that is primary
        of a bucket runs the function once, with a ``FunctionContext`` (no region).

        Args:
            cache: A client cache.
        """
        return Execution(cache, None)


__all__ = [
    "DefaultResultCollector",
    "Execution",
    "FunctionService",
    "ResultCollector",
]
