"""Function execution on a cache server (Geode ``FunctionService``, the server half of
``ExecuteRegionFunction`` and ``ExecuteFunction``).

The functions are registered by id at start (the ``functions`` setting, or
``CacheServer(functions=[...])``; Geode ``FunctionService.registerFunction``). A client
asks a function's attributes once (``GET_FUNCTION_ATTRIBUTES``), then sends:

- ``EXECUTE_REGION_FUNCTION`` to each bucket of the region (of the filter's keys, with a
  filter): the bucket's primary runs the function once, for that bucket, with a
  ``RegionFunctionContext`` (the filter's keys in the bucket, the region, the bucket's
  entries through ``PartitionRegionHelper.get_local_data_for_context``);
- ``EXECUTE_FUNCTION`` (``on_servers``) to every bucket: a server runs it at the first
  copy of the execution it reads and answers the other copies empty, so it runs once per
  server that is primary of a bucket.

No client is trusted and the function is the application's code, so an execution never
runs on the loop that serves every client: it runs on one of ``function_threads`` worker
threads, at most ``max_pending_functions`` running or waiting on a server (one more is
refused with ``RequestLimitError`` at once). The loop answers it once it returned and every
change it made is in its bucket's log (`regionbus.broker.function_region`): the results
sent through its ``ResultSender`` (at most ``function_max_result_bytes``) in messages of
``reply_chunk_bytes``, or the error that ended it (``FunctionError`` naming the
exception; ``FunctionNotRegisteredError`` for an unknown id). One still running after
``function_timeout_ms`` is answered ``FunctionTimeoutError``; its thread runs on until the
function returns (a thread cannot be stopped), and its region calls fail from then on.

High availability (Geode ``Function.isHA``): an execution whose server stops, or whose
bucket moves to another primary, before it is answered is answered
``FunctionInvocationTargetError``; the client executes an ``is_ha`` function again there
(``is_possible_duplicate``), and a bucket's results reach its collector from one execution
only. A server that dies answers nothing: the client's ``read_timeout_ms`` ends the wait,
and an ``is_ha`` function is executed again then too.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from confluent_kafka import KafkaError
from confluent_kafka import Message as KafkaMessage

from regionbus.broker.config import ServerSettings
from regionbus.broker.cq_registry import CqTable
from regionbus.broker.function_region import Change, ExecutionAccess, PendingChanges
from regionbus.broker.initial_results import reply_entries
from regionbus.broker.loading import produce_operation
from regionbus.broker.outbox import Outbox
from regionbus.broker.ownership import BucketOwnership
from regionbus.broker.security import SecurityGuard
from regionbus.broker.store import RegionStore
from regionbus.runtime.leases import wall_clock_ms
from regionbus.schemas.addressing import ClientAddress
from regionbus.schemas.errors import (
    ConfigurationError,
    FunctionError,
    FunctionInvocationTargetError,
    FunctionNotRegisteredError,
    FunctionTimeoutError,
    RegionBusError,
    RequestLimitError,
)
from regionbus.schemas.eventid import EventID
from regionbus.schemas.functions import (
    Function,
    FunctionAttributes,
    FunctionContext,
    RegionFunctionContext,
    ResultSender,
    ServerCache,
    ServerRegion,
    check_function_id,
    plain_value,
)
from regionbus.schemas.hooks import load_hook
from regionbus.schemas.messages import Operation, OperationKind, Reply

log = logging.getLogger("regionbus.server.functions")

EXECUTIONS_REMEMBERED: Final = 10_000
"""``on_servers`` executions a server remembers having run (the copies of one execution
reach it within moments of each other; an older one is forgotten first)."""


def registered_functions(
    names: Iterable[str], functions: Iterable[Function]
) -> dict[str, Function]:
    """The functions of a server by id: those named (``"package.module:ClassName"``, the
    ``functions`` setting), then those given.

    Raises:
        ConfigurationError: a name does not import or is not a ``Function``, an id is not
            a valid id, two functions have one id, or one is ``is_ha`` without
            ``has_result``.
    """
    registered: dict[str, Function] = {}
    for function in [load_hook(name, Function) for name in names] + list(functions):
        try:
            function_id = check_function_id(function.id)
            FunctionAttributes.of(function)
        except RegionBusError as exc:
            raise ConfigurationError(f"function {function!r}: {exc}") from None
        if function_id in registered:
            raise ConfigurationError(f"two functions have the id {function_id!r}")
        registered[function_id] = function
    return registered


@dataclass
class _Execution:
    """One execution running (or waiting for a thread), and what its answer needs."""

    op: Operation
    bucket: int
    function: Function
    attributes: FunctionAttributes
    sender: ResultSender
    changes: PendingChanges
    deadline_s: float
    future: Future[None]

    @property
    def on_region(self) -> bool:
        return self.op.kind is OperationKind.EXECUTE_REGION_FUNCTION

    @property
    def done(self) -> bool:
        """It returned and every change it made has its delivery report."""
        return self.future.done() and self.changes.settled


class FunctionExecutions:
    """The function executions of this server's buckets.

    Args:
        settings: ``function_threads``, ``function_timeout_ms``, ``max_pending_functions``,
            ``function_max_result_bytes``, ``reply_chunk_bytes``, ``member_id``.
        functions: The registered functions by id.
        store: The region store (the functions' reads).
        values: Decodes stored values for the functions.
        ownership: The buckets held.
        outbox: Replies, and the functions' changes.
        security: Signs the functions' changes when security is on.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        settings: ServerSettings,
        functions: Mapping[str, Function],
        store: RegionStore,
        values: CqTable,
        ownership: BucketOwnership,
        outbox: Outbox,
        security: SecurityGuard | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._functions = dict(functions)
        self._store = store
        self._values = values
        self._ownership = ownership
        self._outbox = outbox
        self._security = security
        self._clock = clock
        self._executor: ThreadPoolExecutor | None = None
        self._running: list[_Execution] = []
        self._abandoned: list[_Execution] = []
        """Answered (timed out, moved, stopped) but still running or delivering changes:
        their changes already queued are still produced."""
        self._ran: OrderedDict[tuple[str, int], None] = OrderedDict()
        """The ``on_servers`` executions this server ran, oldest first."""
        # The EventIDs of the functions' changes: this server's member id, a thread of its
        # own per process (a restarted server starts a new sequence), one sequence for all.
        self._thread = secrets.randbits(31) + 1
        self._sequence = 0

    def __len__(self) -> int:
        return len(self._running)

    # --- handlers ----------------------------------------------------------------------

    def attributes(self, op: Operation, bucket: int, offset: int) -> None:
        """Answer a function's attributes (Geode ``GetFunctionAttribute``) in
        ``Reply.function_state``.

        Raises:
            FunctionNotRegisteredError: no function has the id here.
        """
        function = self._registered(op)
        state = FunctionAttributes.of(function).state
        reply = Reply(request_id=op.request_id, bucket=bucket, ok=True, found=True)
        self._outbox.reply(reply._replace(function_state=state), ClientAddress.of(op))

    def execute(self, op: Operation, bucket: int, offset: int) -> None:
        """Start one bucket's (or this server's) execution of a function on a worker
        thread; :meth:`poll` answers it.

        Raises:
            FunctionNotRegisteredError: no function has the id here.
            RequestLimitError: ``max_pending_functions`` are running or waiting already.
            FunctionError: the arguments do not decode.
            TransportError: Redis failed.
        """
        if not self._ownership.still_primary(bucket):
            return  # the bucket's new primary reads it
        spec = op.function
        assert spec is not None
        function = self._registered(op)
        attributes = FunctionAttributes.of(function)
        if op.kind is OperationKind.EXECUTE_FUNCTION and not self._first_copy(op):
            self._answer(op, bucket, [])  # it ran at another copy of the execution here
            return
        if len(self._running) >= self._settings.max_pending_functions:
            raise RequestLimitError(
                f"{len(self._running)} function executions pending on this server already "
                f"(max_pending_functions); try again later",
                limit_name="function executions pending on a server",
                limit=self._settings.max_pending_functions,
                requested=len(self._running) + 1,
            )
        try:
            arguments = plain_value(spec.arguments, spec.arguments_serializer)
        except RegionBusError as exc:
            raise FunctionError(f"the arguments of {spec.function_id!r}: {exc}") from None
        deadline_s = self._clock() + self._settings.function_timeout_ms / 1000
        changes = PendingChanges(deadline_s, self._clock)
        sender = ResultSender(
            spec.function_id,
            self._settings.member_id,
            attributes.has_result,
            self._settings.function_max_result_bytes,
        )
        context = self._context(op, bucket, arguments, sender, changes, deadline_s)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                self._settings.function_threads, thread_name_prefix="function"
            )
        future = self._executor.submit(function.execute, context)
        self._running.append(
            _Execution(op, bucket, function, attributes, sender, changes, deadline_s, future)
        )

    def _context(
        self,
        op: Operation,
        bucket: int,
        arguments: Any,
        sender: ResultSender,
        changes: PendingChanges,
        deadline_s: float,
    ) -> FunctionContext:
        spec = op.function
        assert spec is not None
        access = ExecutionAccess(
            self._store,
            self._values,
            changes,
            deadline_s,
            self._settings.total_buckets,
            self._settings.max_value_size_bytes,
            self._clock,
        )
        context = FunctionContext(
            spec.function_id,
            arguments,
            sender,
            spec.re_execute,
            self._settings.member_id,
            ServerCache(access),
        )
        if op.kind is OperationKind.EXECUTE_FUNCTION:
            return context
        region = ServerRegion(op.region, access)
        return RegionFunctionContext(context, region, frozenset(spec.filter), bucket)

    def _registered(self, op: Operation) -> Function:
        assert op.function is not None
        function = self._functions.get(op.function.function_id)
        if function is None:
            raise FunctionNotRegisteredError(
                f"Function named {op.function.function_id!r} is not registered to "
                f"FunctionService on server {self._settings.member_id}"
            )
        return function

    def _first_copy(self, op: Operation) -> bool:
        """Whether this is the first copy of an ``on_servers`` execution this server reads
        (and remember it)."""
        assert op.function is not None
        execution = (op.client_id, op.function.execution_id)
        if execution in self._ran:
            return False
        self._ran[execution] = None
        while len(self._ran) > EXECUTIONS_REMEMBERED:
            self._ran.popitem(last=False)
        return True

    # --- the loop's turns --------------------------------------------------------------

    def poll(self) -> bool:
        """At each turn of the loop: produce the changes the functions made, answer the
        executions done, past their ``function_timeout_ms``, or whose bucket moved.

        Returns:
            Whether anything was produced or answered (the caller sends it).
        """
        worked = self._produce_changes()
        if not self._running:
            return worked
        now = self._clock()
        owned = self._ownership.owned
        still: list[_Execution] = []
        for execution in self._running:
            if execution.done:
                self._finish(execution)
            elif now >= execution.deadline_s:
                self._give_up(
                    execution,
                    FunctionTimeoutError(
                        f"function {execution.function.id!r} ran longer than "
                        f"function_timeout_ms={self._settings.function_timeout_ms} on "
                        f"server {self._settings.member_id}"
                    ),
                )
            elif execution.on_region and execution.bucket not in owned:
                self._give_up(
                    execution,
                    FunctionInvocationTargetError(
                        f"bucket {execution.bucket} moved from server "
                        f"{self._settings.member_id} while function "
                        f"{execution.function.id!r} ran on it"
                    ),
                )
            else:
                still.append(execution)
                continue
            worked = True
        self._running = still
        return worked

    def _produce_changes(self) -> bool:
        produced = False
        self._abandoned = [e for e in self._abandoned if not e.done]
        for execution in (*self._running, *self._abandoned):
            for change in execution.changes.take():
                self._produce(change, execution.changes)
                produced = True
        return produced

    def _produce(self, change: Change, changes: PendingChanges) -> None:
        op = Operation(
            request_id=0,
            client_id=self._settings.member_id,
            kind=change.kind,
            region=change.region,
            timestamp_ms=wall_clock_ms(),
            event_id=EventID(self._settings.member_id, self._thread, self._sequence, change.bucket),
            key=change.key,
            value=change.value,
            serializer=change.serializer,
            callback_argument=change.callback_argument,
        )
        self._sequence += 1
        produce_operation(
            self._outbox, self._security, op, change.bucket, partial(_reported, changes)
        )

    def _finish(self, execution: _Execution) -> None:
        """Answer an execution that returned: its results, or why it failed."""
        op, bucket = execution.op, execution.bucket
        error = execution.future.exception()
        if error is not None:
            self._outbox.reply_error(op, bucket, _function_error(execution, error))
        elif execution.changes.failure is not None:
            self._outbox.reply_error(
                op,
                bucket,
                FunctionError(
                    f"a change function {execution.function.id!r} made was not delivered: "
                    f"{execution.changes.failure}"
                ),
            )
        elif execution.attributes.has_result and not execution.sender.last_sent:
            self._outbox.reply_error(
                op,
                bucket,
                FunctionError(f"The function, {execution.function.id}, did not send last result"),
            )
        else:
            self._answer(op, bucket, execution.sender.results())

    def _answer(self, op: Operation, bucket: int, results: list[Any]) -> None:
        send = partial(self._outbox.reply, to=ClientAddress.of(op))
        reply_entries(send, self._settings.reply_chunk_bytes, op, bucket, results)

    def _give_up(self, execution: _Execution, error: FunctionError) -> None:
        """Answer an execution before it is done; its changes queued are still produced."""
        self._outbox.reply_error(execution.op, execution.bucket, error)
        self._abandoned.append(execution)

    def close(self) -> None:
        """The server stops: every execution running is answered
        ``FunctionInvocationTargetError`` (an ``is_ha`` one is executed again elsewhere;
        Geode's ``CacheClosedException``); threads still running are left to end."""
        for execution in self._running:
            self._outbox.reply_error(
                execution.op,
                execution.bucket,
                FunctionInvocationTargetError(
                    f"server {self._settings.member_id} stopped while function "
                    f"{execution.function.id!r} ran on it"
                ),
            )
        self._running = []
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


def _reported(changes: PendingChanges, error: KafkaError | None, _message: KafkaMessage) -> None:
    changes.delivered(None if error is None else str(error))


def _function_error(execution: _Execution, error: BaseException) -> RegionBusError:
    """What an execution's caller hears of the exception that ended it: a function error
    as it is, anything else in a ``FunctionError`` naming it (Geode wraps the cause in a
    ``FunctionException``)."""
    if isinstance(error, FunctionError):
        return error
    if not isinstance(error, RegionBusError):
        log.warning("function %s raised %r", execution.function.id, error)
    return FunctionError(
        f"function {execution.function.id!r} raised {type(error).__name__}: {error}"
    )


__all__ = ["EXECUTIONS_REMEMBERED", "FunctionExecutions", "registered_functions"]
