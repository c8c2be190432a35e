"""Command-line options every benchmark shares, defined once so their defaults and help
stay the same across ``bench.core``, ``bench.scaling``, ``bench.failover`` and
``bench.durable_replay``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from regionbus.clients import ClientSettings

F = TypeVar("F", bound=Callable[..., Any])

CLIENT_FETCH_WAIT_MS = ClientSettings.model_fields["fetch_wait_max_ms"].default
CLIENT_LINGER_MS = ClientSettings.model_fields["linger_ms"].default

value_bytes_option = click.option(
    "--value-bytes",
    default=200,
    type=click.IntRange(min=8),
    show_default=True,
    help="Bytes of every value (the first 8 are the send time).",
)
"""``--value-bytes``: at least 8, the stamped send time (``bench.workers.stamped_value``)."""

idle_timeout_option = click.option(
    "--idle-timeout-s",
    default=30.0,
    show_default=True,
    help="Readers give up after this long without a message once the writer is done.",
)


def counts(text: str) -> tuple[int, ...]:
    """A comma-separated list of counts (``"1,10,100"``), each at least 1.

    Raises:
        click.BadParameter: not integers, none, or one below 1.
    """
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError as exc:
        raise click.BadParameter(f"comma-separated counts, not {text!r}") from exc
    if not values or min(values) < 1:
        raise click.BadParameter("every count must be at least 1")
    return values


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Also print the figures as one JSON line."
)


def fetch_wait_option(
    default: int = CLIENT_FETCH_WAIT_MS,
    help_text: str = "fetch.wait.max.ms of every consumer (the clients' default).",
) -> Callable[[F], F]:
    """``--fetch-wait-ms`` into the ``fetch_wait_max_ms`` parameter.

    Args:
        default: Milliseconds (the clients' default unless a benchmark measures servers).
        help_text: Which consumers it sets, for ``--help``.
    """
    return click.option(
        "--fetch-wait-ms",
        "fetch_wait_max_ms",
        default=default,
        show_default=True,
        help=help_text,
    )


def linger_option(
    default: int = CLIENT_LINGER_MS,
    help_text: str = "linger.ms of every producer (the clients' default).",
) -> Callable[[F], F]:
    """``--linger-ms``.

    Args:
        default: Milliseconds (the clients' default unless a benchmark measures servers).
        help_text: Which producers it sets, for ``--help``.
    """
    return click.option("--linger-ms", default=default, show_default=True, help=help_text)
