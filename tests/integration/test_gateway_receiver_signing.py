"""A gateway receiver applying a remote site's batches on a site with security on: it signs
the operations it sends as its own principal (docs/security.md: the servers refuse unsigned ones),
and checks the servers' signatures on what it reads back.

Site A (unsecured) sends to site B, whose cache server has ``security_enabled``; both are
namespaces of the session Kafka and Redis.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from gateway_sites import Site, running_sites
from support import wait_until

from regionbus.broker.permissions import ResourcePermission
from regionbus.broker.principals import PrincipalStore

_GATEWAY_PRINCIPAL = "site-a-gateway"
_GATEWAY_SECRET = "site-a-gateway-secret"
_SECURED = {"security_enabled": True, "allowed_skew_ms": 60_000, "principal_cache_ttl_ms": 200}


@pytest.fixture
def sites(
    namespace: str, kafka_bootstrap_servers: str, redis_url: str, redis_client: redis.Redis
) -> Iterator[list[Site]]:
    """Two sites, ids 1 and 2; site B knows the principal of A's gateway, allowed to read
    and write region r only."""
    with running_sites(namespace, kafka_bootstrap_servers, redis_url, 2) as started:
        b = started[1]
        store = PrincipalStore(redis_client, b.namespace)
        store.add(
            _GATEWAY_PRINCIPAL,
            _GATEWAY_SECRET,
            [ResourcePermission.parse("DATA:READ:r"), ResourcePermission.parse("DATA:WRITE:r")],
        )
        yield started


def test_a_receiver_with_its_principal_applies_a_batch_on_a_secured_site(
    sites: list[Site],
) -> None:
    a, b = sites
    server_b = b.start_server(settings_overrides=_SECURED)
    b.start_receiver(security_principal=_GATEWAY_PRINCIPAL, security_secret=_GATEWAY_SECRET)
    a.start_server(senders={"to-b": 2})
    a.start_sender("to-b", b, batch_time_interval_ms=200)

    a.client().create_region("r").put("k", "from-a")

    b.wait_for("k", b'"from-a"')
    assert server_b.stats.dead_letters_by_category.get("refused", 0) == 0


def test_a_receiver_without_a_principal_is_refused_on_a_secured_site(
    sites: list[Site],
) -> None:
    a, b = sites
    server_b = b.start_server(settings_overrides=_SECURED)
    b.start_receiver(apply_timeout_ms=3_000)
    a.start_server(senders={"to-b": 2})
    a.start_sender("to-b", b, batch_time_interval_ms=200)

    a.client().create_region("r").put("k", "from-a")

    wait_until(
        lambda: server_b.stats.dead_letters_by_category.get("refused", 0) >= 1,
        timeout_s=60,
        what="site B's server to refuse the unsigned operation",
    )
    assert "k" not in b.values()
