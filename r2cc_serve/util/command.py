"""Running a parsed `r2cc` command as users see it, for `r2cc` and the lean entry points
(`python -m r2cc_serve.doctor`): an error they can fix is one line and exit 2, Ctrl-C or
SIGTERM exits 130, a reader that left a pipe is not an error."""

from __future__ import annotations

import os
import signal
import sys
import threading

from r2cc_serve.errors import UserError


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def unwind_on_sigterm() -> None:
    # SIGTERM (kill, a CI time-out) unwinds like Ctrl-C: labs, vLLM processes and other
    # resources are released by the same context managers instead of being left behind.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


def run(args) -> int:
    """Call the command's `func` and turn what it raises into an exit code."""
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"r2cc: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("r2cc: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `r2cc lab status | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
