"""Continuous queries (docs/behaviour.md §9; Geode ``CqQueryDUnitTest``,
``CqResultSetUsingPoolDUnitTest``, ``DurableClientCQDUnitTest``) on a real Kafka and Redis: subset
refusals, the query-operation table, UNDEFINED, interest and CQ together, shared evaluation, state
transitions, gap-free initial results under concurrent writes, region clear and destroy, durable
CQs."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from support import Recorder, entry_operation, send_raw_operation, wait_until

from regionbus import (
    ALL_KEYS,
    CqAttributes,
    CqClosedError,
    CqEvent,
    CqExistsError,
    CqInvalidError,
    CqState,
    CqStateError,
    CqStatusListener,
    Operation,
    RegionNotFoundError,
    RegionShortcut,
)
from regionbus.broker.server import CacheServer
from regionbus.schemas.messages import CqSpec, OperationKind
from regionbus.schemas.messages import Operation as WireOperation
from regionbus.schemas.naming import RedisKeys

DELAYED = "SELECT * FROM /r f WHERE f.delay > 60"


class CqRecorder(CqStatusListener):
    """Records every CQ callback as ``(kind, base op, query op, key, value)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any, Any, Any]] = []
        self.events: list[CqEvent] = []
        self._lock = threading.Lock()

    def on_event(self, event: CqEvent) -> None:
        with self._lock:
            self.events.append(event)
            self.calls.append(
                ("event", event.base_operation, event.query_operation, event.key, event.new_value)
            )

    def on_error(self, event: CqEvent) -> None:
        with self._lock:
            self.events.append(event)
            self.calls.append(("error", event.base_operation, None, event.key, event.throwable))

    def close(self) -> None:
        with self._lock:
            self.calls.append(("close", None, None, None, None))

    def on_cq_connected(self) -> None:
        with self._lock:
            self.calls.append(("connected", None, None, None, None))

    def on_cq_disconnected(self) -> None:
        with self._lock:
            self.calls.append(("disconnected", None, None, None, None))

    def snapshot(self) -> list[tuple[str, Any, Any, Any, Any]]:
        with self._lock:
            return list(self.calls)

    def entry_calls(self) -> list[tuple[Any, Any, Any, Any]]:
        """``(base op, query op, key, value)`` of every event and error, in order."""
        return [c[1:] for c in self.snapshot() if c[0] in ("event", "error")]


def _fence(recorder: CqRecorder, writer: Any, key: str = "zz-fence") -> None:
    """Put, then destroy, a key the CQ selects, and wait for both events: the writer's
    earlier changes were applied before them, so their events had time to arrive (the
    caller drops the fence key from what it checks)."""
    writer.put(key, {"delay": 999})
    wait_until(lambda: any(c[2] == key for c in recorder.entry_calls()), what=f"fence {key}")
    writer.destroy(key)
    wait_until(
        lambda: any(c[2] == key and c[1] is Operation.DESTROY for c in recorder.entry_calls()),
        what=f"fence {key} destroyed",
    )


def _without(calls: list[tuple[Any, ...]], key: str = "zz-fence") -> list[tuple[Any, ...]]:
    return [c for c in calls if c[2] != key]


def _cq(cache: Any, name: str = "delayed", query: str = DELAYED, **kw: Any) -> Any:
    recorder = CqRecorder()
    if cache.get_region("r") is None:
        cache.create_region("r", RegionShortcut.PROXY)
    cq = cache.query_service().new_cq(name, query, CqAttributes([recorder]), **kw)
    return cq, recorder


@pytest.mark.parametrize(
    ("query", "rule"),
    [
        ("SELECT DISTINCT * FROM /r", "distinct"),
        ("SELECT f.delay FROM /r f", "projection"),
        ("SELECT * FROM /r a, /s b", "one-region"),
        ("SELECT * FROM /r a, a.legs b", "one-iterator"),
        ("SELECT * FROM /r f ORDER BY f.delay", "order-by"),
        ("SELECT * FROM /r LIMIT 3", "limit"),
        ("SELECT * FROM /r.entries", "region-path"),
        ("SELECT * FROM /r WHERE x IN (SELECT * FROM /r)", "one-region"),
    ],
)
def test_new_cq_refuses_a_query_outside_the_subset_naming_the_rule(
    query: str, rule: str, cache_server: CacheServer, client_factory: Any, redis_client: Any
) -> None:
    cache = client_factory()
    with pytest.raises(CqInvalidError) as caught:
        cache.query_service().new_cq("bad", query)
    assert caught.value.rule == rule
    assert cache.query_service().get_cqs() == []
    assert not redis_client.exists(RedisKeys(cache_server.settings.namespace).cqs(cache.client_id))


def test_a_server_refuses_a_cq_outside_the_subset_sent_to_it_and_keeps_serving(
    cache_server: CacheServer, client_factory: Any, kafka_bootstrap_servers: str, namespace: str
) -> None:
    hostile = WireOperation(
        request_id=1,
        client_id="hostile",
        kind=OperationKind.EXECUTE_CQ,
        region="r",
        timestamp_ms=0,
        cq=CqSpec("bad", "SELECT f.x FROM /r f"),
    )
    send_raw_operation(kafka_bootstrap_servers, namespace, hostile, 0)
    wait_until(
        lambda: cache_server.stats.dead_letters_by_category.get("invalid_operation", 0) >= 1,
        what="the bad CQ to be dead-lettered",
    )
    cache = client_factory()
    writer = cache.create_region("r", RegionShortcut.PROXY)
    cq, recorder = _cq(cache)
    cq.execute()
    writer.put("k", {"delay": 90})
    wait_until(lambda: recorder.entry_calls(), what="the CQ event after the refusal")
    assert recorder.entry_calls() == [(Operation.CREATE, Operation.CREATE, "k", {"delay": 90})]


def test_query_operations_follow_the_spec_table(
    cache_server: CacheServer, client_factory: Any, kafka_bootstrap_servers: str, namespace: str
) -> None:
    holder = client_factory()
    cq, recorder = _cq(holder)
    cq.execute()
    assert cq.state is CqState.RUNNING
    writer = client_factory().create_region("r", RegionShortcut.PROXY)
    writer.put("k1", {"delay": 10})  # not in, not in: nothing
    writer.put("k1", {"delay": 70})  # was not, is: CREATE (base UPDATE)
    writer.put("k1", {"delay": 80})  # was, is: UPDATE
    writer.put("k1", {"delay": 5})  # was, is not: DESTROY (base UPDATE)
    writer.put("k2", {"delay": 90})  # CREATE (base CREATE)
    writer.destroy("k2")  # DESTROY (base DESTROY)
    writer.put("k3", {"delay": 100})  # CREATE
    op, bucket = entry_operation("server-app", OperationKind.INVALIDATE, "k3", 1)
    send_raw_operation(kafka_bootstrap_servers, namespace, op, bucket)  # DESTROY (INVALIDATE)
    writer.put("k4", {"delay": 1})
    writer.destroy("k4")  # not in before or after: nothing
    wait_until(lambda: len(recorder.entry_calls()) >= 7, what="seven CQ events")
    _fence(recorder, writer)
    calls = _without(recorder.entry_calls())
    by_key = {key: [c for c in calls if c[2] == key] for key in ("k1", "k2", "k3", "k4")}
    assert by_key["k1"] == [
        (Operation.UPDATE, Operation.CREATE, "k1", {"delay": 70}),
        (Operation.UPDATE, Operation.UPDATE, "k1", {"delay": 80}),
        (Operation.UPDATE, Operation.DESTROY, "k1", {"delay": 5}),
    ]
    assert by_key["k2"] == [
        (Operation.CREATE, Operation.CREATE, "k2", {"delay": 90}),
        (Operation.DESTROY, Operation.DESTROY, "k2", None),
    ]
    assert by_key["k3"] == [
        (Operation.CREATE, Operation.CREATE, "k3", {"delay": 100}),
        (Operation.INVALIDATE, Operation.DESTROY, "k3", None),
    ]
    assert by_key["k4"] == []
    stats = cq.statistics
    assert (stats.events, stats.inserts, stats.updates, stats.deletes) == (9, 4, 1, 4)


def test_the_originator_of_a_change_hears_its_own_cq_event(
    cache_server: CacheServer, client_factory: Any
) -> None:
    cache = client_factory()
    region = cache.create_region("r")
    region.register_interest(ALL_KEYS)
    cq, recorder = _cq(cache)
    cq.execute()
    region.put("mine", {"delay": 61})
    wait_until(lambda: recorder.entry_calls(), what="the originator's CQ event")
    assert recorder.entry_calls() == [(Operation.CREATE, Operation.CREATE, "mine", {"delay": 61})]


def test_undefined_attributes_follow_geodes_rules(
    cache_server: CacheServer, client_factory: Any
) -> None:
    holder = client_factory()
    missing, missing_recorder = _cq(holder, "missing", "SELECT * FROM /r f WHERE f.pos.sec > 5")
    not_equal, ne_recorder = _cq(
        holder, "not-equal", "SELECT * FROM /r p WHERE p.position2.secId <> 'ABC'"
    )
    mismatch, mismatch_recorder = _cq(holder, "mismatch", "SELECT * FROM /r f WHERE f.name > 5")
    for cq in (missing, not_equal, mismatch):
        cq.execute()
    writer = client_factory().create_region("r", RegionShortcut.PROXY)
    writer.put("plain", {"delay": 1})  # no pos, no position2
    writer.put("text", "just a string")  # no attributes at all
    writer.put("abc", {"position2": {"secId": "ABC"}})
    writer.put("named", {"name": "JFK"})
    wait_until(lambda: len(ne_recorder.entry_calls()) >= 3, what="the <> UNDEFINED events")
    wait_until(lambda: mismatch_recorder.entry_calls(), what="the type mismatch error")
    _fence(ne_recorder, writer, key="zz-fence")
    # f.pos.sec is UNDEFINED for all: any comparison with UNDEFINED but <> is false
    assert _without(missing_recorder.entry_calls()) == []
    # Geode testCQEventsWithNotEqualsUndefined: UNDEFINED <> 'ABC' is true
    assert sorted(c[2] for c in _without(ne_recorder.entry_calls())) == ["named", "plain", "text"]
    # 'JFK' > 5 cannot be evaluated (TypeMismatchException): on_error, the CQ keeps running
    errors = [c for c in mismatch_recorder.snapshot() if c[0] == "error"]
    assert [(c[3], type(c[4]).__name__) for c in errors] == [("named", "CqEvaluationError")]
    assert mismatch.is_running()


def test_a_change_matching_interest_and_a_cq_reaches_both_listeners(
    cache_server: CacheServer, client_factory: Any, kafka_bootstrap_servers: str, namespace: str
) -> None:
    interest_recorder = Recorder()
    cache = client_factory()
    region = cache.create_region("r", listeners=[interest_recorder])
    region.register_interest(ALL_KEYS)
    cq, recorder = _cq(cache)
    cq.execute()
    writer = client_factory().create_region("r", RegionShortcut.PROXY)
    writer.put("both", {"delay": 70})
    writer.put("both", {"delay": 71})
    op, bucket = entry_operation("server-app", OperationKind.INVALIDATE, "both", 1)
    send_raw_operation(kafka_bootstrap_servers, namespace, op, bucket)
    writer.destroy("both")  # out of the result set already: nothing for the CQ
    wait_until(lambda: len(interest_recorder.snapshot()) >= 4, what="four interest events")
    _fence(recorder, writer)
    assert [c[0] for c in interest_recorder.snapshot() if c[1] == "both"] == [
        "create",
        "update",
        "invalidate",
        "destroy",
    ]
    assert [c[:2] for c in _without(recorder.entry_calls())] == [
        (Operation.CREATE, Operation.CREATE),
        (Operation.UPDATE, Operation.UPDATE),
        (Operation.INVALIDATE, Operation.DESTROY),
    ]
    assert cache.subscription_stats.cq_duplicates_dropped == 0


def test_equivalent_queries_of_many_clients_are_evaluated_once_per_change(
    cache_server: CacheServer, client_factory: Any
) -> None:
    recorders = []
    spellings = [
        "SELECT * FROM /r f WHERE f.delay > 60",
        "select * from /r where delay > 60",
        "SELECT * FROM /r AS x WHERE 60 < x.delay",
    ]
    for spelling in spellings:
        cq, recorder = _cq(client_factory(), "delayed", spelling)
        cq.execute()
        recorders.append(recorder)
    assert cache_server.cqs.table.queries_of("r") == 1
    writer = client_factory().create_region("r", RegionShortcut.PROXY)
    writer.put("late", {"delay": 65})
    for recorder in recorders:
        wait_until(lambda recorder=recorder: recorder.entry_calls(), what="each holder's event")
        assert recorder.entry_calls() == [
            (Operation.CREATE, Operation.CREATE, "late", {"delay": 65})
        ]


def test_state_transitions_and_their_errors(
    cache_server: CacheServer, client_factory: Any, redis_client: Any
) -> None:
    cache = client_factory()
    service = cache.query_service()
    cq, recorder = _cq(cache)
    assert cq.state is CqState.STOPPED and service.get_cq("delayed") is cq
    with pytest.raises(CqExistsError):
        service.new_cq("delayed", DELAYED)
    with pytest.raises(CqStateError, match="not in running state"):
        cq.stop()
    cq.execute()
    assert ("connected", None, None, None, None) in recorder.snapshot()
    with pytest.raises(CqStateError, match="running state"):
        cq.execute()
    writer = client_factory().create_region("r", RegionShortcut.PROXY)
    writer.put("a", {"delay": 70})
    wait_until(lambda: recorder.entry_calls(), what="the first event")
    cq.stop()
    assert cq.state is CqState.STOPPED
    writer.put("b", {"delay": 70})  # stopped: never delivered
    cq.execute()
    writer.put("c", {"delay": 70})
    wait_until(lambda: any(c[2] == "c" for c in recorder.entry_calls()), what="after resuming")
    assert [c[2] for c in recorder.entry_calls()] == ["a", "c"]
    cq.close()
    assert cq.state is CqState.CLOSED and service.get_cqs() == []
    assert recorder.snapshot()[-1][0] == "close"
    with pytest.raises(CqClosedError):
        cq.execute()
    with pytest.raises(CqClosedError):
        cq.stop()
    cq.close()  # closing again does nothing
    key = RedisKeys(cache_server.settings.namespace).cqs(cache.client_id)
    wait_until(lambda: not redis_client.hexists(key, "delayed"), what="the CQ gone from Redis")
    again = service.new_cq("delayed", DELAYED)  # the name is free again
    assert again.state is CqState.STOPPED


def test_execute_needs_the_region_here_and_on_the_servers(
    cache_server: CacheServer, client_factory: Any
) -> None:
    cache = client_factory()
    service = cache.query_service()
    cq = service.new_cq("nowhere", "SELECT * FROM /other o WHERE o.x = 1")
    with pytest.raises(RegionNotFoundError, match="not found locally"):
        cq.execute()
    cache.create_region("other")
    with pytest.raises(RegionNotFoundError):
        cq.execute()
    assert cq.state is CqState.STOPPED


def test_service_wide_execute_stop_close(cache_server: CacheServer, client_factory: Any) -> None:
    cache = client_factory()
    service = cache.query_service()
    first, _ = _cq(cache, "first")
    second, _ = _cq(cache, "second", "SELECT * FROM /r f WHERE f.delay < 0")
    service.execute_cqs()
    assert first.is_running() and second.is_running()
    service.stop_cqs()
    assert first.is_stopped() and second.is_stopped()
    service.close_cqs()
    assert service.get_cqs() == [] and first.is_closed() and second.is_closed()


def test_initial_results_have_no_gap_under_concurrent_writes(
    cache_server: CacheServer, client_factory: Any
) -> None:
    writer = client_factory().create_region("r", RegionShortcut.PROXY)
    keys = [f"k{i}" for i in range(40)]
    writer.put_all({k: {"odd": False, "n": 0} for k in keys})
    stop = threading.Event()
    written: list[int] = []

    def write() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            futures = [
                writer.put_async(k, {"odd": (n + i) % 2 == 1, "n": n}) for i, k in enumerate(keys)
            ]
            for future in futures:
                future.result(30)
            written.append(n)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    wait_until(lambda: len(written) >= 2, what="writes under way")
    holder = client_factory()
    cq, recorder = _cq(holder, "odd", "SELECT * FROM /r v WHERE v.odd = true")
    results = cq.execute_with_initial_results()
    rounds = len(written)
    wait_until(lambda: len(written) >= rounds + 3, timeout_s=60, what="writes after the results")
    stop.set()
    thread.join(60)
    last = written[-1]
    initial = {r.key: r.value for r in results}

    def replayed() -> dict[str, Any]:
        # The initial results, then every CQ event in order: a gap or an overlap between
        # the two shows as a DESTROY of a key not in the set, or a CREATE of one in it.
        live = dict(initial)
        for _base, query_op, key, value in recorder.entry_calls():
            if query_op is Operation.DESTROY:
                assert key in live, f"{key} left a result set it was not in (a gap)"
                live.pop(key)
            else:
                assert (key in live) is (query_op is Operation.UPDATE), f"{query_op} of {key}"
                live[key] = value
        return live

    expected = {k: {"odd": True, "n": last} for i, k in enumerate(keys) if (last + i) % 2 == 1}
    # The last round's puts ran concurrently: its events, the keys leaving the set
    # among them, arrive in any order, so wait for all of them, not for the entering ones.
    wait_until(lambda: replayed() == expected, timeout_s=60, what="the last round's events")
    assert replayed() == expected


def test_region_clear_reaches_every_cq_and_region_destroy_closes_them(
    cache_server: CacheServer, client_factory: Any, redis_client: Any
) -> None:
    holder = client_factory()
    delayed, delayed_recorder = _cq(holder)
    everything, all_recorder = _cq(holder, "all", "SELECT * FROM /r")
    delayed.execute()
    everything.execute()
    writer = client_factory().create_region("r")
    writer.put("x", {"delay": 90})
    wait_until(lambda: all_recorder.entry_calls(), what="a create")
    writer.clear()
    for recorder in (delayed_recorder, all_recorder):
        wait_until(
            lambda recorder=recorder: any(
                c[1] is Operation.REGION_CLEAR for c in recorder.entry_calls()
            ),
            what="REGION_CLEAR",
        )
    assert delayed.is_running() and everything.is_running()
    writer.destroy_region()
    for cq, recorder in ((delayed, delayed_recorder), (everything, all_recorder)):
        wait_until(cq.is_closed, what=f"{cq.name} closed by the region's destruction")
        calls = recorder.snapshot()
        assert calls[-2][:3] == ("event", Operation.REGION_DESTROY, Operation.REGION_DESTROY)
        assert calls[-1][0] == "close"
    assert holder.query_service().get_cqs() == []
    key = RedisKeys(cache_server.settings.namespace).cqs(holder.client_id)
    assert not redis_client.exists(key)


def test_a_closing_client_takes_its_cqs_with_it(
    cache_server: CacheServer, client_factory: Any, redis_client: Any
) -> None:
    cache = client_factory()
    cq, recorder = _cq(cache)
    cq.execute()
    key = RedisKeys(cache_server.settings.namespace).cqs(cache.client_id)
    assert redis_client.hexists(key, "delayed")
    cache.close()
    assert cq.is_closed() and recorder.snapshot()[-1][0] == "close"
    wait_until(lambda: not redis_client.exists(key), what="the CQs gone from Redis")
    wait_until(lambda: not cache_server.cqs.table.has_queries("r"), what="the CQs gone here")


def test_durable_cqs_are_kept_while_away_replayed_before_the_marker_and_listed(
    server_settings: Any, client_factory: Any, redis_client: redis.Redis
) -> None:
    settings = server_settings.model_copy(update={"maximum_time_between_pings_ms": 30_000})
    with CacheServer(settings):
        first = client_factory(durable_client_id="desk", durable_client_timeout_s=120)
        first.create_region("r", RegionShortcut.PROXY)
        kept, _ = _cq(first, "kept", durable=True)
        dropped, _ = _cq(first, "dropped", "SELECT * FROM /r f WHERE f.delay > 0")
        kept.execute()
        dropped.execute()
        first.ready_for_events()
        assert first.query_service().get_all_durable_cqs_from_server() == ["kept"]
        first.close(keep_alive=True)
        # the non-durable CQ went with the connection, the durable one stays while away
        stored = RedisKeys(server_settings.namespace).cqs("desk")
        wait_until(
            lambda: set(redis_client.hkeys(stored)) == {b"kept"},
            what="only the durable CQ kept in Redis",
        )

        writer = client_factory().create_region("r", RegionShortcut.PROXY)
        writer.put("away-1", {"delay": 70})
        writer.put("away-2", {"delay": 10})  # only "dropped" would select it
        writer.put("away-1", {"delay": 5})

        order: list[str] = []

        class Live(Recorder):
            def after_region_live(self, event: Any) -> None:
                order.append("live")

        second = client_factory(durable_client_id="desk", durable_client_timeout_s=120)
        assert second.client_state == "RECONNECTED"
        second.create_region("r", RegionShortcut.PROXY, listeners=[Live()])
        assert second.query_service().get_all_durable_cqs_from_server() == ["kept"]
        recorder = CqRecorder()
        original = recorder.on_event

        def on_event(event: CqEvent) -> None:
            order.append(f"{event.query_operation.name}:{event.key}")  # type: ignore[union-attr]
            original(event)

        recorder.on_event = on_event  # type: ignore[method-assign]
        again = second.query_service().new_cq("kept", DELAYED, CqAttributes([recorder]), True)
        again.execute()
        second.ready_for_events()
        wait_until(lambda: "live" in order, what="the marker")
        assert order[: order.index("live")] == ["CREATE:away-1", "DESTROY:away-1"]
        writer.put("after", {"delay": 99})
        wait_until(lambda: "CREATE:after" in order, what="a live event after the marker")
        second.close(keep_alive=False)
        namespace = server_settings.namespace
        wait_until(
            lambda: not redis_client.exists(RedisKeys(namespace).cqs("desk")),
            what="the durable CQ gone with the client",
        )


def test_a_change_applied_again_after_a_failover_keeps_its_old_value(
    redis_client: Any, namespace: str
) -> None:
    """The new primary of a bucket re-processes changes whose EventID Redis recognises
    (DUP): the old value (and its serializer) kept with the stored result lets it derive
    the same query operation as the first time."""
    from regionbus.broker.store import RegionStore
    from regionbus.schemas.eventid import EventID

    store = RegionStore(redis_client, namespace, 16)
    store.create_region("r")

    def put(sequence: int, value: bytes) -> Any:
        args = store.entry_args(
            OperationKind.PUT, "r", "k", value, "json", EventID("m", 1, sequence, 3), 3,
            sequence, want_old=True,
        )  # fmt: skip
        return store.run_batch([args])[0]

    put(0, b'{"delay": 10}')
    first = put(1, b'{"delay": 70}')
    again = put(1, b'{"delay": 70}')
    assert first.status == "OK" and again.status == "DUP"
    assert again.old_value == first.old_value == b'{"delay": 10}'
    assert again.old_serializer == first.old_serializer == "json"
    assert store.prune_results({3: 2}) == 2
    assert put(1, b'{"delay": 70}').old_value is None  # pruned with its result


def test_a_cq_reads_the_fields_of_avro_records(
    cache_server: CacheServer, client_factory: Any
) -> None:
    """Values are read by attribute path: fields for Avro records (the region's schema
    travels with the CQ, so the servers can decode its values)."""
    from regionbus import AvroSerializer

    schema = {
        "type": "record",
        "name": "Flight",
        "fields": [
            {"name": "origin", "type": "string"},
            {"name": "delay", "type": {"type": "record", "name": "Delay",
                                       "fields": [{"name": "minutes", "type": "int"}]}},
        ],
    }  # fmt: skip
    holder = client_factory()
    holder.create_region("r", RegionShortcut.PROXY, serializer=AvroSerializer(schema))
    recorder = CqRecorder()
    cq = holder.query_service().new_cq(
        "late", "SELECT * FROM /r f WHERE f.delay.minutes > 60", CqAttributes([recorder])
    )
    cq.execute()
    writer = client_factory().create_region(
        "r", RegionShortcut.PROXY, serializer=AvroSerializer(schema)
    )
    writer.put("on-time", {"origin": "JFK", "delay": {"minutes": 5}})
    writer.put("late", {"origin": "EWR", "delay": {"minutes": 75}})
    wait_until(lambda: recorder.entry_calls(), what="the Avro record's CQ event")
    assert recorder.entry_calls() == [
        (Operation.CREATE, Operation.CREATE, "late", {"origin": "EWR", "delay": {"minutes": 75}})
    ]


def test_status_listeners_hear_when_the_servers_stop_and_start_answering(
    server_settings: Any, client_factory: Any
) -> None:
    server = CacheServer(server_settings)
    server.start()
    try:
        cache = client_factory(read_timeout_ms=2_000, ping_interval_ms=300)
        cq, recorder = _cq(cache)
        cq.execute()
        assert [c[0] for c in recorder.snapshot()] == ["connected"]
    finally:
        server.stop()
    wait_until(
        lambda: ("disconnected", None, None, None, None) in recorder.snapshot(),
        timeout_s=60,
        what="on_cq_disconnected",
    )
    with CacheServer(server_settings):
        wait_until(
            lambda: [c[0] for c in recorder.snapshot()][-1] == "connected",
            timeout_s=60,
            what="on_cq_connected again",
        )
    assert cq.is_running()


def test_every_cq_operation_of_a_client_with_a_kafka_principal_is_answered(
    cache_server: CacheServer, client_factory: Any
) -> None:
    """A client with a Kafka principal reads the replies of its principal's topic: stop,
    close and the durable CQ list were answered in the unscoped one, and timed out."""
    cache = client_factory(
        kafka_principal="desk", durable_client_id="desk-1", read_timeout_ms=8_000
    )
    service = cache.query_service()
    cq, recorder = _cq(cache, durable=True)
    cq.execute()
    cache.ready_for_events()
    writer = client_factory().create_region("r", RegionShortcut.PROXY)
    writer.put("a", {"delay": 70})
    wait_until(lambda: recorder.entry_calls(), what="the CQ's event")
    assert service.get_all_durable_cqs_from_server() == ["delayed"]
    cq.stop()
    assert cq.is_stopped()
    cq.execute_with_initial_results()
    service.stop_cqs()
    cq.close()
    assert cq.is_closed() and service.get_all_durable_cqs_from_server() == []
