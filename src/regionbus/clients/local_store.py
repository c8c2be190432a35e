"""A client region's local copy and the rules that keep it right (Geode's client region map).

Every local change carries the region-wide entry version the server assigned, so a stale
value (an interest bulk-load answer, or a late reply racing a newer event) never overwrites
a newer one. A destroyed key leaves a tombstone (a bounded number of them) for the same
reason, and a region clear remembers its version (docs/behaviour.md §5: an entry marked destroyed is
not updated by an interest response).

During an interest registration, keys destroyed meanwhile are never revived by the
registration's answer (docs/behaviour.md §5, interest responses during registration).
During a durable client's replay, events reach listeners without changing the cache; a key
seen created in replay is remembered, so its later events reach listeners as changes of an
existing entry although the cache never held it.

Nothing here talks to a server or calls a listener: the region does, with what these
methods return. Every method is thread-safe (one re-entrant lock per region).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, NamedTuple

from regionbus.schemas.errors import EntryNotFoundError
from regionbus.schemas.messages import Entry, EventKind

MAX_TOMBSTONES: Final = 100_000
"""Destroyed keys remembered per region, oldest forgotten first."""

ENTRY_OVERHEAD_BYTES: Final = 160
"""What an entry costs the client's memory beside its key's and value's bytes: the Python
objects holding it (its dict slot, the key string's and value bytes' headers, the
``LocalEntry`` and its version). Measured with ``tracemalloc`` on CPython 3.11: 100,000
entries of a 12-character key and a 20-byte value took 187 bytes each, 155 of them
overhead. Geode's memory LRU adds a per-entry overhead the same way
(``MemoryLRUController.getPerEntryOverhead``)."""


def entry_bytes(key: str, value: bytes | None) -> int:
    """What an entry counts against a memory LRU: its key's and value's bytes and
    :data:`ENTRY_OVERHEAD_BYTES`."""
    return len(key) + (len(value) if value is not None else 0) + ENTRY_OVERHEAD_BYTES


@dataclass(slots=True)
class LocalEntry:
    """One entry of the local cache.

    Attributes:
        value: The value's bytes; None while the entry is invalid (key kept, value gone).
        serializer: Name of the serializer that made the bytes.
        version: The region-wide version the server gave the entry's last change.
    """

    value: bytes | None
    serializer: str | None
    version: int


class Removal(NamedTuple):
    """What an invalidate or destroy event found in the local cache.

    Attributes:
        held: Whether listeners should hear of it: the key is held here, was seen created in
            replay, or the event itself is replayed.
        old_value: The value before the event, when the cache held one.
        serializer: The serializer of ``old_value`` (else the event's).
    """

    held: bool
    old_value: bytes | None
    serializer: str | None


class LocalStore:
    """The entries of one client region, versioned, with tombstones and the registration
    and replay bookkeeping.

    Args:
        region: The region's name, for error messages.
        caching: True for ``CACHING_PROXY`` (keep entries); False for ``PROXY``: nothing
            is stored, and changes are reported with the server's kinds.
        max_tombstones: Destroyed keys remembered.
        max_entries: Entries kept before the least recently used is evicted (Geode
            ``EvictionAttributes.createLRUEntryAttributes(max, LOCAL_DESTROY)``); 0 keeps
            every entry. A use is a create, an update or a local read of the entry.
        max_bytes: Bytes of entries (:func:`entry_bytes`) kept before the least recently
            used is evicted (Geode ``createLRUMemoryAttributes(megabytes, sizer,
            LOCAL_DESTROY)``); 0 keeps every entry.
        on_evict: Told of each entry evicted, ``(key, entry)``, while the store's lock is
            held (the region tells its listeners, as Geode's ``EVICT_DESTROY``).
    """

    def __init__(
        self,
        region: str,
        caching: bool,
        max_tombstones: int = MAX_TOMBSTONES,
        *,
        max_entries: int = 0,
        max_bytes: int = 0,
        on_evict: Callable[[str, LocalEntry], None] | None = None,
    ) -> None:
        self.region = region
        self.caching = caching
        self._max_tombstones = max_tombstones
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._lru = bool(max_entries or max_bytes)
        self._on_evict = on_evict
        self.evictions = 0
        """Entries evicted so far."""
        self._lock = threading.RLock()
        self._entries: dict[str, LocalEntry] = {}
        self.entry_bytes = 0
        """What the entries held count against a memory LRU (:func:`entry_bytes`)."""
        self._tombstones: OrderedDict[str, int] = OrderedDict()
        self._cleared_version = -1
        self._registering = 0
        self._destroyed_while_registering: set[str] = set()
        # bucket -> region version at this connection's first registration snapshot there:
        # an event of that bucket with a higher version happened after the registration,
        # so it is applied even while the queue still replays.
        self._registered_at: dict[int, int] = {}
        self._replayed_keys: set[str] = set()

    # --- reads -------------------------------------------------------------------------

    def entry(self, key: str) -> LocalEntry | None:
        """A copy of the key's local entry (valid or invalid), or None."""
        with self._lock:
            local = self._entries.get(key)
            return (
                None if local is None else LocalEntry(local.value, local.serializer, local.version)
            )

    def valid(self, key: str) -> LocalEntry | None:
        """A copy of the key's local entry when it holds a value, else None (a use of the
        entry, for eviction)."""
        with self._lock:
            local = self._entries.get(key)
            if local is None or local.value is None:
                return None
            self._used(key)
            return LocalEntry(local.value, local.serializer, local.version)

    def keys(self) -> list[str]:
        """Keys held, valid or invalid."""
        with self._lock:
            return list(self._entries)

    def items(self) -> list[tuple[str, LocalEntry]]:
        """``(key, entry)`` of every key held (the entries are shared; do not change them)."""
        with self._lock:
            return list(self._entries.items())

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    # --- the version rule --------------------------------------------------------------

    def is_newer(self, key: str, version: int) -> bool:
        """Whether a change of ``key`` at ``version`` is newer than what is known here: the
        local entry's version, else its tombstone's, else the last region clear's."""
        with self._lock:
            return self._newer(key, version)

    def _newer(self, key: str, version: int) -> bool:
        """:meth:`is_newer` for a caller that holds the lock (once per event: no second
        acquisition of the re-entrant lock)."""
        local = self._entries.get(key)
        if local is not None:
            return version > local.version
        tomb = self._tombstones.get(key)
        if tomb is not None and version <= tomb:
            return False
        return version > self._cleared_version

    # Every change of what is held goes through these four, so ``entry_bytes`` stays the
    # sum of the entries' sizes whatever the path (events, replies, loads, local changes).

    def _put(self, key: str, local: LocalEntry) -> None:
        old = self._entries.get(key)
        if old is not None:
            self.entry_bytes -= entry_bytes(key, old.value)
        self._entries[key] = local
        self.entry_bytes += entry_bytes(key, local.value)

    def _pop(self, key: str) -> LocalEntry | None:
        local = self._entries.pop(key, None)
        if local is not None:
            self.entry_bytes -= entry_bytes(key, local.value)
        return local

    def _revalue(self, local: LocalEntry, value: bytes | None) -> None:
        self.entry_bytes += (len(value) if value is not None else 0) - (
            len(local.value) if local.value is not None else 0
        )
        local.value = value

    def _clear(self) -> None:
        self._entries.clear()
        self.entry_bytes = 0

    def _used(self, key: str) -> None:
        """The entry was used: it becomes the last to be evicted (a dict keeps insertion
        order; taking the key out and back in moves it to the end)."""
        if self._lru:
            self._entries[key] = self._entries.pop(key)

    def _over(self) -> bool:
        return bool(
            (self._max_entries and len(self._entries) > self._max_entries)
            or (self._max_bytes and self.entry_bytes > self._max_bytes)
        )

    def _evict_over(self, added: str) -> None:
        """Evict the least recently used entries beyond ``max_entries`` or ``max_bytes``
        (never ``added``). Each leaves a tombstone of its version, so an older event of
        the key is still older; a newer one creates it again (an evicted key still gets
        its events)."""
        if not self._lru:
            return
        while self._over():
            key = next(iter(self._entries))
            if key == added:
                return
            local = self._pop(key)
            assert local is not None
            self._tombstones[key] = local.version
            self._tombstones.move_to_end(key)
            if len(self._tombstones) > self._max_tombstones:
                self._tombstones.popitem(last=False)
            self.evictions += 1
            if self._on_evict is not None:
                self._on_evict(key, local)

    def _remember_tombstone(self, key: str, version: int) -> None:
        if self._registering:
            self._destroyed_while_registering.add(key)
        self._tombstones[key] = version
        self._tombstones.move_to_end(key)
        if len(self._tombstones) > self._max_tombstones:
            self._tombstones.popitem(last=False)

    # --- changes from events and replies -----------------------------------------------

    def apply_value(
        self,
        key: str,
        value: bytes | None,
        serializer: str | None,
        version: int,
        *,
        apply: bool = True,
        server_kind: EventKind = EventKind.UPDATE,
    ) -> tuple[EventKind, bytes | None]:
        """Take a created or updated value (an event, a reply to this client's put, a get).

        Args:
            key, value, serializer, version: The change.
            apply: False in durable replay: the cache is unchanged, the key is remembered
                as seen.
            server_kind: The kind the server reported; a ``PROXY`` region reports it as is.

        Returns:
            ``(kind, old value)``. Applied to a caching region: UPDATE when the key was held
            (or seen in replay) and CREATE otherwise, with the value it replaced, if any.
            Not applied (durable replay): ``server_kind`` and no old value, as Geode's
            ``LocalRegion.basicBridgeClientUpdate`` only invokes the put callbacks there
            (``isCreate ? AFTER_CREATE : AFTER_UPDATE``, the region map untouched).
        """
        with self._lock:
            local = self._entries.get(key)
            old = local.value if local is not None else None
            if not self.caching:
                return server_kind, old
            if not apply:
                self._replayed_keys.add(key)
                return server_kind, None
            seen = local is not None or key in self._replayed_keys
            # An invalid entry takes a valid value of its own version too (as `load`): a
            # receive_values=False invalidate carries the version of the update it stands
            # for, and the get that follows it fetches that very version.
            refill = local is not None and local.value is None and version >= local.version
            if self._newer(key, version) or (refill and value is not None):
                if local is None:
                    self._put(key, LocalEntry(value, serializer, version))
                    self._tombstones.pop(key, None)
                else:
                    self._revalue(local, value)
                    local.serializer, local.version = serializer, version
                    self._used(key)
                self._evict_over(key)
            return (EventKind.UPDATE if seen else EventKind.CREATE), old

    def apply_removal(
        self,
        kind: EventKind,
        key: str,
        version: int,
        serializer: str | None,
        *,
        apply: bool = True,
        replay: bool = False,
    ) -> Removal:
        """Take a server invalidate or destroy of ``key`` at ``version``.

        Args:
            kind: INVALIDATE or DESTROY.
            key, version: The change.
            serializer: The event's serializer, reported when nothing is held.
            apply: Change the cache (False in durable replay before the registration).
            replay: The event is replayed (listeners hear it whatever the cache holds).

        Returns:
            Whether listeners hear it, and the old value. An invalidate applied to a
            caching region is heard only when the local entry exists and holds a valid
            value (Geode ``AbstractRegionMap.invalidate``: an entry already invalid is not
            invalidated again, so ``afterInvalidate`` does not fire). A replayed event not
            applied is always heard, without an old value (Geode
            ``LocalRegion.basicBridgeClientInvalidate`` / ``basicBridgeClientDestroy``
            only invoke the callbacks before the marker).
        """
        with self._lock:
            local = self._entries.get(key)
            if not apply and replay:
                if kind is EventKind.DESTROY:
                    self._replayed_keys.discard(key)
                return Removal(True, None, serializer)
            held = local is not None or replay or key in self._replayed_keys
            if (
                kind is EventKind.INVALIDATE
                and local is not None
                and self.caching
                and (local.value is None or (apply and not self._newer(key, version)))
            ):
                # Already invalid, or older than what is held (e.g. the invalidate standing
                # for the create that a get had already loaded): Geode invalidates nothing
                # then (a concurrency conflict), so no listener hears it.
                held = False
            if kind is EventKind.DESTROY:
                self._replayed_keys.discard(key)
            old = local.value if local is not None else None
            old_serializer = local.serializer if local is not None else serializer
            if apply and self.caching and self._newer(key, version):
                if kind is EventKind.DESTROY:
                    self._pop(key)
                    self._remember_tombstone(key, version)
                elif local is not None:
                    self._revalue(local, None)
                    local.version = version
            return Removal(held, old, old_serializer)

    def destroyed(self, key: str, version: int) -> LocalEntry | None:
        """Take this client's own destroy of ``key``, applied by the server at ``version``.

        Returns:
            What the cache held before (for the listeners' old value), or None.
        """
        with self._lock:
            local = self._entries.get(key)
            if self.caching and self._newer(key, version):
                self._pop(key)
                self._remember_tombstone(key, version)
            return local

    def cleared(self, version: int | None) -> None:
        """Take a region clear or destroy at ``version``: drop every entry and tombstone;
        older changes arriving later are ignored."""
        with self._lock:
            self._clear()
            self._tombstones.clear()
            self._replayed_keys.clear()
            if version is not None:
                self._cleared_version = max(self._cleared_version, version)

    def invalidated_all(self, version: int | None) -> None:
        """Take this client's own region invalidate at ``version``: every entry held keeps
        its key and loses its value."""
        with self._lock:
            for local in self._entries.values():
                self._revalue(local, None)
                if version is not None:
                    local.version = max(local.version, version)

    def forget_replayed(self) -> None:
        """Forget the keys seen in replay (a replayed region clear or destroy)."""
        with self._lock:
            self._replayed_keys.clear()

    # --- local-only changes ------------------------------------------------------------

    def invalidate_local(self, key: str) -> LocalEntry:
        """Drop the local value of ``key`` (Geode ``localInvalidate``).

        Returns:
            The entry as it was before.

        Raises:
            EntryNotFoundError: the key is not held here.
        """
        with self._lock:
            local = self._entries.get(key)
            if local is None:
                raise EntryNotFoundError(f"entry {key!r} not in local region {self.region!r}")
            before = LocalEntry(local.value, local.serializer, local.version)
            self._revalue(local, None)
            return before

    def destroy_local(self, key: str) -> LocalEntry:
        """Remove ``key`` from the local cache only (Geode ``localDestroy``).

        Returns:
            The entry removed.

        Raises:
            EntryNotFoundError: the key is not held here.
        """
        with self._lock:
            local = self._pop(key)
            if local is None:
                raise EntryNotFoundError(f"entry {key!r} not in local region {self.region!r}")
            if self._registering:
                self._destroyed_while_registering.add(key)
            return local

    def clear_local(self) -> None:
        """Empty the local cache only (Geode ``localClear``); versions and tombstones stay."""
        with self._lock:
            self._clear()
            self._replayed_keys.clear()

    # --- interest registration ---------------------------------------------------------

    def begin_registration(self, keys: Iterable[str] | None) -> None:
        """Start an interest registration: silently drop the local entries it may affect
        (the given keys, or every entry for ``None``: all keys or a regex; docs/behaviour.md §3 step
        1) and watch for destroys until `end_registration`."""
        with self._lock:
            self.drop(keys)
            self._registering += 1

    def registered(self, bucket: int, version: int) -> None:
        """Note the region version of a bucket's registration snapshot; the lowest one of
        this connection is kept (see `registered_at`)."""
        with self._lock:
            known = self._registered_at.get(bucket, version)
            self._registered_at[bucket] = min(known, version)

    def registered_at(self, bucket: int) -> int | None:
        """The region version of this connection's first registration snapshot of a bucket:
        a replayed event of that bucket with a higher version happened after it (so it is
        applied although it is replayed); None before any registration."""
        with self._lock:
            return self._registered_at.get(bucket)

    def load(self, entry: Entry) -> bool:
        """Apply one bulk-load entry of a registration answer (no listener), by the rules of
        docs/behaviour.md §5, made version-aware: an entry destroyed meanwhile is not revived; a
        valid local value is kept unless the answer is newer; an invalid local entry takes a
        valid value of the same or a newer version.

        Returns:
            True when the entry was taken.
        """
        key = entry.key
        with self._lock:
            if key in self._destroyed_while_registering:
                return False
            local = self._entries.get(key)
            if local is not None and local.value is None:
                take = entry.value is not None and entry.version >= local.version
            else:
                take = self._newer(key, entry.version)
            if take:
                self._put(key, LocalEntry(entry.value, entry.serializer, entry.version))
                self._tombstones.pop(key, None)
                if local is not None:
                    self._used(key)
                self._evict_over(key)
            return take

    def load_all(self, entries: Iterable[Entry]) -> None:
        """:meth:`load` each of ``entries`` (a registration answer's chunk)."""
        with self._lock:
            for entry in entries:
                self.load(entry)

    def drop(self, keys: Iterable[str] | None) -> None:
        """Silently drop these local entries (every one: None), as a registration that
        failed leaves nothing it loaded."""
        with self._lock:
            if keys is None:
                self._clear()
            else:
                for key in keys:
                    self._pop(key)

    def end_registration(self) -> None:
        """End a registration started with `begin_registration`."""
        with self._lock:
            self._registering -= 1
            if not self._registering:
                self._destroyed_while_registering.clear()

    def reset(self) -> None:
        """Forget everything (the subscription queue was lost: interest is registered again
        from scratch, docs/behaviour.md §3 non-HA failover)."""
        with self._lock:
            self._clear()
            self._tombstones.clear()
            self._registered_at.clear()
            self._replayed_keys.clear()


__all__ = [
    "ENTRY_OVERHEAD_BYTES",
    "MAX_TOMBSTONES",
    "LocalEntry",
    "LocalStore",
    "Removal",
    "entry_bytes",
]
