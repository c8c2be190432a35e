"""A client id is held by one live connection at a time: a second is refused, and a
connection that lost its id never disconnects or deletes what is now another's."""

from __future__ import annotations

from typing import Any

import pytest
from support import Recorder, Sentinel, consumer_groups, routed, wait_until

from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, ClientCache
from regionbus.schemas.errors import DuplicateClientError, DuplicateDurableClientError
from regionbus.schemas.naming import Topics

pytestmark = pytest.mark.abuse


def test_a_second_live_client_with_the_same_non_durable_id_is_refused_and_the_first_keeps_working(
    cache_server: CacheServer,
    client_factory: Any,
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    recorder = Recorder()
    first: ClientCache = client_factory(client_id="desk")
    first.create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
    acks = Topics(namespace).client_group("desk")
    wait_until(lambda: acks in consumer_groups(kafka_bootstrap_servers), what="its first ack")
    with pytest.raises(DuplicateClientError, match="already connected") as refused:
        client_factory(client_id="desk")
    assert not isinstance(refused.value, DuplicateDurableClientError)
    assert acks in consumer_groups(kafka_bootstrap_servers), "the refused one deleted its acks"
    writer = client_factory().create_region("r")
    writer.put("k", 1)
    assert Sentinel(writer, recorder).fence() == [("create", "k", 1)]
    first.close()
    # Once the first has closed, the id is free again.
    again: ClientCache = client_factory(client_id="desk")
    assert again.create_region("r").get("k") == 1


def test_a_connection_that_lost_its_id_to_another_deletes_nothing_when_it_closes(
    server_settings: ServerSettings,
    client_factory: Any,
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    settings = server_settings.model_copy(update={"maximum_time_between_pings_ms": 1000})
    with CacheServer(settings) as server:
        # The first connection stays silent past the servers' limit and is dropped...
        stale: ClientCache = client_factory(client_id="desk", ping_interval_ms=60_000)
        stale.create_region("r")
        wait_until(
            lambda: server.clients.get("desk") is None,
            timeout_s=20,
            what="the silent connection to be dropped",
        )
        # ...so a second process may take the id.
        recorder = Recorder()
        live: ClientCache = client_factory(client_id="desk", ping_interval_ms=200)
        live.create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
        acks = Topics(namespace).client_group("desk")
        wait_until(lambda: acks in consumer_groups(kafka_bootstrap_servers), what="an ack")
        stale.close()
        assert acks in consumer_groups(kafka_bootstrap_servers), "the stale one deleted acks"
        writer = client_factory().create_region("r")
        writer.put("k", 1)
        assert Sentinel(writer, recorder).fence() == [("create", "k", 1)]
        assert routed(server.registry, "r", "k", 0) == {"desk": True}
