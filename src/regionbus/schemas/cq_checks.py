"""Checks of a continuous query's name and of how many a client holds, identical at the
client and the servers."""

from __future__ import annotations

from typing import Final

from regionbus.schemas.errors import CqInvalidError

MAX_CQS_PER_CLIENT: Final = 1000
"""Most continuous queries one client may hold: each is evaluated on every change of its
region on the servers' thread (Geode sets no limit)."""

MAX_CQ_NAME_CHARS: Final = 256
"""Longest CQ name: it rides in every CQ event of the CQ and names a Redis hash field
(Geode sets no limit)."""


def check_cq_name(name: object) -> str:
    """Refuse a CQ name that is not a non-empty ``str`` of at most
    :data:`MAX_CQ_NAME_CHARS` characters of valid Unicode.

    Raises:
        CqInvalidError: (rule ``name``) the name is refused, with the reason.
    """
    if not isinstance(name, str) or not name:
        raise CqInvalidError(f"a CQ name is a non-empty str, got {name!r}", rule="name")
    if len(name) > MAX_CQ_NAME_CHARS:
        raise CqInvalidError(
            f"CQ name of {len(name)} characters, more than {MAX_CQ_NAME_CHARS}", rule="name"
        )
    try:
        name.encode()
    except UnicodeEncodeError as exc:
        raise CqInvalidError(f"CQ name is not valid Unicode: {exc}", rule="name") from None
    return name


__all__ = ["MAX_CQS_PER_CLIENT", "MAX_CQ_NAME_CHARS", "check_cq_name"]
