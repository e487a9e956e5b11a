"""LLVM helper processes for cold compiles.

LLVM spends most of a cold compile optimising and generating code for kernels that never call
each other, and llvmlite serialises every call behind one lock, so threads of one process cannot
share that work: other processes can. They are spawned (:mod:`.llvm_worker`), not forked, so a
process running gRPC or ONNX Runtime threads may use them too; :mod:`.stream` feeds them kernels
while the model is still being lowered.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

from ..compiler.codegen.irhelpers import PREVECTORIZED, SLOTTED
from ..devices.llvm_facts import FACTS_REQUEST, HostFacts
from .llvm_worker import command

LIGHT_ATTR = f'"{PREVECTORIZED}"'  # on a prevectorized kernel's define line
SLOTS_ATTR = f'"{SLOTTED}"'  # on one whose sums live in stack slots
HELPER_TIMEOUT_S = 600


def workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


class Helpers:
    """LLVM helper processes, started before lowering so their start-up (llvmlite, ~0.1 s) overlaps the
    Python lowering instead of adding to the cold compile. ``adopt``: helpers started earlier (to ask
    :meth:`host_facts`), taken over and all used even beyond ``count``: their start-up is paid."""

    def __init__(self, count: int, adopt: Helpers | None = None):
        self.procs: list[subprocess.Popen] = []
        if adopt is not None:
            self.procs, adopt.procs = adopt.procs, []
        while len(self.procs) < count and self.spawn() is not None:
            pass

    def spawn(self) -> subprocess.Popen | None:
        """One more helper (kept in :attr:`procs`, stopped by :meth:`close`); None when none can start
        (the parts are then compiled where the others or this process are)."""
        try:
            p = subprocess.Popen(command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError:
            return None
        self.procs.append(p)
        return p

    def host_facts(self, meanwhile: Callable[[], None] | None = None) -> HostFacts | None:
        """LLVM's facts about this CPU, asked of the first helper (which loads llvmlite anyway), so
        this process need not load it for them; ``meanwhile`` runs here while the helper starts.
        None without a helper, or when it failed (then it is stopped)."""
        if not self.procs:
            return None
        p = self.procs[0]
        try:
            p.stdin.write(FACTS_REQUEST + b"\n")
            p.stdin.flush()
            asked = True
        except OSError:
            asked = False
        if meanwhile is not None:
            meanwhile()
        if asked:
            try:
                return HostFacts.from_json(p.stdout.readline())
            except (OSError, ValueError, KeyError, TypeError):
                pass
        self.procs.remove(p)
        _stop(p)
        return None

    def close(self) -> None:
        for p in self.procs:
            _stop(p)
        self.procs = []

    def __enter__(self) -> Helpers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait()
    for f in (p.stdin, p.stdout, p.stderr):
        if f is not None:
            try:
                f.close()
            except OSError:  # a dead helper's stdin: its unflushed bytes have nowhere to go
                pass
