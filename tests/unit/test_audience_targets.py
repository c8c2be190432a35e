"""The notifier's targets of an audience (one record per partition of the clients that
share an interest), kept by audience, in memory (no Kafka, no Redis)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from regionbus.broker.audiences import Audience
from regionbus.broker.client_proxy import ClientProxies
from regionbus.broker.config import ServerSettings
from regionbus.broker.notifier import CacheClientNotifier
from regionbus.broker.outbox import Recipients
from regionbus.schemas.naming import Topics


def _notifier() -> CacheClientNotifier:
    topics = Topics("unit")
    proxies = ClientProxies(topics, lambda _topic: 4)
    unused = cast(Any, None)
    return CacheClientNotifier(
        ServerSettings(),
        topics,
        unused,
        cast(Any, SimpleNamespace(table=None)),
        unused,
        proxies,
        unused,
        unused,
        unused,
    )


def test_an_equal_audience_of_another_object_gets_the_same_targets_and_is_kept_by_it() -> None:
    notifier = _notifier()
    clients = [f"c{n}" for n in range(40)]
    first = Audience(("all", "r"), True, frozenset(clients))
    again = Audience(("all", "r"), True, frozenset(clients))
    for client_id in clients:
        notifier.serve(client_id, None)

    targets = notifier._targets(first)
    assert targets and all(isinstance(t, Recipients) for t, _ in targets)
    assert {c for t, _ in targets for c in cast(Recipients, t).members} == set(clients)
    assert notifier._targets(again) is targets
    # Kept by the object last asked with, so its next lookups stop at identity instead of
    # comparing the 40 client ids again.
    ((keyed, _),) = notifier._audience_targets.values()
    assert keyed is again
    assert next(iter(notifier._audience_targets)) is again
