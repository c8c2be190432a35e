"""Entry expiration attributes of a server region (Geode ``ExpirationAttributes``).

Configured per region on the servers (``ServerSettings.region_expiration``); every server of
a site must carry the same attributes, as Geode keeps them in the cluster configuration.
The rules, each from Geode's source:

- Two attributes, ``entry_time_to_live`` (counted from the entry's last create or update)
  and ``entry_idle_timeout`` (from its last create, update or get), each a timeout in
  seconds and an action. Defaults: timeout 0 = never expires, action ``invalidate``
  (``ExpirationAttributes()`` / ``ExpirationAttributes.DEFAULT``).
- Actions ``invalidate``, ``destroy``, ``local-invalidate``, ``local-destroy``
  (``ExpirationAction``; the names are Geode's cache.xml spellings). A server region here is
  partitioned (buckets), and Geode refuses the two local actions with a non-zero timeout on
  a partitioned region (``AttributesFactory.validateAttributes``: "ExpirationAction
  LOCAL_DESTROY is not supported for Partitioned Region."): so are they refused here.
- An entry expires at the earlier of ``last modified + ttl`` and ``last accessed + idle``
  (``ExpiryTask.getExpirationTime``, zero timeouts left out), and the action is chosen from
  the timeouts, not from which deadline came first: the idle action when the TTL is 0 or the
  idle timeout is the shorter, else the TTL action (``EntryExpiryTask.getAction``).
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ExpirationAction(enum.Enum):
    """What expiration does to an entry (Geode ``ExpirationAction``)."""

    INVALIDATE = "invalidate"
    DESTROY = "destroy"
    LOCAL_INVALIDATE = "local-invalidate"
    LOCAL_DESTROY = "local-destroy"

    @property
    def is_local(self) -> bool:
        """True for the local variants (refused on a server region, see the module)."""
        return self in (ExpirationAction.LOCAL_INVALIDATE, ExpirationAction.LOCAL_DESTROY)

    @property
    def is_destroy(self) -> bool:
        """True for ``destroy`` and ``local-destroy``."""
        return self in (ExpirationAction.DESTROY, ExpirationAction.LOCAL_DESTROY)


class ExpirationAttributes(BaseModel):
    """One expiration attribute: a timeout and its action (Geode ``ExpirationAttributes``).

    Attributes:
        timeout_s: Seconds before the entry expires; 0 (Geode's default) never expires.
        action: What happens then (Geode's default ``invalidate``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: int = Field(default=0, ge=0)
    action: ExpirationAction = ExpirationAction.INVALIDATE

    @property
    def timeout_ms(self) -> int:
        """The timeout in milliseconds (0 = never)."""
        return self.timeout_s * 1000


class RegionExpiration(BaseModel):
    """Entry expiration of one server region (Geode ``RegionAttributes.getEntryTimeToLive``
    and ``getEntryIdleTimeout``; ``AttributesFactory.setEntryTimeToLive`` /
    ``setEntryIdleTimeout``).

    Attributes:
        entry_time_to_live: Counted from the entry's last create or update.
        entry_idle_timeout: Counted from the entry's last create, update or server ``get``.

    Raises:
        ValueError (pydantic ``ValidationError``): a local action with a non-zero timeout
            (Geode refuses it on partitioned regions).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    entry_time_to_live: ExpirationAttributes = ExpirationAttributes()
    entry_idle_timeout: ExpirationAttributes = ExpirationAttributes()

    @model_validator(mode="after")
    def _no_local_action_on_a_partitioned_region(self) -> RegionExpiration:
        for name, attributes in (
            ("entry_time_to_live", self.entry_time_to_live),
            ("entry_idle_timeout", self.entry_idle_timeout),
        ):
            if attributes.action.is_local and attributes.timeout_s > 0:
                raise ValueError(
                    f"{name}: ExpirationAction {attributes.action.value} is not supported for "
                    "a server region (partitioned in buckets; Geode refuses it on partitioned "
                    "regions): use destroy or invalidate"
                )
        return self

    @property
    def enabled(self) -> bool:
        """True when either timeout is set."""
        return self.entry_time_to_live.timeout_s > 0 or self.entry_idle_timeout.timeout_s > 0

    @property
    def action(self) -> ExpirationAction:
        """The action taken when an entry expires (Geode ``EntryExpiryTask.getAction``): the
        idle timeout's when the TTL is 0 or the idle timeout is shorter, else the TTL's."""
        ttl, idle = self.entry_time_to_live, self.entry_idle_timeout
        if ttl.timeout_s == 0 or (idle.timeout_s != 0 and idle.timeout_s < ttl.timeout_s):
            return idle.action
        return ttl.action


__all__ = ["ExpirationAction", "ExpirationAttributes", "RegionExpiration"]
