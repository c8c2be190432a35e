"""Function execution with security on: executing a function needs ``DATA:WRITE`` on its
region (on every region, on the servers), as Geode's default
``Function.getRequiredPermissions``; the changes a function makes are the servers' own,
signed and applied whatever the caller may write."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kafka_users import KafkaUsers
from support import wait_until
from test_security import (
    SECRETS,
    _client,
    _perms,
    _stored,
    client_factory,  # noqa: F401  (a fixture of that module, used here)
    kafka_users,  # noqa: F401
    secured_settings,
)

from regionbus import (
    Function,
    FunctionContext,
    FunctionService,
    NotAuthorizedError,
    RegionFunctionContext,
)
from regionbus.broker.principals import PrincipalStore
from regionbus.broker.server import CacheServer


class PutToS(Function):
    """Puts its arguments' key in region ``s``, which its caller may not write."""

    id = "put-to-s"

    def execute(self, context: FunctionContext) -> None:
        assert isinstance(context, RegionFunctionContext)
        context.cache.get_region("s").put(context.arguments, "by the servers")
        context.result_sender.last_result(context.member_name)


@pytest.fixture
def function_server(
    namespace: str,
    kafka_users: KafkaUsers,  # noqa: F811
    redis_url: str,
    redis_client: redis.Redis,
) -> Iterator[CacheServer]:
    """A secured server with the function registered; principals ``writer`` (read and
    write ``r`` only) and ``reader`` (read ``r``)."""
    store = PrincipalStore(redis_client, namespace)
    store.add("writer", SECRETS["writer"], _perms("DATA:READ:r", "DATA:WRITE:r"))
    store.add("reader", SECRETS["reader"], _perms("DATA:READ:r"))
    with CacheServer(
        secured_settings(namespace, kafka_users, redis_url), functions=[PutToS()]
    ) as server:
        yield server


def test_executing_needs_data_write_and_a_functions_changes_are_the_servers(
    function_server: CacheServer,
    client_factory: Any,  # noqa: F811
    redis_client: redis.Redis,
    namespace: str,
) -> None:
    writer = _client(client_factory, "writer")
    reader = _client(client_factory, "reader")
    on_r = FunctionService.on_region(writer.create_region("r")).with_filter(["k"])

    assert on_r.set_arguments("made").execute("put-to-s").get_result() == [
        function_server.settings.member_id
    ]
    wait_until(lambda: _stored(redis_client, namespace, "s", "made") == b'"by the servers"')

    refused = FunctionService.on_region(reader.create_region("r")).with_filter(["k"])
    with pytest.raises(NotAuthorizedError, match="lacks DATA:WRITE:r"):
        refused.set_arguments("refused").execute("put-to-s")
    with pytest.raises(NotAuthorizedError, match="lacks DATA:WRITE for EXECUTE_FUNCTION"):
        FunctionService.on_servers(writer).execute("put-to-s")
    assert _stored(redis_client, namespace, "s", "refused") is None
