"""A server-side CacheListener for the expiration failover test: the first server to hear an
expiration dies on the spot (SIGKILL), after the expiration changed Redis and before its
events left the server. Fault injection for that test only, loaded by import path."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from regionbus.schemas.callbacks import CacheListener, EntryEvent

MARKER_ENV = "EXPIRY_KILL_MARKER"
"""The file whose creation elects the one server to kill (the test sets it)."""


class KillOnFirstExpiration(CacheListener):
    """SIGKILLs its own server at the first expiration any server hears."""

    def after_destroy(self, event: EntryEvent) -> None:
        if not event.is_expiration:
            return
        try:
            Path(os.environ[MARKER_ENV]).open("x").close()
        except FileExistsError:
            return  # another server died already: this one expires as usual
        os.kill(os.getpid(), signal.SIGKILL)
