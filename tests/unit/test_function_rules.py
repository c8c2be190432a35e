"""Function execution's rules that need no Kafka or Redis: a function's id and attributes,
the result sender, the checks of an execution on the server, the window of a function's
changes, and the client's routing and re-execution (Geode ``FunctionService``)."""

from __future__ import annotations

import itertools
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

from regionbus.broker.config import ServerSettings
from regionbus.broker.function_region import CHANGES_IN_FLIGHT, Change, PendingChanges
from regionbus.broker.functions import registered_functions
from regionbus.broker.validation import validate
from regionbus.clients.function_execution import DefaultResultCollector, FunctionService
from regionbus.schemas.errors import (
    ConfigurationError,
    FunctionError,
    FunctionInvocationTargetError,
    FunctionTimeoutError,
    InvalidOperationError,
    RequestLimitError,
    ServerTimeoutError,
    ValueTooLargeError,
)
from regionbus.schemas.functions import (
    Function,
    FunctionAttributes,
    FunctionContext,
    ResultSender,
    result_value,
)
from regionbus.schemas.limits import MAX_FUNCTION_FILTER_KEYS
from regionbus.schemas.messages import (
    Entry,
    FunctionSpec,
    Operation,
    OperationKind,
    Reply,
)
from regionbus.schemas.naming import bucket_of

SETTINGS = ServerSettings(namespace="unit", total_buckets=16, max_value_size_bytes=64)


class Plain(Function):
    def execute(self, context: FunctionContext) -> None:
        context.result_sender.last_result(1)


class Named(Function):
    id = "named"


class NamedChild(Named):
    pass


class PlainChild(Plain):
    pass


class NoResultHa(Function):
    id = "no-result-ha"
    has_result = False


# --- a function's id and attributes ----------------------------------------------------


def test_an_id_defaults_to_the_class_name_and_a_given_one_is_inherited() -> None:
    # Geode's getId: the class's canonical name, unless overridden (and then inherited).
    assert Plain.id == f"{__name__}.Plain"
    assert PlainChild.id == f"{__name__}.PlainChild"
    assert Named.id == NamedChild.id == "named"


def test_the_attributes_travel_as_geodes_function_state() -> None:
    for attributes in itertools.product((False, True), repeat=3):
        state = FunctionAttributes(*attributes).state
        assert FunctionAttributes.from_state(state) == FunctionAttributes(*attributes)
    assert FunctionAttributes.of(Plain()) == FunctionAttributes(True, True, False)
    with pytest.raises(FunctionError, match="isHA true, hasResult must also be true"):
        FunctionAttributes.of(NoResultHa())


def test_a_server_refuses_functions_it_cannot_register() -> None:
    assert set(registered_functions([], [Plain(), Named()])) == {Plain.id, "named"}
    with pytest.raises(ConfigurationError, match="two functions have the id 'named'"):
        registered_functions([], [Named(), NamedChild()])
    with pytest.raises(ConfigurationError, match="hasResult must also be true"):
        registered_functions([], [NoResultHa()])
    with pytest.raises(ConfigurationError, match="is not a Function"):
        registered_functions(["regionbus.schemas.functions:FunctionAttributes"], [])


# --- the result sender -----------------------------------------------------------------


def test_results_are_sent_in_order_until_the_last_one() -> None:
    sender = ResultSender("f", "server-1", has_result=True, max_bytes=1_000)
    sender.send_result({"n": 1})
    sender.send_exception(KeyError("UA-1"))
    sender.last_result(b"raw")
    with pytest.raises(FunctionError, match="sent its last result already"):
        sender.send_result(2)
    results = sender.results()
    assert [(e.key, e.version) for e in results] == [
        ("server-1", 0),
        ("server-1", 1),
        ("server-1", 2),
    ]
    decoded = [result_value(e) for e in results]
    assert decoded[0] == {"n": 1} and decoded[2] == b"raw"
    assert isinstance(decoded[1], FunctionError) and str(decoded[1]) == "KeyError: 'UA-1'"
    assert sender.last_sent


def test_a_sender_refuses_results_without_has_result_and_past_its_bound() -> None:
    with pytest.raises(FunctionError, match="hasResult"):
        ResultSender("f", "m", has_result=False, max_bytes=1_000).last_result(1)
    bounded = ResultSender("f", "m", has_result=True, max_bytes=20)
    bounded.send_result("x" * 5)
    with pytest.raises(FunctionError, match="function_max_result_bytes=20"):
        bounded.send_result("x" * 10)


# --- what a server refuses -------------------------------------------------------------


def _execution(kind: OperationKind, region: str = "r", **spec: Any) -> Operation:
    return Operation(1, "c", kind, region, 0, function=FunctionSpec("f", 7, **spec))


KEY_BUCKET = bucket_of("r", "k", 16)
OTHER_KEY = next(k for k in (f"o{i}" for i in range(100)) if bucket_of("r", k, 16) != KEY_BUCKET)


def test_well_formed_executions_pass() -> None:
    validate(_execution(OperationKind.EXECUTE_REGION_FUNCTION, filter=("k",)), KEY_BUCKET, SETTINGS)
    validate(_execution(OperationKind.EXECUTE_FUNCTION, ""), 3, SETTINGS)
    validate(_execution(OperationKind.GET_FUNCTION_ATTRIBUTES, ""), 0, SETTINGS)


@pytest.mark.parametrize(
    ("op", "error", "message"),
    [
        (
            Operation(1, "c", OperationKind.EXECUTE_REGION_FUNCTION, "r", 0),
            InvalidOperationError,
            "needs a function",
        ),
        (
            _execution(OperationKind.EXECUTE_REGION_FUNCTION, filter=("k", OTHER_KEY)),
            InvalidOperationError,
            "is not of bucket",
        ),
        (
            _execution(OperationKind.EXECUTE_FUNCTION, "", filter=("k",)),
            InvalidOperationError,
            "takes no filter",
        ),
        (_execution(OperationKind.EXECUTE_FUNCTION), InvalidOperationError, "of no region"),
        (
            _execution(
                OperationKind.EXECUTE_REGION_FUNCTION, arguments=b"x", arguments_serializer="avro:x"
            ),
            InvalidOperationError,
            "json or bytes",
        ),
        (
            _execution(
                OperationKind.EXECUTE_REGION_FUNCTION,
                arguments=b"x" * 65,
                arguments_serializer="bytes",
            ),
            ValueTooLargeError,
            "65 bytes exceed",
        ),
        (
            _execution(
                OperationKind.EXECUTE_REGION_FUNCTION,
                filter=tuple(f"k{i}" for i in range(MAX_FUNCTION_FILTER_KEYS + 1)),
            ),
            RequestLimitError,
            "keys in a function filter",
        ),
    ],
)
def test_a_malformed_execution_is_refused_typed(
    op: Operation, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        validate(op, KEY_BUCKET, SETTINGS)


# --- the window of a function's changes --------------------------------------------------


def test_a_function_waits_for_room_for_its_changes_until_its_deadline() -> None:
    now = [0.0]
    changes = PendingChanges(deadline_s=1.0, clock=lambda: now[0])
    change = Change(OperationKind.PUT, "r", "k", 3, b"1", "json", None)
    for _ in range(CHANGES_IN_FLIGHT):
        changes.add(change)
    assert len(changes.take()) == CHANGES_IN_FLIGHT and not changes.settled
    changes.delivered(None)
    changes.add(change)  # room for one again
    now[0] = 2.0
    with pytest.raises(FunctionTimeoutError):
        changes.add(change)
    changes.delivered("Broker: Message size too large")
    for _ in range(CHANGES_IN_FLIGHT - 1):
        changes.delivered(None)
    assert changes.settled and changes.failure == "Broker: Message size too large"


# --- the client: routing and re-execution ------------------------------------------------


class _Pool:
    """Answers each execution from ``answer(op, bucket, attempt)``: replies, or an error."""

    def __init__(self, answer: Any) -> None:
        self._answer = answer
        self._ids = itertools.count(1)
        self.kafka_principal = None
        self.sent: list[tuple[Operation, int]] = []

    def next_request_id(self) -> int:
        return next(self._ids)

    def request_each(self, ops: list[tuple[Operation, int]]) -> list[Future[list[Reply]]]:
        self.sent.extend(ops)
        futures = []
        for op, bucket in ops:
            future: Future[list[Reply]] = Future()
            outcome = self._answer(op, bucket)
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
            futures.append(future)
        return futures


def _cache(answer: Any, retry_attempts: int = 3) -> Any:
    return SimpleNamespace(
        pool=_Pool(answer),
        client_id="c",
        total_buckets=16,
        max_value_size_bytes=1_000,
        settings=SimpleNamespace(retry_attempts=retry_attempts, read_timeout_ms=1_000),
    )


def _result(op: Operation, bucket: int) -> list[Reply]:
    assert op.function is not None
    value = f"[{bucket}, {str(op.function.re_execute).lower()}]".encode()
    entry = Entry("server-1", 0, value, "json")
    return [Reply(op.request_id, bucket, True, entries=(entry,))]


def test_a_filter_goes_to_its_keys_buckets_each_with_its_keys() -> None:
    cache = _cache(_result)
    region = SimpleNamespace(name="r", region_service=cache)
    keys = [f"k{i}" for i in range(10)]
    got = FunctionService.on_region(region).with_filter([*keys, "k1"]).execute(Plain())

    by_bucket: dict[int, list[str]] = {}
    for key in keys:
        by_bucket.setdefault(bucket_of("r", key, 16), []).append(key)
    sent = {bucket: op.function.filter for op, bucket in cache.pool.sent if op.function}
    assert sent == {bucket: tuple(ks) for bucket, ks in by_bucket.items()}
    assert got.get_result() == [[b, False] for b in sorted(by_bucket)]
    with pytest.raises(RequestLimitError):
        FunctionService.on_region(region).with_filter(str(i) for i in range(1_001))
    with pytest.raises(FunctionError, match="Cannot specify filter"):
        FunctionService.on_servers(cache).with_filter(["k"])


def test_an_ha_function_is_executed_again_on_the_buckets_that_failed_only() -> None:
    failures = {3: FunctionInvocationTargetError("bucket 3 moved"), 5: ServerTimeoutError("late")}

    def answer(op: Operation, bucket: int) -> Any:
        assert op.function is not None
        if not op.function.re_execute and bucket in failures:
            return failures[bucket]
        return _result(op, bucket)

    cache = _cache(answer)
    results = FunctionService.on_servers(cache).execute(Plain()).get_result()

    assert results == [[b, b in failures] for b in range(16)]
    again = [bucket for op, bucket in cache.pool.sent if op.function and op.function.re_execute]
    assert again == [3, 5]
    executions = {op.function.execution_id for op, _ in cache.pool.sent if op.function}
    assert len(executions) == 1, "a re-execution is of the same execution"


def test_no_re_execution_for_a_function_that_is_not_ha_or_for_another_error() -> None:
    class NotHa(Plain):
        is_ha = False

    def moved(op: Operation, bucket: int) -> Any:
        return FunctionInvocationTargetError("moved") if bucket == 2 else _result(op, bucket)

    with pytest.raises(FunctionInvocationTargetError):
        FunctionService.on_servers(_cache(moved)).execute(NotHa())

    def failed(op: Operation, bucket: int) -> Any:
        if bucket == 2:
            return [Reply(op.request_id, 2, False, "FunctionError", "ValueError: no")]
        return _result(op, bucket)

    cache = _cache(failed)
    with pytest.raises(FunctionError, match="ValueError: no"):
        FunctionService.on_servers(cache).execute(Plain())
    assert len(cache.pool.sent) == 16

    always = _cache(lambda op, bucket: FunctionInvocationTargetError("gone"), retry_attempts=2)
    with pytest.raises(FunctionInvocationTargetError):
        FunctionService.on_servers(always).execute(Plain())
    assert len(always.pool.sent) == 16 * 3


def test_the_default_collector_waits_for_the_end_of_the_results() -> None:
    collector = DefaultResultCollector()
    collector.add_result("m", 1)
    with pytest.raises(FunctionTimeoutError, match="All results not received"):
        collector.get_result(timeout_ms=10)
    collector.end_results()
    assert collector.get_result(timeout_ms=10) == [1]
