"""Entry expiration attributes: Geode's defaults, its refusal of local actions on a
partitioned region, and its choice of action (``EntryExpiryTask.getAction``)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from regionbus.broker.config import ServerSettings
from regionbus.broker.expiration_attributes import (
    ExpirationAction,
    ExpirationAttributes,
    RegionExpiration,
)
from regionbus.schemas.codec import decode, encode
from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import Event, EventKind

A = ExpirationAction


def test_defaults_are_geodes_never_expire_and_invalidate() -> None:
    attributes = ExpirationAttributes()
    assert (attributes.timeout_s, attributes.action) == (0, A.INVALIDATE)
    assert not RegionExpiration().enabled
    assert ServerSettings().region_expiration == {}


@pytest.mark.parametrize("action", [A.LOCAL_DESTROY, A.LOCAL_INVALIDATE])
@pytest.mark.parametrize("attribute", ["entry_time_to_live", "entry_idle_timeout"])
def test_local_actions_are_refused_on_a_server_region(action: A, attribute: str) -> None:
    with pytest.raises(ValidationError, match="not supported"):
        RegionExpiration(**{attribute: ExpirationAttributes(timeout_s=5, action=action)})
    # Without a timeout the action is never taken, and Geode accepts it.
    RegionExpiration(**{attribute: ExpirationAttributes(timeout_s=0, action=action)})


def test_negative_timeouts_and_bad_region_names_are_refused() -> None:
    with pytest.raises(ValidationError):
        ExpirationAttributes(timeout_s=-1)
    with pytest.raises(ConfigurationError, match="regions"):
        ServerSettings(region_expiration={"bad/name": RegionExpiration()})


def test_settings_read_actions_by_their_cache_xml_names() -> None:
    settings = ServerSettings.model_validate(
        {"region_expiration": {"r": {"entry_time_to_live": {"timeout_s": 3, "action": "destroy"}}}}
    )
    assert settings.region_expiration["r"].action is A.DESTROY


@pytest.mark.parametrize(
    ("ttl", "idle", "expected"),
    [
        ((10, A.DESTROY), (0, A.INVALIDATE), A.DESTROY),
        ((0, A.DESTROY), (5, A.INVALIDATE), A.INVALIDATE),
        ((10, A.DESTROY), (5, A.INVALIDATE), A.INVALIDATE),  # the shorter idle timeout's
        ((5, A.DESTROY), (10, A.INVALIDATE), A.DESTROY),
        ((5, A.DESTROY), (5, A.INVALIDATE), A.DESTROY),  # a tie: the TTL's
    ],
)
def test_the_action_follows_geodes_entry_expiry_task(
    ttl: tuple[int, A], idle: tuple[int, A], expected: A
) -> None:
    expiration = RegionExpiration(
        entry_time_to_live=ExpirationAttributes(timeout_s=ttl[0], action=ttl[1]),
        entry_idle_timeout=ExpirationAttributes(timeout_s=idle[0], action=idle[1]),
    )
    assert expiration.action is expected


def test_the_expiration_flag_travels_with_the_event() -> None:
    event = Event(EventID("server-1", 7, 0, 3), EventKind.DESTROY, "r", 4, 1, "server-1", "k")
    assert decode(encode(event._replace(expiration=True))).expiration
    assert not decode(encode(event)).expiration
