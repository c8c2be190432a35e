"""docs/behaviour.md §6 conflict rule at apply time, in the Redis store: a gateway event older than
the entry's last change from another site is refused (STALE), ties go to the higher site id,
destroys leave a tombstone, a resend of a refused event is a duplicate, a clear forgets
the versions, and a single-site member stores none."""

from __future__ import annotations

from typing import Any

import redis

from regionbus.broker.store import ApplyResult, GatewayVersion, RegionStore
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import EventKind, OperationKind
from regionbus.schemas.naming import bucket_of


class _Apply:
    def __init__(self, store: RegionStore) -> None:
        self.store = store
        self.sequence = 0

    def __call__(
        self,
        kind: OperationKind,
        key: str,
        version: GatewayVersion | None,
        gateway: bool,
        member: str = "m",
        sequence: int | None = None,
    ) -> ApplyResult:
        bucket = bucket_of("r", key, 16)
        if sequence is None:
            sequence, self.sequence = self.sequence, self.sequence + 1
        args: Any = self.store.entry_args(
            kind,
            "r",
            key,
            b"v" if kind is OperationKind.PUT else None,
            "json",
            EventID(member, 1, sequence, bucket),
            bucket,
            sequence,
            False,
            gateway_version=version,
            from_gateway=gateway,
        )
        result = self.store.run_batch([args])[0]
        assert isinstance(result, ApplyResult)
        return result


def test_the_store_refuses_older_gateway_events_and_keeps_tombstones(
    redis_client: redis.Redis, namespace: str
) -> None:
    store = RegionStore(redis_client, namespace, 16)
    store.create_region("r")
    apply = _Apply(store)
    put, destroy = OperationKind.PUT, OperationKind.DESTROY

    assert apply(put, "k", GatewayVersion(100, 2), gateway=False).status == "OK"
    assert apply(put, "k", GatewayVersion(50, 1), gateway=True).status == "STALE"
    assert apply(put, "k", GatewayVersion(100, 1), gateway=True).status == "STALE"  # tie: 2 > 1
    assert apply(put, "k", GatewayVersion(100, 3), gateway=True).status == "OK"  # tie: 3 > 2
    assert store.gateway_version("r", "k", bucket_of("r", "k", 16)) == GatewayVersion(100, 3)
    assert apply(put, "k", GatewayVersion(10, 3), gateway=True).status == "OK"  # same site
    assert apply(put, "k", GatewayVersion(1, 2), gateway=False).status == "OK"  # local: no check

    stale = apply(put, "k", GatewayVersion(0, 1), gateway=True, member="x", sequence=7)
    assert stale.status == "STALE" and stale.event_kind is None
    again = apply(put, "k", GatewayVersion(0, 1), gateway=True, member="x", sequence=7)
    assert again.status == "DUP" and again.event_kind is None

    assert apply(destroy, "k", GatewayVersion(500, 2), gateway=False).event_kind is (
        EventKind.DESTROY
    )
    assert apply(put, "k", GatewayVersion(400, 1), gateway=True).status == "STALE"  # tombstone
    assert "k" not in store.entries("r")

    store.apply_region(OperationKind.CLEAR, "r", EventID("m", 2, 0, 0), 0, 0)
    assert store.gateway_version("r", "k", bucket_of("r", "k", 16)) is None
    assert apply(put, "k", GatewayVersion(400, 1), gateway=True).status == "OK"

    assert apply(put, "single-site", None, gateway=False).status == "OK"
    assert store.gateway_version("r", "single-site", bucket_of("r", "single-site", 16)) is None
