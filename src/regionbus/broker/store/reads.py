"""Entry reads: one entry, a bucket's entries a registration covers (the initial results
of interest and continuous queries), and an entry's stored gateway version. Reads are
plain Redis commands: they change nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from regionbus.broker.store.base import StoreBase
from regionbus.broker.store.results import GatewayVersion, Snapshot, to_entry, version_of
from regionbus.runtime.redis_connect import redis_errors
from regionbus.schemas.messages import Entry
from regionbus.schemas.redis_values import parse_gateway_version, parse_meta


class EntryReads(StoreBase):
    """Reads entries (the store's part for them; see :class:`StoreBase` for the
    arguments)."""

    def gateway_version(self, region: str, key: str, bucket: int) -> GatewayVersion | None:
        """The stored gateway version of an entry (or of its tombstone), if any.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            raw = self.redis.hget(self.keys.region_gateway_versions(region, bucket), key)
        if raw is None:
            return None
        return parse_gateway_version(raw)

    def region_size(self, region: str, bucket: int) -> tuple[bool, int]:
        """``(region_exists, entries)``: how many entries the region has in one bucket,
        invalid ones included (one round trip).

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            pipe = self.redis.pipeline(transaction=True)
            pipe.sismember(self.keys.regions(bucket), region)
            pipe.hlen(self.keys.region_meta(region, bucket))
            exists, count = pipe.execute()
        return bool(exists), int(count)

    def get(self, region: str, key: str, bucket: int) -> tuple[bool, Entry | None]:
        """Read one entry.

        Returns:
            ``(region_exists, entry)``; ``entry`` is None when absent, and has value None
            when invalid.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            pipe = self.redis.pipeline(transaction=True)
            pipe.sismember(self.keys.regions(bucket), region)
            pipe.hget(self.keys.region_meta(region, bucket), key)
            pipe.hget(self.keys.region_values(region, bucket), key)
            exists, meta, value = pipe.execute()
        return to_entry(key, exists, meta, value)

    def snapshot(
        self,
        region: str,
        bucket: int,
        keys: Sequence[str] | None = None,
        key_filter: Callable[[str], bool] | None = None,
        with_values: bool = True,
    ) -> Snapshot:
        """Read the entries of one bucket that a registration covers.

        One owner processes a bucket's operations in order, so nothing changes the bucket
        between the two reads (metadata, then the values of the keys that qualify).

        Args:
            region: Region name.
            bucket: The bucket.
            keys: Read only these keys (a KEYS registration); None reads the whole bucket.
            key_filter: Keep only keys it accepts (a REGEX registration), applied before
                any value is read.
            with_values: Read values too (policy KEYS_VALUES); else entries carry none.

        Returns:
            Whether the region exists, the entries, and the region's version counter at
            the read (every later change of this bucket gets a higher version).

        Raises:
            TransportError: Redis failed.
        """
        meta_key = self.keys.region_meta(region, bucket)
        with redis_errors():
            pipe = self.redis.pipeline(transaction=True)
            pipe.sismember(self.keys.regions(bucket), region)
            pipe.hmget(self.keys.region_version(region, bucket), "gen", "n")
            if keys is not None:
                pipe.hmget(meta_key, list(keys) or [""])
                exists, version_counter, metas = pipe.execute()
                found = [(k, m) for k, m in zip(keys, metas, strict=False) if m]
            else:
                pipe.hgetall(meta_key)
                exists, version_counter, all_metas = pipe.execute()
                found = [(k.decode(), m) for k, m in all_metas.items()]
            if key_filter is not None:
                found = [(k, m) for k, m in found if key_filter(k)]
            entries = self._with_values(region, bucket, found, with_values)
        return Snapshot(bool(exists), entries, version_of(version_counter))

    def scan_page(
        self,
        region: str,
        bucket: int,
        cursor: int,
        count: int,
        key_filter: Callable[[str], bool] | None = None,
        with_values: bool = True,
    ) -> tuple[int, list[Entry]]:
        """Read one page of a bucket's entries (Redis ``HSCAN``), for initial results read
        over several turns of the loop.

        ``HSCAN`` returns every entry present from the first page to the last at least
        once; an entry created, changed or destroyed meanwhile may be returned or not, or
        twice. Initial results read this way are sound only when the reader also gets
        every change made from the first page on (the registration is in place before it)
        and keeps the newest version of each key (as clients do).

        Args:
            region: Region name.
            bucket: The bucket.
            cursor: 0 for the first page, then the cursor the previous page returned.
            count: About how many entries to read (Redis ``COUNT``: a hint, not a bound).
            key_filter: Keep only keys it accepts, applied before any value is read.
            with_values: Read values too; else entries carry none.

        Returns:
            The cursor of the next page (0: this was the last) and the page's entries.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            next_cursor, metas = self.redis.hscan(
                self.keys.region_meta(region, bucket), cursor, count=count
            )
            found = [(k.decode(), m) for k, m in metas.items()]
            if key_filter is not None:
                found = [(k, m) for k, m in found if key_filter(k)]
            entries = self._with_values(region, bucket, found, with_values)
        return int(next_cursor), entries

    def _with_values(
        self, region: str, bucket: int, found: list[tuple[str, bytes]], with_values: bool
    ) -> list[Entry]:
        """The entries of ``(key, meta)`` pairs read, with their values when asked (read
        in the same turn of the loop as the metadata, so nothing changed between).

        Raises:
            RedisError: Redis failed (the caller translates it).
        """
        values: list[bytes | None] = [None] * len(found)
        if with_values and found:
            values = self.redis.hmget(
                self.keys.region_values(region, bucket), [k for k, _ in found]
            )
        entries = []
        for (key, meta), value in zip(found, values, strict=True):
            version, serializer = parse_meta(meta)
            entries.append(Entry(key, version, value, serializer))
        return entries

    def pages(self, region: str, bucket: int, page_entries: int) -> Iterator[list[Entry]]:
        """The valid entries of one bucket, a page at a time (:meth:`scan_page`): a reader
        may stop between pages, so reading a large bucket holds neither Redis nor the
        caller for long. Read off the bucket's loop (a query's worker thread), the pages
        may or may not see a change made meanwhile, as :meth:`scan_page` says.

        Args:
            region: Region name.
            bucket: The bucket.
            page_entries: About how many entries one page reads (Redis' ``COUNT`` hint).

        Yields:
            Lists of entries, each key once; invalid entries are left out.

        Raises:
            TransportError: Redis failed.
        """
        seen: set[str] = set()
        cursor = 0
        while True:
            cursor, entries = self.scan_page(region, bucket, cursor, page_entries)
            # HSCAN may return a key twice; each is answered once.
            page = [e for e in entries if e.key not in seen and e.value is not None]
            seen.update(e.key for e in entries)
            yield page
            if cursor == 0:
                return

    def entries(self, region: str) -> dict[str, Entry]:
        """Every entry of a region across all buckets (for tests, tools, verification).

        Raises:
            TransportError: Redis failed.
        """
        out: dict[str, Entry] = {}
        for bucket in range(self.total_buckets):
            found = self.snapshot(region, bucket).entries
            out.update((e.key, e) for e in found)
        return out


__all__ = ["EntryReads"]
