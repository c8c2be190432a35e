"""bench.load.paced_puts: answers are counted as they come, and no put's future outlives
its answer (a writer that kept them grew a heap whose collections stopped it)."""

from __future__ import annotations

import weakref
from concurrent.futures import Future
from typing import Any

from bench.load import paced_puts


class _Region:
    """Answers each put at once; the fifth of every ten with an error. Remembers only weak
    references to the futures it returned, and how many were still alive at each put."""

    def __init__(self) -> None:
        self.returned: list[weakref.ref[Future[None]]] = []
        self.alive_at_put: list[int] = []
        self.keys: list[str] = []

    def put_async(self, key: str, value: bytes) -> Future[None]:
        self.alive_at_put.append(sum(1 for ref in self.returned if ref() is not None))
        self.keys.append(key)
        future: Future[None] = Future()
        if len(self.keys) % 10 == 5:
            future.set_exception(RuntimeError("refused"))
        else:
            future.set_result(None)
        self.returned.append(weakref.ref(future))
        return future


def test_answers_are_counted_and_no_answered_future_is_kept() -> None:
    region = _Region()
    sent, acknowledged, first_ns, last_ns = paced_puts(region, 2000, 0.02, 16)  # type: ignore[arg-type]
    assert sent == 40
    assert acknowledged == 36  # four of the forty were answered with an error
    assert region.keys[:3] == ["lat-0", "lat-1", "lat-2"]
    assert first_ns <= last_ns
    # Each earlier future was gone by the next put: the writer holds none it was answered.
    assert max(region.alive_at_put) == 0


def test_given_keys_are_put_in_turn() -> None:
    region = _Region()
    keys: Any = ("a", "b", "c")
    paced_puts(region, 2000, 0.005, 16, keys)  # type: ignore[arg-type]
    assert region.keys == ["a", "b", "c", "a", "b", "c", "a", "b", "c", "a"]
