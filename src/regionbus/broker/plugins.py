"""The server-side ``CacheWriter``s, ``CacheListener``s and ``CacheLoader`` of each region.

Named per region in the server's ``plugins`` setting as ``"package.module:ClassName"`` (a
class may be both a writer and a listener), or handed to the server in code. Writers run
before an entry or region change is applied and abort it by raising; listeners run after
it, and one that fails is logged while the others still run (docs/behaviour.md §1).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from regionbus.schemas.callbacks import (
    CacheListener,
    CacheLoader,
    CacheWriter,
    EntryEvent,
    RegionEvent,
    notify_listeners,
    region_event_kind,
    run_writer,
)
from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.hooks import load_hook
from regionbus.schemas.messages import Event, EventKind, Operation
from regionbus.schemas.serializers import serializer_named

log = logging.getLogger("regionbus.server")


def _decode_value(data: bytes | None, serializer: str | None) -> Any:
    return None if data is None else serializer_named(serializer).loads(data)


class ServerPlugins:
    """The writers, listeners and loaders of each region on this server.

    Args:
        listeners: ``{region: [CacheListener, ...]}``, called in order.
        writers: ``{region: [CacheWriter, ...]}``, called in order.
        loaders: ``{region: CacheLoader}`` (Geode: one loader per region).
    """

    def __init__(
        self,
        listeners: Mapping[str, Sequence[CacheListener]] | None = None,
        writers: Mapping[str, Sequence[CacheWriter]] | None = None,
        loaders: Mapping[str, CacheLoader] | None = None,
    ) -> None:
        self.loaders: dict[str, CacheLoader] = dict(loaders or {})
        self.listeners: dict[str, list[CacheListener]] = {
            r: list(items) for r, items in (listeners or {}).items()
        }
        self.writers: dict[str, list[CacheWriter]] = {
            r: list(items) for r, items in (writers or {}).items()
        }

    @classmethod
    def load(
        cls,
        spec: Mapping[str, Sequence[str]],
        listeners: Mapping[str, Sequence[CacheListener]] | None = None,
        writers: Mapping[str, Sequence[CacheWriter]] | None = None,
        loaders: Mapping[str, CacheLoader] | None = None,
    ) -> ServerPlugins:
        """Instantiate the plugins named in ``spec`` and add the given instances after them.

        Args:
            spec: ``{region: ["package.module:ClassName", ...]}`` (the ``plugins`` setting).
            listeners: More listeners by region.
            writers: More writers by region.
            loaders: The loader of each region not named in ``spec``.

        Raises:
            ConfigurationError: a name does not import, or is none of ``CacheListener``,
                ``CacheWriter`` and ``CacheLoader``; or a region has two loaders.
        """
        plugins = cls()
        for region, names in spec.items():
            for name in names:
                instance = load_hook(name, object)
                if not isinstance(instance, CacheListener | CacheWriter | CacheLoader):
                    raise ConfigurationError(
                        f"plugin {name!r} is none of CacheListener, CacheWriter, CacheLoader"
                    )
                if isinstance(instance, CacheLoader):
                    plugins.add_loader(region, instance)
                if isinstance(instance, CacheListener):
                    plugins.listeners.setdefault(region, []).append(instance)
                if isinstance(instance, CacheWriter):
                    plugins.writers.setdefault(region, []).append(instance)
        for region, items in (listeners or {}).items():
            plugins.listeners.setdefault(region, []).extend(items)
        for region, witems in (writers or {}).items():
            plugins.writers.setdefault(region, []).extend(witems)
        for region, loader in (loaders or {}).items():
            plugins.add_loader(region, loader)
        return plugins

    def add_loader(self, region: str, loader: CacheLoader) -> None:
        """Give a region its loader.

        Raises:
            ConfigurationError: the region has one already (Geode: one per region).
        """
        if region in self.loaders:
            raise ConfigurationError(f"region {region!r} has a CacheLoader already")
        self.loaders[region] = loader

    def has_writers(self, region: str) -> bool:
        """Whether any writer guards the region (its changes then go one by one)."""
        return bool(self.writers.get(region))

    def has_listeners(self, region: str) -> bool:
        """Whether any listener watches the region (its applies then return old values)."""
        return bool(self.listeners.get(region))

    def veto_entry(self, op: Operation, kind: EventKind, old_value: bytes | None) -> None:
        """Run the region's writers before an entry change.

        Args:
            op: The operation (PUT, DESTROY or INVALIDATE) with its key.
            kind: What it will be: CREATE or UPDATE for a put, DESTROY, or INVALIDATE (which
                no writer may veto, as in Geode).
            old_value: The entry's value now, if any.

        Raises:
            CacheWriterError: a writer aborted the change.
        """
        assert op.key is not None
        event = EntryEvent(
            region=op.region,
            key=op.key,
            kind=kind,
            event_id=op.event_id,
            version=-1,
            origin_remote=True,
            new_value_bytes=op.value,
            old_value_bytes=old_value,
            serializer=op.serializer,
            possible_duplicate=op.possible_duplicate,
            callback_argument=op.callback_argument,
            decoder=_decode_value,
        )
        for writer in self.writers.get(op.region, []):
            run_writer(writer, event, "server")

    def veto_region(self, op: Operation) -> None:
        """Run the region's writers before a region clear or destroy.

        Raises:
            CacheWriterError: a writer aborted it.
        """
        event = RegionEvent(
            op.region, region_event_kind(op.kind), op.event_id, True, op.callback_argument
        )
        for writer in self.writers.get(op.region, []):
            run_writer(writer, event, "server")

    def after_entry(self, event: Event, old_value: bytes | None) -> None:
        """Tell the region's listeners of an applied entry change."""
        listeners = self.listeners.get(event.region)
        if listeners:
            notify_listeners(
                listeners,
                EntryEvent.of(event, old_value_bytes=old_value, decoder=_decode_value),
                log,
            )

    def after_region(self, event: Event) -> None:
        """Tell the region's listeners of an applied region clear or destroy."""
        listeners = self.listeners.get(event.region)
        if listeners:
            notify_listeners(
                listeners,
                RegionEvent(
                    event.region, event.kind, event.event_id, True, event.callback_argument
                ),
                log,
            )


__all__ = ["ServerPlugins"]
