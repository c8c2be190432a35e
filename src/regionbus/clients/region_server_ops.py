"""A region's conditional operations and its reads of the server's state: Geode's
``ConcurrentMap`` methods (``putIfAbsent``, ``replace``, ``remove(k, v)``) and ``create``,
``getAll``, ``containsKeyOnServer``, ``sizeOnServer``, and its queries (``query``,
``existsValue``, ``selectValue``).

The condition of a conditional operation is checked by the key's bucket primary in the
same Lua call that makes the change (``apply_entry.lua``), so of any number of clients
racing on one key, each sees the state the others left. One that does not hold changes
nothing and sends no event. Values are compared as the region's serializer encodes them,
byte for byte (Geode ``ValueComparisonHelper.checkEquals`` compares serialized forms): with
JSON, two dicts are equal when their keys come in the same order, as a value read back and
passed again does.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from regionbus.clients.arguments import check_entry
from regionbus.clients.local_store import LocalStore
from regionbus.clients.oql_query import region_query
from regionbus.clients.region_values import RegionValues
from regionbus.clients.server_proxy import CacheConnection, ServerRegionProxy
from regionbus.clients.windowed import send_windowed
from regionbus.schemas.errors import (
    EntryExistsError,
    QueryFunctionDomainError,
    RegionBusError,
    error_from_wire,
)
from regionbus.schemas.limits import (
    BULK_ENTRIES_IN_FLIGHT,
    BULK_SEND_GROUP,
    MAX_BULK_ENTRIES,
    check_count,
)
from regionbus.schemas.messages import Operation, OperationKind, Reply
from regionbus.schemas.serializers import Serializer

_NOT_GIVEN: Final = object()


class _Region(Protocol):
    """What these operations use of the region they are mixed into."""

    name: str
    serializer: Serializer
    _cache: CacheConnection
    _server: ServerRegionProxy
    _store: LocalStore
    _values: RegionValues
    _caching: bool

    def _check_alive(self) -> None: ...

    def query(self, predicate: str, *params: Any) -> list[Any]: ...

    def _prepare_put(
        self, key: str, value: Any, callback_argument: bytes | None
    ) -> tuple[Operation, int]: ...

    def _finish_put(self, op: Operation, reply: Reply) -> None: ...

    def _prepare_destroy(
        self, key: str, callback_argument: bytes | None
    ) -> tuple[Operation, int]: ...

    def _finish_destroy(self, op: Operation, reply: Reply) -> None: ...

    def _loaded(self, key: str, reply: Reply) -> Any: ...


class RegionServerOperations:
    """Mixed into :class:`regionbus.clients.region.Region` (its methods run on a region)."""

    # --- conditional operations --------------------------------------------------------

    def put_if_absent(
        self: _Region, key: str, value: Any, callback_argument: bytes | None = None
    ) -> Any:
        """Create the entry only when the server has none for the key (Geode
        ``Region.putIfAbsent``). An invalid entry is present: nothing changes and None is
        answered, as in Geode (``RegionMapPut``'s create precondition).

        Returns:
            None when the entry was created (its create event goes to listeners and
            subscribers) or is invalid; else the value the server holds (no event, nothing
            changes here).

        Raises:
            What :meth:`Region.put` raises.
        """
        op, bucket = self._prepare_put(key, value, callback_argument)
        op = op._replace(kind=OperationKind.PUT_IF_ABSENT)
        reply = self._server.one(op, bucket)
        if reply.event_kind is None:
            return _decoded(self._values, reply)
        self._finish_put(op, reply)
        return None

    def create(self: _Region, key: str, value: Any, callback_argument: bytes | None = None) -> None:
        """Create an entry the server does not hold yet (Geode ``Region.create``): the
        create event goes to listeners and subscribers, as for :meth:`Region.put`.

        Raises:
            EntryExistsError: the server holds an entry for the key, valid or invalid
                (Geode ``EntryExistsException``); nothing changed, and ``old_value`` is its
                value.
            What :meth:`Region.put` raises.
        """
        op, bucket = self._prepare_put(key, value, callback_argument)
        op = op._replace(kind=OperationKind.PUT_IF_ABSENT)
        reply = self._server.one(op, bucket)
        if reply.event_kind is None:
            raise EntryExistsError(
                f"an entry of key {key!r} exists in region {self.name!r}",
                old_value=_decoded(self._values, reply),
            )
        self._finish_put(op, reply)

    def replace(
        self: _Region,
        key: str,
        value: Any,
        new_value: Any = _NOT_GIVEN,
        callback_argument: bytes | None = None,
    ) -> Any:
        """Update an entry the server holds (Geode ``Region.replace``).

        ``replace(key, value)`` updates the entry when it exists (an invalid one included)
        and returns the value it replaced. ``replace(key, old_value, new_value)`` updates it
        only when it holds ``old_value`` (see the module for how values compare) and
        returns whether it did.

        Returns:
            Two arguments: the replaced value, or None when there was no entry (nothing
            changed) or it was invalid. Three: True when replaced, False when not.

        Raises:
            What :meth:`Region.put` raises.
        """
        conditional = new_value is not _NOT_GIVEN
        op, bucket = self._prepare_put(key, new_value if conditional else value, callback_argument)
        expected = self.serializer.dumps(value) if conditional else None
        op = op._replace(kind=OperationKind.REPLACE, expected_value=expected)
        reply = self._server.one(op, bucket)
        replaced = reply.event_kind is not None
        if replaced:
            self._finish_put(op, reply)
        if conditional:
            return replaced
        return _decoded(self._values, reply) if replaced else None

    def remove(self: _Region, key: str, value: Any, callback_argument: bytes | None = None) -> bool:
        """Destroy the entry only when it holds ``value`` (Geode ``Region.remove(k, v)``;
        ``value`` None matches an invalid entry, as Geode's ``Token.INVALID``). See the
        module for how values compare.

        Returns:
            True when the entry was destroyed (its destroy event goes to listeners and
            subscribers); False when it was absent or held another value.

        Raises:
            CacheWriterError, RegionNotFoundError, ServerTimeoutError, UnconnectedError:
                as :meth:`Region.destroy`.
        """
        op, bucket = self._prepare_destroy(key, callback_argument)
        expected = None if value is None else self.serializer.dumps(value)
        op = op._replace(kind=OperationKind.REMOVE, expected_value=expected)
        reply = self._server.one(op, bucket)
        if reply.event_kind is None:
            return False
        self._finish_destroy(op, reply)
        return True

    # --- reads of the server -----------------------------------------------------------

    def get_all(self: _Region, keys: list[str] | tuple[str, ...]) -> dict[str, Any]:
        """The values of many keys (Geode ``Region.getAll``): from the local cache where
        valid there, the rest from their buckets' primaries, a window of requests at a time
        (Geode's client sends one request per server; here the requests of a bucket travel
        together). Each value fetched is kept locally as :meth:`Region.get` keeps it.

        Returns:
            ``{key: value}`` for every key asked; None for a key the server does not hold
            or holds invalid.

        Raises:
            RequestLimitError: more than `regionbus.schemas.limits.MAX_BULK_ENTRIES` keys
                (nothing is sent).
            InvalidKeyError: a key is refused, as for :meth:`Region.put` (nothing is sent).
            RegionBusError: the first error a server answered (or a timeout), once every
                request sent was answered.
        """
        self._check_alive()
        key_list = list(dict.fromkeys(keys))
        check_count("keys per get_all", len(key_list), MAX_BULK_ENTRIES)
        for key in key_list:
            check_entry(key)
        found: dict[str, Any] = {}
        wanted: list[str] = []
        for key in key_list:
            local = self._store.valid(key) if self._caching else None
            if local is not None and local.value is not None:
                found[key] = self._values.decode(local.value, local.serializer)
            else:
                wanted.append(key)
        ops = [
            (self._server.operation(OperationKind.GET, key=k), self._server.bucket(k))
            for k in wanted
        ]
        errors: list[BaseException] = []

        def answered(
            index: int, replies: list[Reply] | None, error: BaseException | None, _sent: bool
        ) -> bool:
            if error is None and replies and not replies[0].ok:
                error = error_from_wire(replies[0].error_type, replies[0].error_message)
            if error is not None or not replies:
                errors.append(error or RegionBusError("no reply"))
                return False
            found[wanted[index]] = self._loaded(wanted[index], replies[0])
            return True

        send_windowed(
            self._cache.pool, ops, answered, window=BULK_ENTRIES_IN_FLIGHT, group=BULK_SEND_GROUP
        )
        if errors:
            raise errors[0]
        return {key: found.get(key) for key in key_list}

    def contains_key_on_server(self: _Region, key: str) -> bool:
        """Whether the server holds the key, valid or invalid (Geode
        ``Region.containsKeyOnServer``). Not an access of the entry (its idle timeout is
        not pushed back).

        Raises:
            InvalidKeyError, RegionNotFoundError, ServerTimeoutError, UnconnectedError: as
                :meth:`Region.get`.
        """
        self._check_alive()
        check_entry(key)
        op = self._server.operation(OperationKind.CONTAINS_KEY, key=key)
        return self._server.one(op, self._server.bucket(key)).found

    # --- queries of the region ---------------------------------------------------------

    def query(self: _Region, predicate: str, *params: Any) -> list[Any]:
        """The values of this region a predicate selects, read on the servers (Geode
        ``Region.query(queryPredicate)``, which runs ``SELECT * FROM /region this WHERE
        predicate``; a whole query, beginning with ``SELECT`` or ``IMPORT``, runs as
        written).

        Args:
            predicate: An OQL predicate over a value (``this``, or an attribute's bare
                name: ``dep_delay > $1 AND origin = 'JFK'``), or a whole query.
            params: The values of ``$1``, ``$2``, ... (Geode's takes none).

        Returns:
            The values selected (or the rows of a whole query), as
            :meth:`regionbus.clients.oql_query.Query.execute` answers them.

        Raises:
            QueryInvalidError: the predicate does not parse or is outside what runs, or the
                parameters do not fit it (nothing was sent).
            QueryExecutionTimeoutError, QueryRowLimitError, QueryTypeMismatchError,
                QueryInvocationTargetError, RegionNotFoundError, ServerTimeoutError: as
                ``Query.execute``.
        """
        self._check_alive()
        return region_query(self._cache, self.name, self.serializer, predicate).execute(*params)

    def exists_value(self: _Region, predicate: str, *params: Any) -> bool:
        """Whether the predicate selects any value of this region (Geode
        ``Region.existsValue``).

        Raises:
            What :meth:`query` raises.
        """
        return bool(self.query(predicate, *params))

    def select_value(self: _Region, predicate: str, *params: Any) -> Any:
        """The one value the predicate selects, None when it selects none (Geode
        ``Region.selectValue``).

        Raises:
            QueryFunctionDomainError: it selects more than one (Geode
                ``FunctionDomainException``).
            What :meth:`query` raises.
        """
        results = self.query(predicate, *params)
        if len(results) > 1:
            raise QueryFunctionDomainError(
                f"select_value expects results of size 1, but found results of size {len(results)}"
            )
        return results[0] if results else None

    def size_on_server(self: _Region) -> int:
        """How many entries the region has on the server, invalid ones included (Geode
        ``Region.sizeOnServer``): one request to every bucket, each answering a count.

        Raises:
            RegionNotFoundError: the region is not defined on the server.
            ServerTimeoutError: not every bucket answered within ``read_timeout_ms``.
        """
        self._check_alive()
        return sum(r.entry_count for r in self._server.every_bucket(OperationKind.SIZE))


def _decoded(values: RegionValues, reply: Reply) -> Any:
    """The value a reply carries, decoded; None when it carries none."""
    if reply.value is None:
        return None
    return values.decode(reply.value, reply.serializer)


__all__ = ["RegionServerOperations"]
