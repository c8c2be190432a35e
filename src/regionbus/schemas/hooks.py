"""Application hooks that more than one process kind runs, and how any hook is built.

A hook is named in settings as ``"package.module:ClassName"`` and built by
:func:`load_hook` with no arguments (never unpickled).

:class:`GatewayEventFilter` (Geode ``GatewayEventFilter``): ``before_enqueue`` runs in the
cache server when an event would be queued for a gateway sender (False = never queued);
``before_transmit`` runs in the sender before a batch is sent (False = not sent, still
removed); ``after_acknowledgement`` runs after the remote site acked the batch.
"""

from __future__ import annotations

import importlib
from typing import Any, TypeVar

from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.messages import Event

T = TypeVar("T")


class GatewayEventFilter:
    """Filters what a gateway sender queues and transmits. Every method defaults to pass."""

    def before_enqueue(self, event: Event) -> bool:
        """Called in the cache server before the event is queued; False drops it."""
        return True

    def before_transmit(self, event: Event) -> bool:
        """Called in the sender before the event is sent; False leaves it out of the batch
        (it is still removed from the queue with the batch)."""
        return True

    def after_acknowledgement(self, event: Event) -> None:
        """Called in the sender after the remote site acked the batch holding the event."""


def load_hook(name: str, base: type[T]) -> T:
    """Instantiate ``"package.module:ClassName"`` and check it is a ``base``.

    Args:
        name: The class's import path.
        base: The class it must derive from.

    Returns:
        A new instance (built with no arguments).

    Raises:
        ConfigurationError: the name does not import or is not a ``base``.
    """
    module_name, _, class_name = name.partition(":")
    try:
        instance: Any = getattr(importlib.import_module(module_name), class_name)()
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise ConfigurationError(f"cannot load {base.__name__} {name!r}: {exc}") from exc
    if not isinstance(instance, base):
        raise ConfigurationError(f"{name!r} is not a {base.__name__}")
    return instance


__all__ = ["GatewayEventFilter", "load_hook"]
