"""A server-side CacheWriter loaded by import path in the writer tests."""

from __future__ import annotations

from regionbus.schemas.callbacks import CacheWriter, EntryEvent, RegionEvent
from regionbus.schemas.errors import CacheWriterError


class RefuseNegative(CacheWriter):
    """Aborts puts of negative numbers, destroys of keys starting ``keep``, and clears."""

    def before_create(self, event: EntryEvent) -> None:
        if isinstance(event.new_value, int) and event.new_value < 0:
            raise CacheWriterError(f"negative value for {event.key}")

    before_update = before_create

    def before_destroy(self, event: EntryEvent) -> None:
        if event.key.startswith("keep"):
            raise CacheWriterError(f"{event.key} may not be destroyed")

    def before_region_clear(self, event: RegionEvent) -> None:
        raise ValueError("clearing is not allowed")  # any exception aborts
