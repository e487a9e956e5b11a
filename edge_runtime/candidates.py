"""A conv candidate built alone and timed: its kernel's IR made here, its LLVM work handed to a compile's
stream (:class:`Compiler`), its buffers shared with the layer's other candidates; and the interleaved
timing every candidate and split part is measured by (:func:`interleaved_seconds`). The tuner
(:mod:`.autotune`) decides from these measurements.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from llvmlite import ir

from ..compiler.codegen.cpu.conv.choices import emit_choice
from ..compiler.codegen.irtext import drop_body, module_text
from ..compiler.spread import spread
from ..compiler.target import ConvChoice, Geometry, Target
from .levels import LIGHT_LEVEL
from .linking import load_functions

ROUND_S = 0.002  # one timing round per candidate: about this long
ROUNDS = 5  # interleaved rounds per candidate: see autotune.pick
_FN = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 6)


def interleaved_seconds(calls: dict, rounds: int = ROUNDS, round_s: float = ROUND_S,
                        clock: Callable[[], float] = time.thread_time,
                        combine: Callable[[list[float]], Any] = tuple) -> dict:
    """Seconds per call of each: the median within a round of about `round_s`, one per round of `rounds`
    interleaved rounds (``combine`` may reduce them: ``min``, as another process's burst only ever adds
    time). Timed on this thread's CPU clock by default: on a shared device, time spent descheduled is not
    the kernel's."""
    reps = {}
    for c, call in calls.items():
        call()
        t = clock()
        call()
        reps[c] = max(1, int(round_s / max(clock() - t, 1e-7)))
    per_round: dict = {c: [] for c in calls}
    for _ in range(rounds):
        for c, call in calls.items():
            ts = []
            for _ in range(reps[c]):
                t = clock()
                call()
                ts.append(clock() - t)
            per_round[c].append(statistics.median(ts))
    return {c: combine(v) for c, v in per_round.items()}


class Compiler(Protocol):
    """Where candidates' LLVM work goes (:class:`.stream.KernelStream`): queued, then waited for."""

    def submit(self, level: int, text: str) -> int: ...

    def result(self, i: int) -> bytes: ...

    seconds: list[float]
    workers: int  # LLVM compiles at once


class Buffers:
    """The input, bias, output and scratch that one layer's candidates share: they run one at a time.
    Each candidate held its own before: ResNeXt-tiny's 256-channel 64x64 1x1 conv, four candidates of
    a 4 MiB input and output each (and im2col's 4 MiB scratch), made that model's cold peak 111 MiB."""

    def __init__(self, geom: Geometry) -> None:
        N, C, H, W = geom[:4]
        self.x, self.bias = aligned_copy(spread((N, C, H, W))), aligned_copy(spread(geom[4], seed=1))
        self.y: np.ndarray | None = None
        self.s = aligned_copy(np.zeros(16))

    def output(self, shape: tuple[int, ...]) -> np.ndarray:
        if self.y is None or self.y.shape != tuple(shape):
            self.y = aligned_copy(np.zeros(shape))
        return self.y

    def scratch(self, nbytes: int) -> np.ndarray:
        """At least ``nbytes`` of scratch (and 64 more: tail loads); the largest so far, which a
        candidate that needs more replaces (those before keep theirs)."""
        if 4 * self.s.size < nbytes + 64:
            self.s = aligned_copy(np.zeros(nbytes // 4 + 16))
        return self.s


class Candidate:
    """One candidate kernel built alone, with its packed weights; its input, output and scratch from
    ``io`` (a layer's candidates share them) or its own. The constructor emits
    its IR here and hands the LLVM work to ``llvm`` (the next candidate's IR is built meanwhile), or
    does it here when there is none; :meth:`wait` loads the code and returns the build time (IR plus
    LLVM, as if done in turn)."""

    def __init__(self, target: Target, geom: Geometry, choice: ConvChoice, weights: np.ndarray,
                 clock: Callable[[], float], llvm: Compiler | None = None, io: Buffers | None = None) -> None:
        t0 = clock()
        self.choice, self.geom, self.target, self.clock, self.llvm, self.io = choice, geom, target, clock, llvm, io
        module = ir.Module(name="tune")
        module.triple = target.triple
        self.wp, self.scratch_bytes, self.out_shape = emit_choice(module, "k", target, geom, choice, weights)
        text = module_text(module)
        for fn in module.functions:
            drop_body(fn)
        self.emit_s = clock() - t0
        if llvm is not None:
            self.pending = llvm.submit(LIGHT_LEVEL, text)  # as the model's conv kernels
        else:
            from . import jit

            self.obj = jit.emit_object(text, target, jit=True, speed_level=LIGHT_LEVEL)
            self.emit_s = clock() - t0
        self.build_s: float | None = None

    def wait(self) -> float:
        if self.build_s is not None:
            return self.build_s
        t0 = self.clock()
        obj, llvm_s = (self.llvm.result(self.pending), self.llvm.seconds[self.pending]) if self.llvm else (self.obj, 0.0)
        self.code, (address,) = load_functions([obj], ["k"], self.target)
        self.llvm_s = llvm_s
        self.build_s = self.emit_s + llvm_s + self.clock() - t0
        io = self.io if self.io is not None else Buffers(self.geom)
        x, y, bias, s = io.x, io.output(self.out_shape), io.bias, io.scratch(self.scratch_bytes)
        w = aligned_copy(self.wp)
        self.wp, self.io = None, None  # the aligned copy serves from now on: one copy of the packed weights per candidate, not two
        self.buffers = (x, y, bias, w, s)
        fn, ptrs = _FN(address), (x.ctypes.data, w.ctypes.data, bias.ctypes.data, None, y.ctypes.data, s.ctypes.data)
        self.call = lambda: fn(*ptrs)
        return self.build_s

    def stages(self) -> tuple[float, float]:
        """(IR seconds, LLVM seconds) of this build, once waited for; without a compiler the IR's
        figure includes the LLVM work done in turn (then the LLVM one is 0)."""
        self.wait()
        return self.emit_s, self.llvm_s


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """A float32 copy starting on a 64-byte boundary (the kernels' aligned vector loads)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    buf = np.zeros(a.size + 16, dtype=np.float32)
    off = (-buf.ctypes.data // 4) % 16
    out = buf[off:off + a.size].reshape(a.shape)
    out[...] = a
    return out
