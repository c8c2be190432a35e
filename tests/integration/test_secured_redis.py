"""Servers and the CLI against a Redis that requires an ACL user and password, and over
TLS with a test CA made here; and the ``regionbus user`` commands end to end. As in the
``secured`` compose profile, the servers and clients log in to this module's Kafka (SASL/SCRAM,
ACLs enforced) with the ACLs of `regionbus.broker.kafka_acls`."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from kafka_users import KafkaUsers
from pki import make_test_pki

from regionbus.broker.cli import main
from regionbus.broker.config import ServerSettings
from regionbus.broker.kafka_acls import client_acls, server_acls
from regionbus.broker.server import CacheServer
from regionbus.clients import ClientCache, ClientSettings
from regionbus.devstack import KafkaNode, SecuredEmbeddedRedis, TlsFiles
from regionbus.schemas.errors import NotAuthorizedError, TransportError

USER, PASSWORD = "regionbus-server", "acl-password-1"
KAFKA_SERVER_USER = "regionbus-server"
KAFKA_APP_USER = "app"


@pytest.fixture(scope="module")
def kafka_users(scram_kafka: KafkaNode) -> KafkaUsers:
    return KafkaUsers(scram_kafka)


@pytest.fixture
def server_login(kafka_users: KafkaUsers, namespace: str) -> dict[str, Any]:
    """The servers' Kafka login (``kafka_*`` settings), holding the servers' ACLs."""
    kafka_users.grant(KAFKA_SERVER_USER, server_acls(namespace))
    return kafka_users.settings(KAFKA_SERVER_USER)


@pytest.fixture
def client_factory(kafka_users: KafkaUsers, namespace: str) -> Iterator[Callable[..., Any]]:
    """Makes client caches logged in to Kafka as the application's user, each with a client
    id of its own whose ACLs the user gets; closes them at the end."""
    made: list[ClientCache] = []

    def make(**overrides: Any) -> ClientCache:
        client_id = f"app-{len(made) + 1}"
        kafka_users.grant(KAFKA_APP_USER, client_acls(namespace, client_id, KAFKA_APP_USER))
        settings: dict[str, Any] = {
            "namespace": namespace,
            **kafka_users.settings(KAFKA_APP_USER),
            "client_id": client_id,
            "fetch_wait_max_ms": 20,
            "read_timeout_ms": 15_000,
        }
        settings.update(overrides)
        cache = ClientCache(ClientSettings(**settings))
        made.append(cache)
        return cache

    try:
        yield make
    finally:
        for cache in made:
            cache.close()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def acl_redis() -> Iterator[SecuredEmbeddedRedis]:
    """redis-server with the default user off and one user limited to keys ``rb:*``."""
    with SecuredEmbeddedRedis(username=USER, password=PASSWORD, key_pattern="rb:*") as server:
        yield server


@pytest.fixture(scope="module")
def tls_redis(tls_files: TlsFiles) -> Iterator[SecuredEmbeddedRedis]:
    """redis-server on a TLS port only, requiring a client certificate, and the ACL user."""
    with SecuredEmbeddedRedis(username=USER, password=PASSWORD, tls=tls_files) as server:
        yield server


def _settings(
    server: SecuredEmbeddedRedis, namespace: str, login: dict[str, Any], **extra: Any
) -> Any:
    options: dict[str, Any] = {
        "namespace": namespace,
        **login,
        "redis_url": server.url,
        "redis_username": USER,
        "redis_password": PASSWORD,
        "regions": ["r"],
        "fetch_wait_max_ms": 100,
        "poll_timeout_ms": 20,
        "message_sync_interval_s": 0.2,
    }
    ssl = server.ssl_options()
    if ssl:
        options["redis_ssl_ca_certs"] = ssl["ssl_ca_certs"]
        options["redis_ssl_certfile"] = ssl["ssl_certfile"]
        options["redis_ssl_keyfile"] = ssl["ssl_keyfile"]
    options.update(extra)
    return ServerSettings(**options)


def _direct(server: SecuredEmbeddedRedis) -> redis.Redis:
    return redis.Redis.from_url(
        server.url, username=USER, password=PASSWORD, **server.ssl_options()
    )


@pytest.mark.parametrize("which", ["acl", "tls"])
def test_a_server_applies_operations_through_a_redis_with_acl_user_and_tls(
    which: str,
    request: pytest.FixtureRequest,
    namespace: str,
    server_login: dict[str, Any],
    client_factory: Callable[..., Any],
) -> None:
    secured: SecuredEmbeddedRedis = request.getfixturevalue(f"{which}_redis")
    with CacheServer(_settings(secured, namespace, server_login)):
        region = client_factory().create_region("r")
        region.put("k", {"v": 1})
        assert region.get("k") == {"v": 1}
    keys = _direct(secured).keys(f"rb:{{{namespace}:*}}:r:r:val")
    values = [v for key in keys for v in _direct(secured).hvals(key)]
    assert values == [b'{"v":1}']


def test_redis_refuses_a_server_without_the_acl_password(
    acl_redis: SecuredEmbeddedRedis, namespace: str, server_login: dict[str, Any]
) -> None:
    settings = _settings(acl_redis, namespace, server_login, redis_password=None)
    server = CacheServer(settings)
    with pytest.raises(TransportError):
        server.start()
    server.stop()


def test_the_tls_port_refuses_a_client_without_the_test_ca(tls_redis: SecuredEmbeddedRedis) -> None:
    client = redis.Redis.from_url(tls_redis.url, username=USER, password=PASSWORD)
    with pytest.raises(redis.ConnectionError):
        client.ping()


@pytest.fixture
def cli_env(acl_redis: SecuredEmbeddedRedis, namespace: str) -> dict[str, str]:
    return {
        "REGIONBUS_NAMESPACE": namespace,
        "REGIONBUS_REDIS_URL": acl_redis.url,
        "REGIONBUS_REDIS_USERNAME": USER,
        "REGIONBUS_REDIS_PASSWORD": PASSWORD,
    }


def test_user_commands_store_derived_keys_only_and_never_list_secrets(
    cli_env: dict[str, str], acl_redis: SecuredEmbeddedRedis, namespace: str
) -> None:
    runner = CliRunner()
    added = runner.invoke(
        main, ["user", "add", "alice", "--permission", "DATA:WRITE:flights"], env=cli_env
    )
    assert added.exit_code == 0, added.output
    secret = re.search(r"secret .*: (\S+)$", added.output, re.MULTILINE)
    assert secret is not None
    env = {**cli_env, "ALICE_SECRET": "chosen-secret"}
    bob = runner.invoke(
        main,
        ["user", "add", "bob", "--permission", "DATA:READ", "--secret-env", "ALICE_SECRET"],
        env=env,
    )
    assert bob.exit_code == 0 and "chosen-secret" not in bob.output

    listed = runner.invoke(main, ["user", "list"], env=cli_env)
    assert listed.exit_code == 0
    assert listed.output.splitlines() == ["alice\tDATA:WRITE:flights", "bob\tDATA:READ"]
    dump = b"".join(
        b"".join(f"{k!r}{v!r}".encode() for k, v in _direct(acl_redis).hgetall(key).items())
        for key in _direct(acl_redis).keys(f"rb:{namespace}:sec:principal:*")
    )
    assert secret.group(1).encode() not in dump and b"chosen-secret" not in dump

    removed = runner.invoke(main, ["user", "remove", "alice"], env=cli_env)
    assert removed.exit_code == 0
    assert runner.invoke(main, ["user", "list"], env=cli_env).output == "bob\tDATA:READ\n"


def test_user_management_needs_cluster_manage_once_an_administrator_exists(
    cli_env: dict[str, str],
) -> None:
    runner = CliRunner()
    env = {**cli_env, "REGIONBUS_SECURITY_ENABLED": "true", "ADMIN_SECRET": "admin-secret"}
    first = runner.invoke(
        main,
        ["user", "add", "admin", "--permission", "CLUSTER:MANAGE", "--secret-env", "ADMIN_SECRET"],
        env=env,
    )
    assert first.exit_code == 0, first.output
    refused = runner.invoke(main, ["user", "add", "mallory", "--permission", "*:*"], env=env)
    assert refused.exit_code != 0 and "CLUSTER:MANAGE needed" in refused.output
    wrong = {
        **env,
        "REGIONBUS_SECURITY_PRINCIPAL": "admin",
        "REGIONBUS_SECURITY_SECRET": "guess",
    }
    assert "bad credentials" in runner.invoke(main, ["user", "list"], env=wrong).output
    right = {**wrong, "REGIONBUS_SECURITY_SECRET": "admin-secret"}
    listed = runner.invoke(main, ["user", "list"], env=right)
    assert listed.exit_code == 0 and "admin\tCLUSTER:MANAGE" in listed.output


@pytest.mark.parametrize("security_enabled", [None, "false"])
def test_user_management_needs_cluster_manage_whatever_the_callers_security_setting(
    cli_env: dict[str, str], security_enabled: str | None
) -> None:
    """The check is the caller's own principal and secret: a caller who leaves
    ``REGIONBUS_SECURITY_ENABLED`` unset or false cannot grant itself anything."""
    runner = CliRunner()
    admin_env = {**cli_env, "ADMIN_SECRET": "admin-secret"}
    first = runner.invoke(
        main,
        ["user", "add", "admin", "--permission", "CLUSTER:MANAGE", "--secret-env", "ADMIN_SECRET"],
        env=admin_env,
    )
    assert first.exit_code == 0, first.output
    # None unsets a variable for the command (click's CliRunner).
    caller: dict[str, str | None] = {
        **cli_env,
        "REGIONBUS_SECURITY_ENABLED": security_enabled,
        "REGIONBUS_SECURITY_PRINCIPAL": None,
        "REGIONBUS_SECURITY_SECRET": None,
    }
    for command in (
        ["user", "add", "mallory", "--permission", "DATA:WRITE", "--permission", "DATA:READ"],
        ["user", "remove", "admin"],
        ["user", "list"],
    ):
        refused = runner.invoke(main, command, env=caller)
        assert refused.exit_code != 0, (command, refused.output)
        assert "CLUSTER:MANAGE needed" in refused.output
    wrong = {**caller, "REGIONBUS_SECURITY_PRINCIPAL": "admin", "REGIONBUS_SECURITY_SECRET": "x"}
    refused = runner.invoke(main, ["user", "add", "mallory", "--permission", "*:*"], env=wrong)
    assert refused.exit_code != 0 and "bad credentials" in refused.output
    listed = runner.invoke(
        main, ["user", "list"], env={**wrong, "REGIONBUS_SECURITY_SECRET": "admin-secret"}
    )
    assert listed.exit_code == 0, listed.output
    assert listed.output == "admin\tCLUSTER:MANAGE\n", "mallory was never added"


def test_a_secret_printed_by_user_add_lets_a_client_write_and_nothing_else(
    redis_url: str,
    namespace: str,
    server_login: dict[str, Any],
    client_factory: Callable[..., Any],
) -> None:
    env = {"REGIONBUS_NAMESPACE": namespace, "REGIONBUS_REDIS_URL": redis_url}
    added = CliRunner().invoke(
        main, ["user", "add", "app", "--permission", "DATA:WRITE:r"], env=env
    )
    secret = re.search(r"secret .*: (\S+)$", added.output, re.MULTILINE)
    assert secret is not None
    settings = ServerSettings(
        namespace=namespace,
        **server_login,
        redis_url=redis_url,
        regions=["r"],
        fetch_wait_max_ms=100,
        poll_timeout_ms=20,
        security_enabled=True,
    )
    with CacheServer(settings):
        region = client_factory(
            security_principal="app", security_secret=secret.group(1)
        ).create_region("r")
        region.put("k", 1)
        with pytest.raises(NotAuthorizedError):
            region.get("other")
