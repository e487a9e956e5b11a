"""Why a coordinator stopped before its run ended, in the words the results keep.

Flower ends a ServerApp that gets a signal with ``SystemExit(0)``, which reads like success and names
nothing: SIGTERM (an operator's ``kill``, a service manager) and SIGINT (Ctrl-C, or Flower itself when
the run is stopped or the ServerApp's heartbeat lapsed). :class:`StopSignals` notes which signal came
before the handler in place (Flower's graceful exit, or Python's KeyboardInterrupt) runs.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

STOPPED_BY = {  # signal -> the reason a run it stopped is aborted with
    signal.SIGTERM: "terminated (SIGTERM)",
    signal.SIGINT: "stopped (SIGINT: Ctrl-C, or Flower stopping the run)",
}


class StopSignals:
    """Notes the stop signals that arrive until :meth:`restore`; only in the main thread (the one Python
    runs handlers in), and only where a Python handler is in place (a default action is left alone)."""

    def __init__(self) -> None:
        self.noted: list[int] = []
        self._mine: dict[int, tuple[Callable, Callable]] = {}  # signal -> (the handler before, the noting one)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in STOPPED_BY:
            before = signal.getsignal(sig)
            if callable(before):
                self._mine[sig] = (before, self._noting(before))
                signal.signal(sig, self._mine[sig][1])

    def _noting(self, before: Callable) -> Callable[[int, FrameType | None], None]:
        def note(signum: int, frame: FrameType | None) -> None:
            self.noted.append(signum)
            before(signum, frame)
        return note

    def restore(self) -> None:
        """Put back each handler this replaced, unless someone changed it since (Flower resets its own)."""
        for sig, (before, noting) in self._mine.items():
            if signal.getsignal(sig) is noting:
                signal.signal(sig, before)
        self._mine.clear()

    def reason(self, error: BaseException) -> str:
        """Why a run that ``error`` ended was aborted: the signal that stopped the coordinator, else the error."""
        if self.noted and isinstance(error, (SystemExit, KeyboardInterrupt)):
            return STOPPED_BY[self.noted[0]]
        if isinstance(error, SystemExit):
            return f"the coordinator exited before the run ended (exit status {error.code})"
        return f"{type(error).__name__}: {error}"
