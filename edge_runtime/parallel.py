"""LLVM helper processes for cold compiles, and the levels the module optimizer runs at.

LLVM spends most of a cold compile optimising and generating code for kernels that never call
each other, and llvmlite serialises every call behind one lock, so threads of one process cannot
share that work: other processes can. They are spawned (:mod:`.llvm_worker`), not forked, so a
process running gRPC or ONNX Runtime threads may use them too; :mod:`.stream` feeds them kernels
while the model is still being lowered.
"""

from __future__ import annotations

import os
import subprocess

from ..compiler.codegen.irhelpers import PREVECTORIZED
from .jit import SPEED_LEVEL as FULL_LEVEL
from .llvm_worker import command

LIGHT_ATTR = f'"{PREVECTORIZED}"'  # on a prevectorized kernel's define line
LIGHT_LEVEL = 0  # prevectorized kernels: no module optimizer, code generation at full level (same speed, measured)
HELPER_TIMEOUT_S = 600


def workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


class Helpers:
    """LLVM helper processes, started before lowering so their start-up (llvmlite, ~0.1 s) overlaps the Python lowering instead of adding to the cold compile."""

    def __init__(self, count: int):
        cmd = command()
        self.procs: list[subprocess.Popen] = []
        for _ in range(max(0, count)):
            try:
                self.procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE))
            except OSError:
                break  # no helper: the parts are compiled here

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            for f in (p.stdin, p.stdout, p.stderr):
                if f is not None:
                    try:
                        f.close()
                    except OSError:  # a dead helper's stdin: its unflushed bytes have nowhere to go
                        pass
        self.procs = []

    def __enter__(self) -> Helpers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
