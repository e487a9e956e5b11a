"""Running compiled code where a memory fault fails one test instead of killing the test runner."""

from __future__ import annotations

import faulthandler
import os
import pickle
import tempfile
from collections.abc import Mapping

import numpy as np


def run_in_child(session, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``session.run(feeds)`` in a forked child; its outputs, or AssertionError naming the signal
    (a session compiled with ``guard_pages=True`` faults at the first access outside its memory)."""
    fd, path = tempfile.mkstemp(suffix=".pkl")
    os.close(fd)
    try:
        pid = os.fork()
        if pid == 0:
            faulthandler.disable()
            code = 3
            try:
                with open(path, "wb") as f:
                    pickle.dump(session.run(feeds), f)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            raise AssertionError(f"the compiled model was killed by signal {os.WTERMSIG(status)} (memory fault)")
        assert os.WEXITSTATUS(status) == 0, f"the compiled model's run failed in the child ({status})"
        with open(path, "rb") as f:
            return pickle.load(f)
    finally:
        os.unlink(path)
