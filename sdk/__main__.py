"""The ``cuvil`` command's entry point (pyproject's console script) and ``python -m cuvil``.

Ctrl-C ends any command with one line and exit status 130, also in the half second the CLI takes to
import (numpy, llvmlite, click) before click runs: this module imports only what the interpreter has
loaded already, so it is in place first.
"""

import os
import signal
import sys

GRACE_S = 2.0
"""How long other threads get to finish after Ctrl-C (a compile-cache write takes well under a second)."""


def _on_sigint(signum, frame):
    """From the moment of Ctrl-C nothing logs: Flower's worker threads printed an ERROR traceback each
    when the Ray they waited on shut down under them."""
    import logging

    logging.disable(logging.CRITICAL)
    raise KeyboardInterrupt


def _leave_stuck_threads(code: int) -> None:
    """Give the other threads ``GRACE_S``, then exit without them: Flower's workers wait on a Ray that
    is gone, and waiting for them (as Python does on exit) held the process for ever."""
    import threading
    import time

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while this ends: no traceback either
    deadline = time.monotonic() + GRACE_S
    others = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    for t in others:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in others):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        from .cli import INTERRUPTED, main as cli
    except KeyboardInterrupt:  # cli's line and status for Ctrl-C (cli is what was being imported)
        os.write(2, b"error: interrupted\n")
        sys.exit(130)
    try:
        cli(prog_name="cuvil")
    except SystemExit as e:
        if e.code == INTERRUPTED:
            _leave_stuck_threads(INTERRUPTED)
        raise


if __name__ == "__main__":
    main()
