"""A client region: the local copy (or none) of a server region, its callbacks and interest.

``CACHING_PROXY`` keeps entries locally and serves reads from them; ``PROXY`` keeps none
and sends every read to the server (Geode ``ClientRegionShortcut``).

Order of a change made here (docs/behaviour.md §1): client ``CacheWriter`` (may abort) -> server
(server writer may abort -> apply -> server listeners -> distribution) -> only then this
client's cache and listeners. An abort anywhere raises and changes nothing.

A region wires its parts: the local copy and its version rules
(`regionbus.clients.local_store.LocalStore`), the requests to the servers
(`regionbus.clients.server_proxy.ServerRegionProxy`), its interest registrations
(`regionbus.clients.interest.RegionInterest`), how a pushed event changes it
(`regionbus.clients.server_events`), and the application's listeners and writer
(`regionbus.schemas.callbacks`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from regionbus.clients.arguments import check_entry
from regionbus.clients.interest import ALL_KEYS, RegionInterest
from regionbus.clients.local_store import LocalEntry, LocalStore
from regionbus.clients.region_attributes import (
    ClientRegionShortcut,
    EvictionAttributes,
    RegionShortcut,
)
from regionbus.clients.region_interest_ops import RegionInterestOperations
from regionbus.clients.region_server_ops import RegionServerOperations
from regionbus.clients.region_values import RegionValues
from regionbus.clients.server_events import apply_server_event
from regionbus.clients.server_proxy import CacheConnection, ServerRegionProxy, raise_first_error
from regionbus.schemas.callbacks import (
    CacheListener,
    CacheWriter,
    EntryEvent,
    RegionEvent,
    notify_listeners,
    region_event_kind,
    run_writer,
)
from regionbus.schemas.errors import EntryNotFoundError, RegionNotFoundError
from regionbus.schemas.limits import MAX_BULK_ENTRIES, check_count
from regionbus.schemas.messages import (
    Event,
    EventKind,
    Operation,
    OperationKind,
    Reply,
)
from regionbus.schemas.serializers import Serializer

log = logging.getLogger("regionbus.client")


class Region(RegionServerOperations, RegionInterestOperations):
    """A region of a :class:`ClientCache`. Create it with ``ClientCache.create_region``.

    Keys are strings; values are anything the region's serializer encodes (JSON default).
    Geode's conditional operations and server reads (``put_if_absent``, ``replace``,
    ``remove``, ``get_all``, ``contains_key_on_server``, ``size_on_server``) are
    :class:`regionbus.clients.region_server_ops.RegionServerOperations`'; its interest
    registrations are
    :class:`regionbus.clients.region_interest_ops.RegionInterestOperations`'.
    """

    def __init__(
        self,
        cache: CacheConnection,
        name: str,
        shortcut: RegionShortcut,
        serializer: Serializer,
        listeners: Iterable[CacheListener],
        writer: CacheWriter | None,
        eviction: EvictionAttributes | None = None,
    ) -> None:
        self._cache = cache
        self.name = name
        self.shortcut = shortcut
        self.serializer = serializer
        self.listeners: list[CacheListener] = list(listeners)
        self.writer = writer
        self.eviction = eviction
        self._caching = shortcut is RegionShortcut.CACHING_PROXY
        self._store = LocalStore(
            name,
            self._caching,
            max_entries=eviction.max_entries if eviction is not None else 0,
            max_bytes=eviction.max_bytes if eviction is not None else 0,
            on_evict=self._evicted,
        )
        self._server = ServerRegionProxy(cache, name, serializer.name)
        self._destroyed = False
        self._interest = RegionInterest(cache, self._server, self._store)
        self._values = RegionValues(name, lambda: self.serializer)

    @property
    def region_service(self) -> CacheConnection:
        """The client cache this region belongs to (Geode ``Region.getRegionService``)."""
        return self._cache

    # --- reads -------------------------------------------------------------------------

    def get(self, key: str, callback_argument: bytes | None = None) -> Any:
        """The value of a key: from the local cache when valid there, else from the server.

        A value fetched from the server is kept locally (``CACHING_PROXY``) and fires
        ``after_create``/``after_update`` with ``is_load=True`` (Geode ``LOCAL_LOAD_*``).

        Args:
            key: Entry key.
            callback_argument: Unused by the server's get; kept for Geode parity.

        Returns:
            The decoded value, or None when the entry does not exist or is invalid on the
            server too.

        Raises:
            InvalidKeyError: the key is refused, as for :meth:`put` (nothing is sent).
            RegionNotFoundError: the region was destroyed, here or on the server.
            ServerTimeoutError: no reply within ``read_timeout_ms``.
            UnconnectedError: the cache is closed and the key is not valid locally.
        """
        self._check_alive()
        check_entry(key)
        if self._caching:
            local = self._store.valid(key)
            if local is not None:
                assert local.value is not None
                return self._values.decode(local.value, local.serializer)
        op = self._server.operation(OperationKind.GET, key=key)
        return self._loaded(key, self._server.one(op, self._server.bucket(key)))

    def _loaded(self, key: str, reply: Reply) -> Any:
        """The value a server get answered, decoded (None when absent or invalid), kept
        locally as a load (listeners get ``is_load=True``)."""
        if not reply.found or reply.value is None:
            return None
        if self._caching and reply.version is not None:
            kind, old = self._store.apply_value(key, reply.value, reply.serializer, reply.version)
            self._notify(
                self._values.entry_event(
                    kind,
                    key,
                    reply.version,
                    new=reply.value,
                    old=old,
                    serializer=reply.serializer,
                    is_load=True,
                )
            )
        return self._values.decode(reply.value, reply.serializer)

    def keys(self) -> list[str]:
        """Keys held in the local cache (valid or invalid). Geode ``keySet()``."""
        return self._store.keys()

    def contains_key(self, key: str) -> bool:
        """Whether the local cache holds the key (valid or invalid). Geode ``containsKey``."""
        return key in self._store

    def contains_value_for_key(self, key: str) -> bool:
        """Whether the local cache holds a valid value for the key."""
        return self._store.valid(key) is not None

    def local_entries(self) -> dict[str, Any]:
        """A snapshot of the local cache: ``{key: decoded value or None if invalid}``."""
        items = [(k, e.value, e.serializer) for k, e in self._store.items()]
        return {k: self._values.decode(v, s) if v is not None else None for k, v, s in items}

    # --- Python's mapping idioms (Geode's Region is a java.util.Map) -------------------

    def __len__(self) -> int:
        """Entries of the local cache (Geode ``Region.size()``: local)."""
        return len(self._store)

    def __contains__(self, key: object) -> bool:
        """``key in region``: the local cache holds the key, valid or invalid (Geode
        ``containsKey``, local; :meth:`contains_key_on_server` asks the server)."""
        return isinstance(key, str) and key in self._store

    def __getitem__(self, key: str) -> Any:
        """``region[key]``: :meth:`get` (the local copy when valid, else the server).

        Raises:
            KeyError: neither holds a valid value (Geode's ``get`` answers null).
            What :meth:`get` raises.
        """
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        """``region[key] = value``: :meth:`put` (to the server, then locally)."""
        self.put(key, value)

    def __delitem__(self, key: str) -> None:
        """``del region[key]``: :meth:`destroy` (on the server, then locally).

        Raises:
            KeyError: the server has no such entry (from :class:`EntryNotFoundError`).
            What :meth:`destroy` raises otherwise.
        """
        try:
            self.destroy(key)
        except EntryNotFoundError as exc:
            raise KeyError(key) from exc

    def keys_on_server(self) -> list[str]:
        """Every key of the region on the server. Geode ``keySetOnServer()``.

        Raises:
            RegionNotFoundError: the region is not defined on the server.
            ServerTimeoutError: not every bucket answered within ``read_timeout_ms``.
        """
        self._check_alive()
        replies = self._server.every_bucket(OperationKind.KEYS)
        return [e.key for r in replies for e in r.entries]

    # --- writes ------------------------------------------------------------------------

    def put(self, key: str, value: Any, callback_argument: bytes | None = None) -> None:
        """Create or update an entry on the server, then locally.

        Args:
            key: Entry key.
            value: The value (encoded with the region's serializer).
            callback_argument: Opaque bytes passed to writers and listeners everywhere.

        Raises:
            CacheWriterError: a client or server writer aborted (nothing changed).
            InvalidKeyError: the key is not a str, not valid Unicode, or over
                ``regionbus.schemas.entry_checks.MAX_KEY_SIZE_BYTES`` (nothing is sent).
            ValueTooLargeError: the encoded value exceeds the server's maximum, or the
                most a message carries (then nothing is sent).
            RegionNotFoundError: the region is not defined on the server.
            SerializationError: the value cannot be encoded.
            ServerTimeoutError: no reply within ``read_timeout_ms``.
            UnconnectedError: the cache is closed.
        """
        op, bucket = self._prepare_put(key, value, callback_argument)
        self._finish_put(op, self._server.one(op, bucket))

    def put_async(
        self, key: str, value: Any, callback_argument: bytes | None = None
    ) -> Future[None]:
        """Like :meth:`put`, pipelined: returns once sent; the future completes when applied.

        The client writer runs before this returns (and may raise). The local apply and
        listeners run on the pool's reply thread when the reply arrives, so they must not
        block on other region calls.

        Returns:
            A future that resolves to None, or raises what :meth:`put` would.
        """
        op, bucket = self._prepare_put(key, value, callback_argument)
        return self._server.pipelined(op, bucket, self._finish_put)

    def put_all(self, entries: Mapping[str, Any], callback_argument: bytes | None = None) -> None:
        """Put many entries, each with its own consecutive sequence id, sent a window at a
        time (`regionbus.schemas.limits`) so other clients' operations are taken between
        them. Client writers run for every entry first: an abort raises before sending.

        Raises:
            RequestLimitError: more than `regionbus.schemas.limits.MAX_BULK_ENTRIES` entries
                (nothing is sent).
            CacheWriterError: a client writer aborted (nothing was sent).
            InvalidKeyError, ValueTooLargeError, SerializationError: an entry is refused
                as :meth:`put` would refuse it (nothing is sent).
            BulkOperationError: not every entry is known applied: ``failures`` are known
                not applied (refused by the server, or not sent after an entry got no
                reply in time), ``unknown`` got no reply within ``read_timeout_ms``,
                ``applied`` are.
        """
        check_count("entries per put_all", len(entries), MAX_BULK_ENTRIES)
        prepared = [self._prepare_put(k, v, callback_argument) for k, v in entries.items()]
        outcome = self._server.bulk(prepared, self._finish_put, skip_missing=False)
        outcome.raise_if_incomplete("puts", len(prepared))

    def destroy(self, key: str, callback_argument: bytes | None = None) -> None:
        """Destroy an entry on the server (even when not held locally), then locally.

        Raises:
            EntryNotFoundError: the server has no such entry.
            CacheWriterError: a client or server writer aborted.
            RegionNotFoundError, ServerTimeoutError, UnconnectedError: as :meth:`put`.
        """
        op, bucket = self._prepare_destroy(key, callback_argument)
        self._finish_destroy(op, self._server.one(op, bucket))

    def destroy_async(self, key: str, callback_argument: bytes | None = None) -> Future[None]:
        """Like :meth:`destroy`, pipelined: returns once sent; the future completes when
        applied (local apply and listeners then run on the pool's reply thread).

        Returns:
            A future that resolves to None, or raises what :meth:`destroy` would.
        """
        op, bucket = self._prepare_destroy(key, callback_argument)
        return self._server.pipelined(op, bucket, self._finish_destroy)

    def remove_all(self, keys: Iterable[str], callback_argument: bytes | None = None) -> None:
        """Destroy many entries, pipelined; keys missing on the server are skipped (Geode
        ``removeAll``).

        Raises:
            RequestLimitError: more than `regionbus.schemas.limits.MAX_BULK_ENTRIES` keys
                (nothing is sent).
            CacheWriterError: a client writer aborted (nothing was sent).
            BulkOperationError: not every entry is known destroyed (or absent): as for
                :meth:`put_all`.
        """
        key_list = list(keys)
        check_count("entries per remove_all", len(key_list), MAX_BULK_ENTRIES)
        prepared = [self._prepare_destroy(k, callback_argument) for k in key_list]
        outcome = self._server.bulk(prepared, self._finish_destroy, skip_missing=True)
        outcome.raise_if_incomplete("destroys", len(prepared))

    def invalidate(self, key: str, callback_argument: bytes | None = None) -> None:
        """Drop the local value of a key, keeping the key. Local only: not sent to the server
        (docs/behaviour.md §1); the next ``get`` goes to the server.

        Raises:
            EntryNotFoundError: the key is not held locally.
        """
        self._check_alive()
        before = self._store.invalidate_local(key)
        self._local_change(EventKind.INVALIDATE, key, before, callback_argument)

    def local_destroy(self, key: str, callback_argument: bytes | None = None) -> None:
        """Remove an entry from the local cache only (Geode ``localDestroy``): nothing is
        sent to the server; ``after_destroy`` fires here.

        Raises:
            EntryNotFoundError: the key is not held locally.
        """
        self._check_alive()
        removed = self._store.destroy_local(key)
        self._local_change(EventKind.DESTROY, key, removed, callback_argument)

    def local_clear(self, callback_argument: bytes | None = None) -> None:
        """Empty the local cache only (Geode ``localClear``): nothing is sent to the server;
        ``after_region_clear`` fires here. Interest registrations stay.
        """
        self._check_alive()
        self._store.clear_local()
        self._notify(RegionEvent(self.name, EventKind.REGION_CLEAR, None, False, callback_argument))

    def clear(self, callback_argument: bytes | None = None) -> None:
        """Clear the region on the server (every client with interest in it is told), then
        locally.

        Raises:
            CacheWriterError: a client or server writer aborted.
            RegionNotFoundError, ServerTimeoutError, UnconnectedError: as :meth:`put`.
        """
        self._region_change(OperationKind.CLEAR, callback_argument)

    def invalidate_region(self, callback_argument: bytes | None = None) -> None:
        """Invalidate every entry of the region on the server (keys stay, values go), then
        every entry held here; ``after_region_invalidate`` fires here and in server
        listeners. Other clients get no event and keep what they cache: "Region
        invalidation in the server is not forwarded to the client" (Geode documentation,
        *How Client/Server Distribution Works*; docs/behaviour.md §3). Their next ``get`` of a key
        they do not hold returns None.

        Raises:
            RegionNotFoundError, ServerTimeoutError, UnconnectedError: as :meth:`put`.
        """
        self._region_change(OperationKind.INVALIDATE_REGION, callback_argument)

    def destroy_region(self, callback_argument: bytes | None = None) -> None:
        """Destroy the region on the server and here; afterwards every call on it raises
        ``RegionNotFoundError``.

        Raises:
            CacheWriterError: a client or server writer aborted.
            RegionNotFoundError, ServerTimeoutError, UnconnectedError: as :meth:`put`.
        """
        self._region_change(OperationKind.DESTROY_REGION, callback_argument)

    # --- events from the subscription queue --------------------------------------------

    def on_event(self, event: Event, *, apply: bool = True) -> None:
        """Handle one server event (called on the subscription thread).

        Args:
            event: The event.
            apply: False during durable replay: listeners fire, the cache is unchanged,
                unless the event is newer than this connection's registration snapshot of
                its bucket (it was then not queued while the client was away). Every
                replayed event reaches listeners, and a key seen created in replay is
                updated or destroyed for listeners afterwards even though the cache never
                held it.
        """
        applied = apply_server_event(
            self._store, event, replay=not apply, decoder=self._values.decode_value
        )
        if applied.region_destroyed:
            self._forget_destroyed()
        if applied.listener_event is not None:
            self._notify(applied.listener_event)

    def fire_region_live(self) -> None:
        """Call ``after_region_live`` on every listener (the durable marker was reached)."""
        self._notify(RegionEvent(self.name, None, None, False))

    # --- internals: callbacks ----------------------------------------------------------

    def _notify(self, event: EntryEvent | RegionEvent) -> None:
        if self.listeners:
            notify_listeners(self.listeners, event, log)

    def _veto(self, event: EntryEvent | RegionEvent) -> None:
        if self.writer is not None:
            run_writer(self.writer, event, "client")

    @property
    def evictions(self) -> int:
        """Entries this client's eviction removed from its local cache so far."""
        return self._store.evictions

    def _evicted(self, key: str, local: LocalEntry) -> None:
        # Geode's LRU LOCAL_DESTROY: listeners get afterDestroy, Operation.EVICT_DESTROY.
        self._local_change(EventKind.DESTROY, key, local, None, is_eviction=True)

    def _local_change(
        self,
        kind: EventKind,
        key: str,
        before: LocalEntry,
        callback_argument: bytes | None,
        *,
        is_eviction: bool = False,
    ) -> None:
        """Tell the listeners of a change of the local copy alone (``before``: the entry
        as it was)."""
        self._notify(
            self._values.entry_event(
                kind,
                key,
                before.version,
                old=before.value,
                serializer=before.serializer,
                callback_argument=callback_argument,
                is_eviction=is_eviction,
            )
        )

    # --- internals: requests -----------------------------------------------------------

    def _check_alive(self) -> None:
        if self._destroyed:
            raise RegionNotFoundError(f"region {self.name!r} was destroyed")

    def _forget_destroyed(self) -> None:
        """The region was destroyed on the server: every later call here raises."""
        self._destroyed = True
        self._cache.forget_region(self.name)

    def _prepare_put(
        self, key: str, value: Any, callback_argument: bytes | None
    ) -> tuple[Operation, int]:
        self._check_alive()
        check_entry(key, None, callback_argument)
        data = self.serializer.dumps(value)
        check_entry(key, data, callback_argument, self._cache.max_value_size_bytes)
        bucket = self._server.bucket(key)
        if self.writer is not None:
            local = self._store.entry(key)
            self._veto(
                self._values.entry_event(
                    EventKind.UPDATE if local is not None else EventKind.CREATE,
                    key,
                    -1,
                    new=data,
                    old=local.value if local else None,
                    serializer=self.serializer.name,
                    callback_argument=callback_argument,
                )
            )
        op = self._server.operation(
            OperationKind.PUT,
            key=key,
            value=data,
            callback_argument=callback_argument,
            bucket=bucket,
        )
        return op, bucket

    def _finish_put(self, op: Operation, reply: Reply) -> None:
        raise_first_error([reply])
        assert op.key is not None
        version = reply.version if reply.version is not None else -1
        kind, old = self._store.apply_value(
            op.key,
            op.value,
            op.serializer,
            version,
            server_kind=reply.event_kind or EventKind.UPDATE,
        )
        self._notify(
            self._values.entry_event(
                kind,
                op.key,
                version,
                new=op.value,
                old=old,
                serializer=op.serializer,
                event_id=op.event_id,
                callback_argument=op.callback_argument,
            )
        )

    def _prepare_destroy(self, key: str, callback_argument: bytes | None) -> tuple[Operation, int]:
        self._check_alive()
        check_entry(key, None, callback_argument)
        bucket = self._server.bucket(key)
        if self.writer is not None:
            local = self._store.entry(key)
            self._veto(
                self._values.entry_event(
                    EventKind.DESTROY,
                    key,
                    -1,
                    old=local.value if local else None,
                    serializer=local.serializer if local else None,
                    callback_argument=callback_argument,
                )
            )
        op = self._server.operation(
            OperationKind.DESTROY, key=key, callback_argument=callback_argument, bucket=bucket
        )
        return op, bucket

    def _finish_destroy(self, op: Operation, reply: Reply) -> None:
        raise_first_error([reply])
        assert op.key is not None
        version = reply.version if reply.version is not None else -1
        before = self._store.destroyed(op.key, version)
        self._notify(
            self._values.entry_event(
                EventKind.DESTROY,
                op.key,
                version,
                old=before.value if before is not None else None,
                serializer=before.serializer if before is not None else None,
                event_id=op.event_id,
                callback_argument=op.callback_argument,
            )
        )

    def _region_change(self, kind: OperationKind, callback_argument: bytes | None) -> None:
        self._check_alive()
        event_kind = region_event_kind(kind)
        self._veto(RegionEvent(self.name, event_kind, None, False, callback_argument))
        bucket = self._server.region_bucket()
        op = self._server.operation(kind, callback_argument=callback_argument, bucket=bucket)
        reply = self._server.one(op, bucket)
        if kind is OperationKind.INVALIDATE_REGION:
            self._store.invalidated_all(reply.version)
        else:
            self._store.cleared(reply.version)
        if kind is OperationKind.DESTROY_REGION:
            self._forget_destroyed()
        self._notify(RegionEvent(self.name, event_kind, op.event_id, False, callback_argument))


__all__ = ["ALL_KEYS", "ClientRegionShortcut", "EvictionAttributes", "Region", "RegionShortcut"]
