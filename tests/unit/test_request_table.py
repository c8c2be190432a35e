"""A client's table of pending requests: complete when every bucket answered (chunks
included), forgotten at their timeout or when taken, each outcome handed back once."""

from __future__ import annotations

from regionbus.clients.pending import RequestTable
from regionbus.schemas.messages import Reply


def _ignore(_replies: object, _error: object) -> None:
    return None


def test_a_request_completes_once_every_bucket_answered_its_last_chunk() -> None:
    table = RequestTable(timeout_s=30, retry_interval_s=1)
    table.add([(7, 2, _ignore)])
    assert table.answered(Reply(request_id=7, bucket=0, ok=True, more=True)) is None
    assert table.answered(Reply(request_id=7, bucket=0, ok=True)) is None
    done = table.answered(Reply(request_id=7, bucket=1, ok=True))
    assert done is not None and [r.bucket for r in done.replies] == [0, 0, 1]
    assert not table, "a completed request is forgotten"
    assert table.answered(Reply(request_id=7, bucket=1, ok=True)) is None


def test_requests_expire_at_their_timeout_and_can_be_taken() -> None:
    table = RequestTable(timeout_s=5, retry_interval_s=1)
    table.add([(1, 1, _ignore), (2, 1, _ignore), (3, 1, _ignore)])
    (first,) = table.take([1, 99])
    assert first.expected == 1
    expired = table.expired(first.expires_at + 0.1)
    assert len(expired) == 2 and not table
    table.add([(4, 1, _ignore)])
    assert len(table.take()) == 1 and not table
