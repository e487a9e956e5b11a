"""What handing a layer to the worker pool costs on this machine, measured, not assumed.

A split layer pays one handoff: the caller publishes the job, the workers claim parts, the caller
waits for the last one. The probe builds the pool the generated code carries (``workers.Pool``)
with a job whose every part is a fixed busy loop of about ``PART_US``; the handoff is the pool
running ``threads`` such parts minus one part run directly, medians over interleaved samples. What
a compile keeps (:func:`handoff_us`) is the least of several such medians, rounded up to a power of
two: a burst of other work during one block moves a median, not the least of them, and the rounding
keeps the split decision from following the measurement's last digits (two quiet compiles four
minutes apart split 3 and 48 of MobileNetV2's layers when a single median decided). A machine whose
other cores stay busy through every block still shows it (the caller then runs the parts itself and
the handoff costs up to a part per missing core), and fewer layers split.

``cold_gap_s`` waits that long before each call, so the workers have given up spinning and sleep on
their futex (``Tuning.pool_spin``): the first split layer after a long unsplit stretch pays that.
"""

from __future__ import annotations

import ctypes
import math
import statistics
import time

from llvmlite import ir

from ..compiler.codegen.cpu.workers import JOB_TYPE, Pool
from ..compiler.codegen.irhelpers import I64, target_attrs
from ..compiler.target import Target
from .levels import ENTRY_LEVEL
from .linking import load_functions
from .placement import CallerPlacement

PART_US = 20.0  # a part long enough that a worker waking late shows, short enough to repeat often
_ENTRY = "probe"
_JOB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)
_PAR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)
_VOID = ctypes.CFUNCTYPE(None)


def _busy_job(module: ir.Module) -> ir.Function:
    """``job(arena, weights, part)``: ``*(i64*)arena`` rounds of an empty side-effecting asm (kept by any optimizer)."""
    fn = ir.Function(module, JOB_TYPE, name=f"{_ENTRY}_busy")
    fn.attributes.add("noinline")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    n = b.load(b.bitcast(fn.args[0], I64.as_pointer()))
    pre, loop, done = b.block, fn.append_basic_block("loop"), fn.append_basic_block("done")
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(I64)
    i.add_incoming(ir.Constant(I64, 0), pre)
    b.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "", "", side_effect=True), [])
    nxt = b.add(i, ir.Constant(I64, 1))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
    b.position_at_end(done)
    b.ret_void()
    return fn


class Probe:
    """The pool of ``target.threads`` threads with a busy job, started; ``close()`` joins the workers.
    ``llvm``: where its LLVM work goes (a compile's :class:`.stream.KernelStream`; default: here)."""

    def __init__(self, target: Target, llvm=None) -> None:
        module = ir.Module(name="pool_probe")
        module.triple = target.triple
        attrs = target_attrs(target)
        job = _busy_job(module)
        Pool(module, _ENTRY, target, attrs)
        obj = _object(str(module), target, llvm)
        names = [job.name] + [f"{_ENTRY}_{n}" for n in ("par", "start", "stop", "nudge")]
        self.code, (job_at, par_at, start_at, stop_at, nudge_at) = load_functions([obj], names, target)
        self.threads = target.threads
        self._placement = CallerPlacement(target.threads if target.tuning.pool_pin else 1)
        self.iters = (ctypes.c_int64 * 8)(1000)
        self._job, self._job_at = _JOB(job_at), job_at
        self._par, self._stop, self._nudge = _PAR(par_at), _VOID(stop_at), _VOID(nudge_at)
        _VOID(start_at)()
        self._calibrate()

    def _calibrate(self) -> None:
        """Loop count for a part of about ``PART_US``: scaled from a loop long enough that the call's
        own cost (about a microsecond through ctypes) is small in it (from 1,000 rounds, parts came out
        6.6 us on Zen 4, so a worker claiming its part later than that read as a whole part's handoff)."""
        while (one := min(self._seconds(self.part) for _ in range(5))) < PART_US * 1e-6 / 4 and self.iters[0] < 1 << 40:
            self.iters[0] *= 4
        self.iters[0] = max(1, int(self.iters[0] * PART_US * 1e-6 / max(one, 1e-9)))

    @staticmethod
    def _seconds(call) -> float:
        t = time.perf_counter()
        call()
        return time.perf_counter() - t

    def part(self) -> None:
        self._job(ctypes.addressof(self.iters), None, 0)

    def shared(self) -> None:
        self._par(self._job_at, ctypes.addressof(self.iters), None, self.threads)

    def handoff_us(self, samples: int = 200, cold_gap_s: float = 0.0) -> float:
        """Median of the pool's ``threads`` parts minus median of one part, in microseconds, over
        ``samples`` interleaved pairs (the typical cost, a busy machine's included); at least 0.
        Hot, the workers are nudged before the lone part, as a model nudges them a layer before a job.
        The caller steps off the workers' CPUs first, as a session's does before each run: on a worker's
        CPU it shares that CPU with the worker, which then claims its part only after the caller's own,
        and the probe read a part's length (20 us) where the handoff costs 0.3 (a 2-core Zen 4, the
        caller on CPU 1: 5 blocks of 5)."""
        times: dict = {self.part: [], self.shared: []}
        for _ in range(samples):
            self._placement.step_aside()
            for call, got in times.items():
                if cold_gap_s:
                    time.sleep(cold_gap_s)
                elif call == self.part:
                    self._nudge()
                got.append(self._seconds(call))
        part, shared = (statistics.median(v) for v in times.values())
        return max(0.0, (shared - part) * 1e6)

    def close(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None


BLOCKS, BLOCK_SAMPLES = 5, 40  # five medians of 40 pairs, about 5 ms each at 2 threads
BLOCK_GAP_S = 0.005  # between blocks: a burst of other work that spans one block misses the next
FLOOR_US = 1.0  # no handoff is cheaper: the grid's first step


def grid_us(measured: float) -> float:
    """``measured`` rounded up to a power of two microseconds, at least ``FLOOR_US``."""
    return max(FLOOR_US, 2.0 ** math.ceil(math.log2(max(measured, 1e-3))))


def _object(text: str, target: Target, llvm) -> bytes:
    """The pool at the level the model's pool gets."""
    if llvm is not None:
        return llvm.result(llvm.submit(ENTRY_LEVEL, text))
    from . import jit

    return jit.emit_object(text, target, jit=True, speed_level=ENTRY_LEVEL)


_MEASURED: dict[Target, float] = {}


def handoff_us(target: Target, llvm=None) -> float:
    """The cost of one split layer's handoff at ``target.threads`` (workers spinning, as between
    back-to-back layers): the least of ``BLOCKS`` medians ``BLOCK_GAP_S`` apart, on the power-of-two
    grid, at most the profile's ``parallel_sync_us`` (a machine whose other cores stay busy reads as a
    part's length or more; the whole-model check, :mod:`.split_check`, decides for that machine); a
    block that reads ``FLOOR_US`` or less ends it, as no later one could change the result (a quiet
    2-core Zen 4: ~25 of a cold compile's ms); measured once per process and target (``llvm``: as
    :class:`Probe`'s)."""
    if target in _MEASURED:
        return _MEASURED[target]
    probe = Probe(target, llvm)
    try:
        least = float("inf")
        for i in range(BLOCKS):
            if i:
                time.sleep(BLOCK_GAP_S)
            least = min(least, probe.handoff_us(samples=BLOCK_SAMPLES))
            if least <= FLOOR_US:  # on the grid's first step already: no block can lower it
                break
        return _MEASURED.setdefault(target, min(grid_us(least), target.tuning.parallel_sync_us))
    finally:
        probe.close()
