"""The client proxy as the one server object of a client: its addresses, its record, its
registrations, and what is done to it (deliver, reply, close), in memory (the outbox, the
holds and the security guard are stand-ins that record what they are asked; the routing
tables are the real ones)."""

from __future__ import annotations

from typing import Any

from regionbus.broker.client_proxy import ClientProxies, ClientServices
from regionbus.broker.client_registry import ClientRecord
from regionbus.broker.cq_registry import CqTable
from regionbus.broker.interest import InterestTable
from regionbus.schemas.addressing import ClientAddress
from regionbus.schemas.cq import parse_cq
from regionbus.schemas.messages import InterestKind, InterestSpec, Reply
from regionbus.schemas.naming import Topics

_TOPICS = Topics("unit")


class _Outbox:
    def __init__(self) -> None:
        self.queued: list[tuple[str, bytes, str | None]] = []
        self.replies: list[tuple[Reply, ClientAddress]] = []

    def queue(self, proxy: Any, framed: bytes, originator: str | None = None) -> None:
        self.queued.append((proxy.client_id, framed, originator))
        proxy.queued += 1

    def reply(self, reply: Reply, to: ClientAddress) -> None:
        self.replies.append((reply, to))


class _Holds:
    def __init__(self) -> None:
        self.held: list[str] = []

    def full(self, account: Any, whose: str) -> None:
        self.held.append(whose)


class _Security:
    """Client ``reader`` may read region ``r``; every other client nothing."""

    def __init__(self) -> None:
        self.forgotten: list[tuple[str, bool]] = []

    def may_receive(self, client_id: str, region: str, key: str | None = None) -> bool:
        return client_id == "reader" and region == "r"

    def principal_of(self, client_id: str) -> str | None:
        return "analyst" if client_id == "reader" else None

    def forget_client(self, client_id: str, *, unbind: bool = True) -> None:
        self.forgotten.append((client_id, unbind))


def _proxies(
    security: _Security | None = None, capacity: int = 3
) -> tuple[ClientProxies, _Outbox, _Holds, InterestTable, CqTable]:
    outbox, holds, interest, cqs = _Outbox(), _Holds(), InterestTable(), CqTable()
    anything: Any = security
    services = ClientServices(outbox, holds, interest, cqs, anything, capacity)
    return ClientProxies(_TOPICS, lambda _topic: 8, services), outbox, holds, interest, cqs


def _record(principal: str | None) -> ClientRecord:
    return ClientRecord(True, "conn-1", True, 0, 300, kafka_principal=principal)


def test_a_proxy_replies_to_its_own_principal_topics_without_being_told() -> None:
    proxies, outbox, *_ = _proxies()
    proxy = proxies.get("c1", "desk")

    proxy.reply(Reply(request_id=7, bucket=0, ok=True))

    ((reply, to),) = outbox.replies
    assert reply.request_id == 7
    assert to == ClientAddress("c1", "desk") == proxy.address
    assert proxy.queue_topic == _TOPICS.client_queues("desk")


def test_a_proxy_delivers_only_what_its_principal_may_read_and_holds_at_its_capacity() -> None:
    proxies, outbox, holds, *_ = _proxies(_Security(), capacity=2)
    reader, stranger = proxies.get("reader", None), proxies.get("stranger", None)

    assert stranger.deliver(b"e", "writer", region="r", key="k") == 0
    assert reader.deliver(b"e", "writer", region="other", key="k") == 0
    counts = [reader.deliver(b"e", "writer", region="r", key="k") for _ in range(3)]

    assert counts == [1, 1, 1]
    assert [c for c, _, _ in outbox.queued] == ["reader"] * 3
    assert reader.events_routed == 3 and stranger.events_routed == 0
    assert holds.held == ["reader"]  # the third event found two queued, none acked
    assert reader.security_principal() == "analyst"


def test_closing_a_proxy_forgets_its_routing_and_principal_here_and_keeps_its_record() -> None:
    security = _Security()
    proxies, _outbox, _holds, interest, cqs = _proxies(security)
    proxy = proxies.keep_record("c1", _record("desk"))
    interest.add("c1", "r", InterestSpec(InterestKind.KEYS, keys=("a", "b")), [0], ["a", "b"])
    interest.add("c1", "r", InterestSpec(InterestKind.REGEX, regex="x.*"), [0])
    cqs.add("c1", "big", parse_cq("SELECT * FROM /r WHERE x > 1"), durable=False, running=[0])
    group = proxies.shared(("unit.queues", 1, "all", "r"), frozenset({"c1", "c2"}))
    assert proxy.registrations() == (2, 1, ("big",))

    proxy.close()

    assert interest.keys_of("c1") == 0 and interest.regexes_of("c1") == 0
    assert cqs.names("c1") == []
    assert group.members == {"c2"}
    assert security.forgotten == [("c1", False)]
    # A client disconnected here keeps its record until it is forgotten for the namespace:
    # on a fresh proxy, whose queue account starts empty.
    again = proxies.find("c1")
    assert again is not None and again is not proxy
    assert again.record == _record("desk") and again.queued == 0
    assert proxies.records() == {"c1": _record("desk")}

    proxies.close("c1", keep_record=False)
    assert proxies.find("c1") is None and proxies.records() == {}


def test_a_client_reading_another_principals_topics_gets_a_new_address_and_keeps_its_record() -> (
    None
):
    proxies, *_ = _proxies()
    first = proxies.keep_record("c1", _record(None))
    first.queued = 5

    moved = proxies.get("c1", "desk")

    assert moved is not first
    assert moved.address == ClientAddress("c1", "desk")
    assert moved.record == _record(None) and moved.queued == 0
    assert proxies.get("c1", "desk") is moved


def test_a_client_that_only_writes_holds_its_record_but_is_in_no_queue_gauge() -> None:
    proxies, *_ = _proxies()
    writer = proxies.keep_record("writer", _record(None))
    subscriber = proxies.get("subscriber", None)

    assert proxies.routed() == {"subscriber": 0} and proxies.snapshot() == {"subscriber": 0}
    assert list(proxies) == [subscriber]
    assert proxies.records() == {"writer": _record(None)}

    writer.deliver(b"e", "someone")
    assert proxies.routed() == {"subscriber": 0, "writer": 1}
