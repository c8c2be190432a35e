"""A server-side Function for the function failover test: the first server to run it dies
(SIGKILL) while it runs, once the execution's request is committed past, so no server
reads it again and only the client's re-execution can answer its bucket. Fault injection
for that test only, loaded by import path (the ``functions`` setting)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from regionbus.schemas.functions import Function, FunctionContext, RegionFunctionContext

MARKER_ENV = "FUNCTION_KILL_MARKER"
"""The file whose creation elects the one execution that kills its server (the test sets
it)."""

COMMITTED_AFTER_S = 1.5
"""How long the killing execution waits first: past the servers' offset commit interval
(the test's ``message_sync_interval_s``), so its request is committed."""


class KillOnFirstExecution(Function):
    """Answers its bucket, its server and whether it is a re-execution; the first
    execution on any server SIGKILLs that server instead."""

    id = "kill-on-first"

    def execute(self, context: FunctionContext) -> None:
        assert isinstance(context, RegionFunctionContext)
        try:
            Path(os.environ[MARKER_ENV]).open("x").close()
        except FileExistsError:
            pass  # another execution killed its server already: this one answers
        else:
            time.sleep(COMMITTED_AFTER_S)
            os.kill(os.getpid(), signal.SIGKILL)
        context.result_sender.last_result(
            {
                "bucket": context.bucket,
                "member": context.member_name,
                "duplicate": context.is_possible_duplicate,
            }
        )
