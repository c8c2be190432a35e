"""A client region: the local copy (or none) of a server region, its callbacks and interest.

``CACHING_PROXY`` keeps entries locally and serves reads from them; ``PROXY`` keeps none
and sends every read to the server (Geode ``ClientRegionShortcut``).

Order of a change made here (SPEC §1): client ``CacheWriter`` (may abort) -> server
(server writer may abort -> apply -> server listeners -> distribution) -> only then this
client's cache and listeners. An abort anywhere raises and changes nothing.

Every local change is versioned with the region-wide entry version the server assigned, so
a stale value (an interest bulk-load answer or a late reply racing a newer event) never
overwrites a newer one. Destroyed keys leave a bounded set of tombstones for the same
reason (SPEC §5: an entry marked destroyed is not updated by an interest response).
"""

from __future__ import annotations

import enum
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from schemas.callbacks import CacheListener, CacheWriter, EntryEvent, RegionEvent
from schemas.errors import (
    BulkOperationError,
    CacheWriterError,
    EntryNotFoundError,
    InvalidInterestError,
    RegionBusError,
    RegionNotFoundError,
    ServerTimeoutError,
    error_from_wire,
)
from schemas.eventid import EventID
from schemas.messages import (
    Entry,
    Event,
    EventKind,
    InterestKind,
    InterestResultPolicy,
    InterestSpec,
    Operation,
    OperationKind,
    Reply,
)
from schemas.naming import bucket_of, region_bucket
from schemas.serializers import Serializer, serializer_named

if TYPE_CHECKING:
    from clients.cache import ClientCache

log = logging.getLogger("regionbus.client")

_MAX_TOMBSTONES = 100_000
_KEYS_PER_REGISTRATION_MESSAGE = 5_000


class RegionShortcut(enum.Enum):
    """How a client region stores data (Geode ``ClientRegionShortcut``)."""

    PROXY = "PROXY"
    CACHING_PROXY = "CACHING_PROXY"


class _AllKeys:
    def __repr__(self) -> str:
        return "ALL_KEYS"


ALL_KEYS: Any = _AllKeys()
"""Pass to ``register_interest`` for every key of the region (Geode ``"ALL_KEYS"``; that
string is accepted too)."""


class _LocalEntry:
    __slots__ = ("serializer", "value", "version")

    def __init__(self, value: bytes | None, serializer: str | None, version: int) -> None:
        self.value = value
        self.serializer = serializer
        self.version = version


class Region:
    """A region of a :class:`ClientCache`. Create it with ``ClientCache.create_region``.

    Keys are strings; values are anything the region's serializer encodes (JSON default).
    """

    def __init__(
        self,
        cache: ClientCache,
        name: str,
        shortcut: RegionShortcut,
        serializer: Serializer,
        listeners: Iterable[CacheListener],
        writer: CacheWriter | None,
    ) -> None:
        self._cache = cache
        self.name = name
        self.shortcut = shortcut
        self.serializer = serializer
        self.listeners: list[CacheListener] = list(listeners)
        self.writer = writer
        self._caching = shortcut is RegionShortcut.CACHING_PROXY
        self._entries: dict[str, _LocalEntry] = {}
        self._tombstones: OrderedDict[str, int] = OrderedDict()
        self._cleared_version = -1
        self._lock = threading.RLock()
        self._destroyed = False
        self._interest: list[InterestSpec] = []
        # Interest registrations in flight, and the keys destroyed meanwhile: a response
        # never revives those (seed 001, "Application Operations During Interest
        # Registration").
        self._registering = 0
        self._destroyed_while_registering: set[str] = set()
        # bucket -> region version at this connection's first registration snapshot there:
        # an event of that bucket with a higher version happened after the registration,
        # so it is applied even while the queue still replays.
        self._registered_at: dict[int, int] = {}
        # Keys whose create or update a listener saw in durable replay without the cache
        # taking it: for listeners they exist, so their later updates, invalidates and
        # destroys reach listeners as such although the cache does not hold them.
        self._replayed_keys: set[str] = set()
        self._decode_value = self._decoder()

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
            RegionNotFoundError: the region was destroyed, here or on the server.
            ServerTimeoutError: no reply within ``read_timeout_ms``.
            UnconnectedError: the cache is closed and the key is not valid locally.
        """
        self._check_alive()
        if self._caching:
            with self._lock:
                local = self._entries.get(key)
                if local is not None and local.value is not None:
                    return self._decode(local.value, local.serializer)
        op = self._operation(OperationKind.GET, key=key, with_event_id=False)
        reply = self._one(op, bucket_of(self.name, key, self._cache.total_buckets))
        if not reply.found or reply.value is None:
            return None
        if self._caching and reply.version is not None:
            self._apply_local(
                key,
                reply.value,
                reply.serializer,
                reply.version,
                None,
                is_load=True,
                origin_remote=False,
                fire=True,
            )
        return self._decode(reply.value, reply.serializer)

    def keys(self) -> list[str]:
        """Keys held in the local cache (valid or invalid). Geode ``keySet()``."""
        with self._lock:
            return list(self._entries)

    def contains_key(self, key: str) -> bool:
        """Whether the local cache holds the key (valid or invalid). Geode ``containsKey``."""
        with self._lock:
            return key in self._entries

    def contains_value_for_key(self, key: str) -> bool:
        """Whether the local cache holds a valid value for the key."""
        with self._lock:
            local = self._entries.get(key)
            return local is not None and local.value is not None

    def local_entries(self) -> dict[str, Any]:
        """A snapshot of the local cache: ``{key: decoded value or None if invalid}``."""
        with self._lock:
            items = [(k, e.value, e.serializer) for k, e in self._entries.items()]
        return {k: self._decode(v, s) if v is not None else None for k, v, s in items}

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def keys_on_server(self) -> list[str]:
        """Every key of the region on the server. Geode ``keySetOnServer()``.

        Raises:
            RegionNotFoundError: the region is not defined on the server.
            ServerTimeoutError: not every bucket answered within ``read_timeout_ms``.
        """
        self._check_alive()
        request_id = self._cache.pool.next_request_id()
        ops = [
            (self._operation(OperationKind.KEYS, with_event_id=False, request_id=request_id), b)
            for b in range(self._cache.total_buckets)
        ]
        replies = self._wait(self._cache.pool.request(ops), request_id)
        self._raise_first_error(replies)
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
            ValueTooLargeError: the encoded value exceeds the server's maximum.
            RegionNotFoundError: the region is not defined on the server.
            SerializationError: the value cannot be encoded.
            ServerTimeoutError: no reply within ``read_timeout_ms``.
            UnconnectedError: the cache is closed.
        """
        op, bucket = self._prepare_put(key, value, callback_argument)
        reply = self._one(op, bucket)
        self._finish_put(op, reply)

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
        return self._pipelined(op, bucket, self._finish_put)

    def put_all(self, entries: Mapping[str, Any], callback_argument: bytes | None = None) -> None:
        """Put many entries, pipelined; each gets its own consecutive sequence id.

        Client writers run for every entry first: an abort raises before anything is sent.

        Raises:
            CacheWriterError: a client writer aborted (nothing was sent).
            BulkOperationError: some entries failed on the server; ``failures`` names them,
                the rest were applied.
            ServerTimeoutError: not every reply came within ``read_timeout_ms``.
        """
        prepared = [self._prepare_put(k, v, callback_argument) for k, v in entries.items()]
        futures = list(zip(prepared, self._cache.pool.request_each(prepared), strict=True))
        failures: dict[str, RegionBusError] = {}
        for (op, _), future in futures:
            assert op.key is not None
            try:
                self._finish_put(op, self._wait(future, op.request_id)[0])
            except RegionBusError as exc:
                failures[op.key] = exc
        if failures:
            raise BulkOperationError(f"{len(failures)} of {len(prepared)} puts failed", failures)

    def destroy(self, key: str, callback_argument: bytes | None = None) -> None:
        """Destroy an entry on the server (even when not held locally), then locally.

        Raises:
            EntryNotFoundError: the server has no such entry.
            CacheWriterError: a client or server writer aborted.
            RegionNotFoundError, ServerTimeoutError, UnconnectedError: as :meth:`put`.
        """
        op, bucket = self._prepare_destroy(key, callback_argument)
        self._finish_destroy(op, self._one(op, bucket))

    def destroy_async(self, key: str, callback_argument: bytes | None = None) -> Future[None]:
        """Like :meth:`destroy`, pipelined: returns once sent; the future completes when
        applied (local apply and listeners then run on the pool's reply thread).

        Returns:
            A future that resolves to None, or raises what :meth:`destroy` would.
        """
        op, bucket = self._prepare_destroy(key, callback_argument)
        return self._pipelined(op, bucket, self._finish_destroy)

    def _pipelined(
        self, op: Operation, bucket: int, finish: Callable[[Operation, Reply], None]
    ) -> Future[None]:
        outer: Future[None] = Future()

        def done(replies: list[Reply] | None, error: BaseException | None) -> None:
            try:
                if error is not None:
                    raise error
                assert replies
                finish(op, replies[0])
                outer.set_result(None)
            except BaseException as exc:
                outer.set_exception(exc)

        self._cache.pool.request_with_callback([(op, bucket)], done)
        return outer

    def remove_all(self, keys: Iterable[str], callback_argument: bytes | None = None) -> None:
        """Destroy many entries, pipelined; keys missing on the server are skipped (Geode
        ``removeAll``).

        Raises:
            CacheWriterError: a client writer aborted (nothing was sent).
            BulkOperationError: some entries failed for another reason than being absent.
        """
        prepared = [self._prepare_destroy(k, callback_argument) for k in keys]
        futures = list(zip(prepared, self._cache.pool.request_each(prepared), strict=True))
        failures: dict[str, RegionBusError] = {}
        for (op, _), future in futures:
            assert op.key is not None
            try:
                self._finish_destroy(op, self._wait(future, op.request_id)[0])
            except EntryNotFoundError:
                continue
            except RegionBusError as exc:
                failures[op.key] = exc
        if failures:
            raise BulkOperationError(
                f"{len(failures)} of {len(prepared)} destroys failed", failures
            )

    def invalidate(self, key: str, callback_argument: bytes | None = None) -> None:
        """Drop the local value of a key, keeping the key. Local only: not sent to the server
        (SPEC §1); the next ``get`` goes to the server.

        Raises:
            EntryNotFoundError: the key is not held locally.
        """
        self._check_alive()
        with self._lock:
            local = self._entries.get(key)
            if local is None:
                raise EntryNotFoundError(f"entry {key!r} not in local region {self.name!r}")
            old = local.value
            local.value = None
            version = local.version
        self._fire_entry(
            EventKind.INVALIDATE,
            key,
            None,
            old,
            local.serializer,
            None,
            version,
            origin_remote=False,
            callback_argument=callback_argument,
        )

    def local_destroy(self, key: str, callback_argument: bytes | None = None) -> None:
        """Remove an entry from the local cache only (Geode ``localDestroy``): nothing is
        sent to the server; ``after_destroy`` fires here.

        Raises:
            EntryNotFoundError: the key is not held locally.
        """
        self._check_alive()
        with self._lock:
            local = self._entries.pop(key, None)
            if local is not None and self._registering:
                self._destroyed_while_registering.add(key)
        if local is None:
            raise EntryNotFoundError(f"entry {key!r} not in local region {self.name!r}")
        self._fire_entry(
            EventKind.DESTROY,
            key,
            None,
            local.value,
            local.serializer,
            None,
            local.version,
            origin_remote=False,
            callback_argument=callback_argument,
        )

    def local_clear(self, callback_argument: bytes | None = None) -> None:
        """Empty the local cache only (Geode ``localClear``): nothing is sent to the server;
        ``after_region_clear`` fires here. Interest registrations stay.
        """
        self._check_alive()
        with self._lock:
            self._entries.clear()
            self._replayed_keys.clear()
        self._call_listeners(
            "after_region_clear",
            RegionEvent(self.name, EventKind.REGION_CLEAR, None, False, callback_argument),
        )

    def clear(self, callback_argument: bytes | None = None) -> None:
        """Clear the region on the server (every client with interest in it is told), then
        locally.

        Raises:
            CacheWriterError: a client or server writer aborted.
            RegionNotFoundError, ServerTimeoutError, UnconnectedError: as :meth:`put`.
        """
        self._region_change(OperationKind.CLEAR, callback_argument)

    def destroy_region(self, callback_argument: bytes | None = None) -> None:
        """Destroy the region on the server and here; afterwards every call on it raises
        ``RegionNotFoundError``.

        Raises:
            CacheWriterError: a client or server writer aborted.
            RegionNotFoundError, ServerTimeoutError, UnconnectedError: as :meth:`put`.
        """
        self._region_change(OperationKind.DESTROY_REGION, callback_argument)

    # --- interest ----------------------------------------------------------------------

    def register_interest(
        self,
        keys: str | Iterable[str] | Any,
        policy: InterestResultPolicy = InterestResultPolicy.KEYS_VALUES,
        *,
        durable: bool = False,
        receive_values: bool = True,
    ) -> None:
        """Register interest in keys, or in every key with :data:`ALL_KEYS` (SPEC §3).

        Steps (seed 000): the local entries of those keys are silently destroyed; the
        registration is added on the server (keys need not exist yet); then, per
        ``policy``, the matching entries are loaded before this returns, firing no
        listener. From then on every change of a matching key reaches this client.

        Args:
            keys: One key, an iterable of keys, or ``ALL_KEYS``.
            policy: What to bulk-load (Geode default ``KEYS_VALUES``).
            durable: Keep the registration while a durable client is away.
            receive_values: False to receive invalidations instead of values for creates
                and updates.

        Raises:
            RegionNotFoundError: the region is not defined on the server.
            ServerTimeoutError: not every bucket answered within ``read_timeout_ms``.
            UnconnectedError: the cache is closed or has no subscription queue.
        """
        if keys is ALL_KEYS or keys == "ALL_KEYS":
            spec = InterestSpec(InterestKind.ALL_KEYS, (), None, policy, durable, receive_values)
        else:
            key_list = (keys,) if isinstance(keys, str) else tuple(keys)
            spec = InterestSpec(InterestKind.KEYS, key_list, None, policy, durable, receive_values)
        self._register(spec)

    def register_interest_regex(
        self,
        regex: str,
        policy: InterestResultPolicy = InterestResultPolicy.KEYS_VALUES,
        *,
        durable: bool = False,
        receive_values: bool = True,
    ) -> None:
        """Register interest in every key the regex matches in full (Python ``re`` syntax;
        Geode's ``registerInterestRegex`` uses ``Matcher.matches()``). Every local entry is
        silently destroyed first.

        Raises:
            InvalidInterestError: the regex does not compile (nothing is sent).
            RegionNotFoundError, ServerTimeoutError, UnconnectedError: as
                :meth:`register_interest`.
        """
        try:
            re.compile(regex)
        except (re.error, TypeError) as exc:
            raise InvalidInterestError(f"invalid interest regex {regex!r}: {exc}") from exc
        self._register(InterestSpec(InterestKind.REGEX, (), regex, policy, durable, receive_values))

    def unregister_interest(self, keys: str | Iterable[str] | Any) -> None:
        """Remove interest in keys (or the ``ALL_KEYS`` registration). Local entries stay.

        Raises:
            ServerTimeoutError, UnconnectedError: as :meth:`register_interest`.
        """
        if keys is ALL_KEYS or keys == "ALL_KEYS":
            spec = InterestSpec(InterestKind.ALL_KEYS)
        else:
            spec = InterestSpec(
                InterestKind.KEYS, (keys,) if isinstance(keys, str) else tuple(keys)
            )
        self._unregister(spec)

    def unregister_interest_regex(self, regex: str) -> None:
        """Remove a regex registration. Local entries stay.

        Raises:
            ServerTimeoutError, UnconnectedError: as :meth:`register_interest`.
        """
        self._unregister(InterestSpec(InterestKind.REGEX, (), regex))

    @property
    def interest(self) -> list[InterestSpec]:
        """This client's registrations on the region, in order."""
        return list(self._interest)

    def _interest_ops(self, kind: OperationKind, spec: InterestSpec) -> list[tuple[Operation, int]]:
        request_id = self._cache.pool.next_request_id()
        total = self._cache.total_buckets
        if spec.kind is not InterestKind.KEYS:
            return [
                (
                    self._operation(
                        kind, interest=spec, with_event_id=False, request_id=request_id
                    ),
                    b,
                )
                for b in range(total)
            ]
        by_bucket: dict[int, list[str]] = {}
        for key in dict.fromkeys(spec.keys):
            by_bucket.setdefault(bucket_of(self.name, key, total), []).append(key)
        ops = []
        for bucket, bucket_keys in by_bucket.items():
            for i in range(0, len(bucket_keys), _KEYS_PER_REGISTRATION_MESSAGE):
                part = tuple(bucket_keys[i : i + _KEYS_PER_REGISTRATION_MESSAGE])
                chunk_spec = InterestSpec(
                    spec.kind, part, None, spec.policy, spec.durable, spec.receive_values
                )
                op = self._operation(
                    kind, interest=chunk_spec, with_event_id=False, request_id=request_id
                )
                ops.append((op, bucket))
        return ops

    def _register(self, spec: InterestSpec) -> None:
        self._check_alive()
        self._cache.require_subscription()
        with self._lock:
            if spec.kind is InterestKind.KEYS:
                for key in spec.keys:
                    self._entries.pop(key, None)
            else:
                self._entries.clear()
            self._registering += 1
        try:
            ops = self._interest_ops(OperationKind.REGISTER_INTEREST, spec)
            if not ops:
                return
            replies = self._wait(self._cache.pool.request(ops), ops[0][0].request_id)
            self._raise_first_error(replies)
            self._interest.append(spec)
            with self._lock:
                for reply in replies:
                    if reply.version is not None:
                        known = self._registered_at.get(reply.bucket, reply.version)
                        self._registered_at[reply.bucket] = min(known, reply.version)
                if spec.policy is not InterestResultPolicy.NONE and self._caching:
                    for reply in replies:
                        for entry in reply.entries:
                            self._load_entry(entry)
        finally:
            with self._lock:
                self._registering -= 1
                if not self._registering:
                    self._destroyed_while_registering.clear()

    def reinitialize(self) -> None:
        """Clear the local cache and register this region's interest again, loading the
        entries of interest; fires no listener (SPEC §3, non-HA failover: the client's
        queue is gone).

        Raises:
            RegionNotFoundError, ServerTimeoutError, UnconnectedError: as
                :meth:`register_interest`.
        """
        with self._lock:
            specs, self._interest = self._interest, []
            self._entries.clear()
            self._tombstones.clear()
            self._registered_at.clear()
            self._replayed_keys.clear()
        for spec in specs:
            self._register(spec)

    def _unregister(self, spec: InterestSpec) -> None:
        self._check_alive()
        ops = self._interest_ops(OperationKind.UNREGISTER_INTEREST, spec)
        if not ops:
            return
        replies = self._wait(self._cache.pool.request(ops), ops[0][0].request_id)
        self._raise_first_error(replies)
        self._interest = [s for s in self._interest if not _covers(spec, s)]

    def _load_entry(self, entry: Entry) -> None:
        """Apply one bulk-load entry (no listener), by the rules of seed 001 for application
        operations during a registration, made version-aware: an entry destroyed meanwhile
        is not revived; a valid local value is kept unless the response is newer; an
        invalid local entry takes a valid response value of the same or a newer version."""
        key = entry.key
        if key in self._destroyed_while_registering:
            return
        local = self._entries.get(key)
        if local is not None and local.value is None:
            take = entry.value is not None and entry.version >= local.version
        else:
            take = self._is_newer(key, entry.version)
        if take:
            self._entries[key] = _LocalEntry(entry.value, entry.serializer, entry.version)
            self._tombstones.pop(key, None)

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
        replay = not apply
        if replay:
            registered_at = self._registered_at.get(event.event_id.bucket)
            apply = registered_at is not None and event.version > registered_at
        kind = event.kind
        if kind is EventKind.REGION_CLEAR or kind is EventKind.REGION_DESTROY:
            self._on_region_event(event, apply)
            return
        key = event.key
        assert key is not None
        if kind is EventKind.CREATE or kind is EventKind.UPDATE:
            self._apply_local(
                key,
                event.value,
                event.serializer,
                event.version,
                event,
                is_load=False,
                origin_remote=True,
                fire=True,
                apply=apply,
            )
            return
        with self._lock:
            local = self._entries.get(key)
            # A replayed event reaches listeners whether or not the cache holds its key
            # (seed 001: "if cache listeners are installed, they handle the events").
            held = local is not None or replay or key in self._replayed_keys
            if kind is EventKind.DESTROY:
                self._replayed_keys.discard(key)
            old = local.value if local is not None else None
            serializer = local.serializer if local is not None else event.serializer
            if apply and self._caching and self._is_newer(key, event.version):
                if kind is EventKind.DESTROY:
                    self._entries.pop(key, None)
                    self._remember_tombstone(key, event.version)
                elif local is not None:
                    local.value = None
                    local.version = event.version
        if held or not self._caching:
            self._fire_entry(
                kind,
                key,
                None,
                old,
                serializer,
                event.event_id,
                event.version,
                origin_remote=True,
                callback_argument=event.callback_argument,
                possible_duplicate=event.possible_duplicate,
            )

    def _on_region_event(self, event: Event, apply: bool) -> None:
        self._replayed_keys.clear()
        if apply:
            with self._lock:
                self._entries.clear()
                self._tombstones.clear()
                self._cleared_version = max(self._cleared_version, event.version)
        region_event = RegionEvent(
            self.name, event.kind, event.event_id, True, event.callback_argument
        )
        if event.kind is EventKind.REGION_DESTROY:
            if apply:
                self._destroyed = True
                self._cache.forget_region(self.name)
            self._call_listeners("after_region_destroy", region_event)
        else:
            self._call_listeners("after_region_clear", region_event)

    def fire_region_live(self) -> None:
        """Call ``after_region_live`` on every listener (the durable marker was reached)."""
        self._call_listeners("after_region_live", RegionEvent(self.name, None, None, False))

    # --- internals: local state --------------------------------------------------------

    def _is_newer(self, key: str, version: int) -> bool:
        local = self._entries.get(key)
        if local is not None:
            return version > local.version
        tomb = self._tombstones.get(key)
        if tomb is not None and version <= tomb:
            return False
        return version > self._cleared_version

    def _remember_tombstone(self, key: str, version: int) -> None:
        if self._registering:
            self._destroyed_while_registering.add(key)
        self._tombstones[key] = version
        self._tombstones.move_to_end(key)
        if len(self._tombstones) > _MAX_TOMBSTONES:
            self._tombstones.popitem(last=False)

    def _apply_local(
        self,
        key: str,
        value: bytes | None,
        serializer: str | None,
        version: int,
        event: Event | None,
        *,
        is_load: bool,
        origin_remote: bool,
        fire: bool,
        apply: bool = True,
        callback_argument: bytes | None = None,
        event_id: EventID | None = None,
        server_kind: EventKind | None = None,
    ) -> None:
        with self._lock:
            local = self._entries.get(key)
            old = local.value if local is not None else None
            if self._caching:
                seen = local is not None or key in self._replayed_keys
                kind = EventKind.UPDATE if seen else EventKind.CREATE
                if not apply:
                    self._replayed_keys.add(key)
            else:
                kind = server_kind or (event.kind if event is not None else EventKind.UPDATE)
            if apply and self._caching and self._is_newer(key, version):
                if local is None:
                    self._entries[key] = _LocalEntry(value, serializer, version)
                    self._tombstones.pop(key, None)
                else:
                    local.value, local.serializer, local.version = value, serializer, version
        if fire:
            self._fire_entry(
                kind,
                key,
                value,
                old,
                serializer,
                event.event_id if event is not None else event_id,
                version,
                origin_remote=origin_remote,
                callback_argument=event.callback_argument
                if event is not None
                else callback_argument,
                possible_duplicate=event.possible_duplicate if event is not None else False,
                is_load=is_load,
            )

    # --- internals: callbacks ----------------------------------------------------------

    def _decode(self, data: bytes, serializer: str | None) -> Any:
        if serializer == self.serializer.name:
            return self.serializer.loads(data)
        return serializer_named(serializer, {self.serializer.name: self.serializer}).loads(data)

    def _decoder(self) -> Callable[[bytes | None, str | None], Any]:
        def decode_value(data: bytes | None, serializer: str | None) -> Any:
            return None if data is None else self._decode(data, serializer)

        return decode_value

    def _entry_event(
        self,
        kind: EventKind,
        key: str,
        new: bytes | None,
        old: bytes | None,
        serializer: str | None,
        event_id: EventID | None,
        version: int,
        *,
        origin_remote: bool,
        callback_argument: bytes | None = None,
        possible_duplicate: bool = False,
        is_load: bool = False,
    ) -> EntryEvent:
        return EntryEvent(
            region=self.name,
            key=key,
            kind=kind,
            event_id=event_id,
            version=version,
            origin_remote=origin_remote,
            new_value_bytes=new,
            old_value_bytes=old,
            serializer=serializer,
            possible_duplicate=possible_duplicate,
            callback_argument=callback_argument,
            is_load=is_load,
            decoder=self._decode_value,
        )

    def _fire_entry(
        self,
        kind: EventKind,
        key: str,
        new: bytes | None,
        old: bytes | None,
        serializer: str | None,
        event_id: EventID | None,
        version: int,
        **flags: Any,
    ) -> None:
        if not self.listeners:
            return
        event = self._entry_event(kind, key, new, old, serializer, event_id, version, **flags)
        method = _AFTER[kind]
        for listener in self.listeners:
            try:
                getattr(listener, method)(event)
            except Exception:
                log.exception("CacheListener %r.%s failed for %s", listener, method, key)

    def _call_listeners(self, method: str, event: RegionEvent) -> None:
        for listener in self.listeners:
            try:
                getattr(listener, method)(event)
            except Exception:
                log.exception("CacheListener %r.%s failed", listener, method)

    def _run_writer(self, method: str, event: EntryEvent | RegionEvent) -> None:
        if self.writer is None:
            return
        try:
            getattr(self.writer, method)(event)
        except CacheWriterError:
            raise
        except Exception as exc:
            raise CacheWriterError(
                f"client CacheWriter aborted: {type(exc).__name__}: {exc}"
            ) from exc

    # --- internals: requests -----------------------------------------------------------

    def _check_alive(self) -> None:
        if self._destroyed:
            raise RegionNotFoundError(f"region {self.name!r} was destroyed")

    def _operation(
        self,
        kind: OperationKind,
        *,
        key: str | None = None,
        value: bytes | None = None,
        callback_argument: bytes | None = None,
        interest: InterestSpec | None = None,
        with_event_id: bool = True,
        bucket: int = -1,
        request_id: int | None = None,
    ) -> Operation:
        pool = self._cache.pool
        return Operation(
            request_id=pool.next_request_id() if request_id is None else request_id,
            client_id=self._cache.client_id,
            kind=kind,
            region=self.name,
            timestamp_ms=int(time.time() * 1000),
            event_id=pool.next_event_id(bucket) if with_event_id else None,
            key=key,
            value=value,
            serializer=self.serializer.name if value is not None else None,
            callback_argument=callback_argument,
            interest=interest,
        )

    def _wait(self, future: Future[list[Reply]], request_id: int) -> list[Reply]:
        timeout_s = self._cache.settings.read_timeout_ms / 1000
        try:
            return future.result(timeout_s)
        except FutureTimeout:
            self._cache.pool.forget(request_id)
            raise ServerTimeoutError(
                f"no reply from the server within {self._cache.settings.read_timeout_ms} ms "
                f"(region {self.name!r})"
            ) from None

    def _one(self, op: Operation, bucket: int) -> Reply:
        reply = self._wait(self._cache.pool.request([(op, bucket)]), op.request_id)[0]
        if not reply.ok:
            raise error_from_wire(reply.error_type, reply.error_message)
        return reply

    @staticmethod
    def _raise_first_error(replies: list[Reply]) -> None:
        for reply in replies:
            if not reply.ok:
                raise error_from_wire(reply.error_type, reply.error_message)

    def _prepare_put(
        self, key: str, value: Any, callback_argument: bytes | None
    ) -> tuple[Operation, int]:
        self._check_alive()
        if not isinstance(key, str):
            raise TypeError(f"keys are str, got {type(key).__name__}")
        data = self.serializer.dumps(value)
        bucket = bucket_of(self.name, key, self._cache.total_buckets)
        if self.writer is not None:
            with self._lock:
                local = self._entries.get(key)
            kind = EventKind.UPDATE if local is not None else EventKind.CREATE
            event = self._entry_event(
                kind,
                key,
                data,
                local.value if local else None,
                self.serializer.name,
                None,
                -1,
                origin_remote=False,
                callback_argument=callback_argument,
            )
            self._run_writer("before_update" if local is not None else "before_create", event)
        op = self._operation(
            OperationKind.PUT,
            key=key,
            value=data,
            callback_argument=callback_argument,
            bucket=bucket,
        )
        return op, bucket

    def _finish_put(self, op: Operation, reply: Reply) -> None:
        if not reply.ok:
            raise error_from_wire(reply.error_type, reply.error_message)
        assert op.key is not None
        self._apply_local(
            op.key,
            op.value,
            op.serializer,
            reply.version if reply.version is not None else -1,
            None,
            is_load=False,
            origin_remote=False,
            fire=True,
            callback_argument=op.callback_argument,
            event_id=op.event_id,
            server_kind=reply.event_kind,
        )

    def _prepare_destroy(self, key: str, callback_argument: bytes | None) -> tuple[Operation, int]:
        self._check_alive()
        bucket = bucket_of(self.name, key, self._cache.total_buckets)
        if self.writer is not None:
            with self._lock:
                local = self._entries.get(key)
            event = self._entry_event(
                EventKind.DESTROY,
                key,
                None,
                local.value if local else None,
                local.serializer if local else None,
                None,
                -1,
                origin_remote=False,
                callback_argument=callback_argument,
            )
            self._run_writer("before_destroy", event)
        op = self._operation(
            OperationKind.DESTROY, key=key, callback_argument=callback_argument, bucket=bucket
        )
        return op, bucket

    def _finish_destroy(self, op: Operation, reply: Reply) -> None:
        if not reply.ok:
            raise error_from_wire(reply.error_type, reply.error_message)
        assert op.key is not None
        version = reply.version if reply.version is not None else -1
        with self._lock:
            local = self._entries.get(op.key)
            old = local.value if local is not None else None
            serializer = local.serializer if local is not None else None
            if self._caching and self._is_newer(op.key, version):
                self._entries.pop(op.key, None)
                self._remember_tombstone(op.key, version)
        self._fire_entry(
            EventKind.DESTROY,
            op.key,
            None,
            old,
            serializer,
            op.event_id,
            version,
            origin_remote=False,
            callback_argument=op.callback_argument,
        )

    def _region_change(self, kind: OperationKind, callback_argument: bytes | None) -> None:
        self._check_alive()
        event_kind = (
            EventKind.REGION_CLEAR if kind is OperationKind.CLEAR else EventKind.REGION_DESTROY
        )
        self._run_writer(
            "before_region_clear" if kind is OperationKind.CLEAR else "before_region_destroy",
            RegionEvent(self.name, event_kind, None, False, callback_argument),
        )
        bucket = region_bucket(self.name, self._cache.total_buckets)
        op = self._operation(kind, callback_argument=callback_argument, bucket=bucket)
        reply = self._one(op, bucket)
        with self._lock:
            self._entries.clear()
            self._tombstones.clear()
            if reply.version is not None:
                self._cleared_version = max(self._cleared_version, reply.version)
        region_event = RegionEvent(self.name, event_kind, op.event_id, False, callback_argument)
        if kind is OperationKind.DESTROY_REGION:
            self._destroyed = True
            self._cache.forget_region(self.name)
            self._call_listeners("after_region_destroy", region_event)
        else:
            self._call_listeners("after_region_clear", region_event)


_AFTER = {
    EventKind.CREATE: "after_create",
    EventKind.UPDATE: "after_update",
    EventKind.INVALIDATE: "after_invalidate",
    EventKind.DESTROY: "after_destroy",
}


def _covers(removed: InterestSpec, spec: InterestSpec) -> bool:
    if removed.kind is not spec.kind:
        return False
    if removed.kind is InterestKind.KEYS:
        return set(spec.keys) <= set(removed.keys)
    return removed.regex == spec.regex


__all__ = ["ALL_KEYS", "Region", "RegionShortcut"]
