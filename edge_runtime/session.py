"""Session: a compiled model bound to one arena; one native call per inference.

The arena and the weights block are allocated once, 64-byte aligned (the kernels are told so).
Inputs are copied straight into arena views, the entry point is called through a ctypes function
with pointers cached as plain ints (reading ``array.ctypes.data`` per call costs microseconds),
and outputs are returned as copies. The arena and weights pointers are handed to the code once
(``_bind``), so each inference is one argument-free native call, which releases the GIL.
One arena means one ``run`` at a time: a lock serializes threads that share a session (unguarded,
two threads gave wrong outputs), and distinct sessions still run in parallel.
Code compiled for several threads gets its workers here, once: the session starts them after
binding and joins them when it is closed or collected (a forked child forgets its parent's). Before
each run the calling thread steps off the CPUs its pinned workers hold (:mod:`.placement`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from ..compiler.codegen.lowered import IOSpec, LoweredModel, aligned_empty
from ..compiler.errors import InterpreterError, RunTimeCheckError
from ..compiler.ir.dtypes import clean_bools
from ..compiler.memory.plan import MemoryPlan
from .guard import guarded, make_read_only
from .huge_pages import MIN_BYTES, collapse, huge_page_bytes
from .objload import LoadedCode
from .placement import CallerPlacement
from .worker_watch import WorkerWatch

ALIGN = 64
_BIND = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
_BOUND = ctypes.CFUNCTYPE(None)
_BOOL = np.dtype(np.bool_)


@dataclass(frozen=True)
class CompileStats:
    lower_ms: float
    llvm_ms: float
    load_ms: float
    cache_hit: bool
    kernel_count: int
    node_count: int
    object_bytes: int
    cache_ms: float = 0.0  # computing the key and reading (and checking) the cache entry
    tune_ms: float = 0.0  # on-device autotuning (part of lower_ms)
    tuned_layers: int = 0  # conv layers whose measured choice replaced the cost model's
    builds: int = 0  # models lowered and compiled (0: a cache hit; each plan the split check tried next adds one)
    steps: tuple[tuple[str, float, float], ...] = ()  # a cache hit's steps: (name, wall ms, this thread's CPU ms)


class StepClock:
    """Wall and calling-thread CPU time of each step of a cache hit (two clock reads a step), so a
    benchmark shows where a warm start's milliseconds go without timing the code from outside."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, float, float]] = []
        self._last = (time.perf_counter(), time.thread_time())

    def mark(self, name: str) -> None:
        now = (time.perf_counter(), time.thread_time())
        self._steps.append((name, (now[0] - self._last[0]) * 1e3, (now[1] - self._last[1]) * 1e3))
        self._last = now

    def steps(self) -> tuple[tuple[str, float, float], ...]:
        return tuple(self._steps)


def _join(stop, *keep_alive) -> None:
    """Join a session's workers; ``keep_alive``: the code and memory they use, held until then."""
    stop()


_THREADED: weakref.WeakSet = weakref.WeakSet()


def _forget_workers() -> None:
    """In a forked child: the parent's workers do not exist here, so the parts run on this thread."""
    for session in list(_THREADED):
        session._detach()
        session._stop.detach()
        session._watch = None  # no workers to time
        session._lock = threading.Lock()  # the parent may have held it while forking


os.register_at_fork(after_in_child=_forget_workers)


def _read_only_aligned(block: np.ndarray | bytes) -> np.ndarray:
    """``block`` itself when it already is a read-only, 64-byte aligned uint8 array (what ``lower``
    returns: no second copy of the weights), else such a copy of it."""
    if (isinstance(block, np.ndarray) and block.dtype == np.uint8 and block.ndim == 1 and len(block)
            and not block.flags.writeable and block.ctypes.data % ALIGN == 0):
        return block
    out = aligned_empty(max(len(block), ALIGN))
    out[:len(block)] = np.frombuffer(block, dtype=np.uint8)
    out.flags.writeable = False
    return out


def new_arena(lowered: LoweredModel) -> np.ndarray:
    """A zeroed, populated, 64-byte aligned arena for ``lowered``."""
    return aligned_empty(max(lowered.arena_bytes, ALIGN))


def _view(arena: np.ndarray, spec: IOSpec) -> np.ndarray:
    return arena[spec.offset:spec.offset + spec.row_bytes].view(spec.dtype.numpy).reshape(spec.shape)


class Session:
    def __init__(self, lowered: LoweredModel, code: LoadedCode, stats: CompileStats, weights: np.ndarray | None = None,
                 guard_pages: bool = False, arena: np.ndarray | None = None):
        """``weights``: the packed block already in memory (a cache hit maps it from the file, read-only,
        64-byte aligned); without it the session runs on ``lowered.weights`` as it is when that is lower's
        aligned read-only array, else on a copy. ``guard_pages``: arena
        and weights each between two inaccessible pages (:mod:`.guard`), so an access past either faults.
        ``arena``: :func:`new_arena` of ``lowered``, made earlier (a warm start makes it while the
        weights' check runs)."""
        self.stats = stats
        self._code = code  # keeps the machine code mapped
        block = lowered.weights if weights is None or not len(weights) else weights
        mapped = block is weights  # a cache entry's file: the kernel does not collapse it, nor need it (:mod:`.huge_pages`)
        if guard_pages:
            self._arena = guarded(lowered.arena_bytes or ALIGN)  # an overrun of the last byte faults
            weights = guarded(len(block) or ALIGN)
            weights[:len(block)] = np.frombuffer(block, dtype=np.uint8)
            make_read_only(weights)
        else:
            self._arena = new_arena(lowered) if arena is None else arena
            if len(self._arena) < lowered.arena_bytes or self._arena.ctypes.data % ALIGN:
                raise ValueError("the arena must be 64-byte aligned and hold the plan's bytes")
            if weights is None or not len(weights):
                weights = _read_only_aligned(block)
            elif weights.ctypes.data % ALIGN:
                raise ValueError("the weights block must be 64-byte aligned")
        self._weights = weights
        self.lowered = dataclasses.replace(lowered, weights=b"")  # the block lives once, in _weights
        self._inputs = tuple((s.name, v, v.shape, v.dtype) for s in lowered.inputs for v in [_view(self._arena, s)])
        self._outputs = tuple((s.name, _view(self._arena, s)) for s in lowered.outputs)
        self._bounded = tuple((s, self._arena[s.offset:s.offset + s.nbytes]) for s in lowered.outputs if s.bounded)
        self._arena_ptr = int(self._arena.ctypes.data)
        self._weights_ptr = int(self._weights.ctypes.data)
        _BIND(code.bind)(self._arena_ptr, self._weights_ptr)
        self._collapsible = not (guard_pages or mapped or len(weights) < MIN_BYTES)
        self._collapse: threading.Thread | None = None
        self._fn = _BOUND(code.bound)
        self._lock = threading.Lock()
        fault = lowered.fault_offset
        if fault is not None and not 0 <= fault <= len(self._arena) - 4:
            raise ValueError(f"the fault word at {fault} is outside the arena")
        self._fault = None if fault is None else ctypes.c_int32.from_address(self._arena_ptr + fault)
        self.threads = lowered.target.threads
        self._stop: weakref.finalize | None = None
        self._watch: WorkerWatch | None = None
        threaded = self.threads > 1 and code.start and lowered.split_nodes  # no job, no workers: nothing to wake
        self._placement = CallerPlacement(self.threads if threaded and lowered.target.tuning.pool_pin else 1)
        if threaded:
            self._start, self._join = _BOUND(code.start), _BOUND(code.stop)
            if lowered.workers:  # else its parts run here until the watch finds the workers pay
                self._start()
            self._stop = weakref.finalize(self, _join, self._join, code, self._arena, self._weights)
            self._detach = _BOUND(code.detach)
            _THREADED.add(self)

    def set_workers(self, on: bool) -> None:
        """Start the workers again, or join them (every part then runs on the calling thread): the
        compile-time check times the model both ways (:mod:`.split_check`). The caller's choice
        stands: the session stops re-timing itself (:meth:`watch_workers`)."""
        with self._lock:
            self._watch = None
            self._switch_workers(on)

    def _switch_workers(self, on: bool) -> None:
        if self._stop is not None and self._stop.alive:  # closed stays closed
            (self._start if on else self._join)()

    def watch_workers(self, clock: Callable[[], float] = time.perf_counter) -> None:
        """From now on a split session times itself with its workers and without them every
        ``Tuning.worker_watch_s`` seconds, on its own runs, and keeps the faster way
        (:mod:`.worker_watch`; a compile turns it on once its check is done). No-op for a model that
        runs on one thread, or with the setting at 0."""
        tuning = self.lowered.target.tuning
        if self._stop is None or not self._stop.alive or tuning.worker_watch_s <= 0:
            return
        with self._lock:
            self._clock = clock
            self._watch = WorkerWatch(tuning.worker_watch_s, tuning.worker_watch_runs, self._switch_workers, clock(),
                                      workers=self.lowered.workers)

    def close(self) -> None:
        """Join the worker threads now (a later ``run`` runs every part on the calling thread)."""
        if self._stop is not None:
            with self._lock:
                self._stop()

    @property
    def memory_plan(self) -> MemoryPlan:
        return self.lowered.plan

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(spec[0] for spec in self._inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self._outputs)

    def collapse_weights_later(self) -> None:
        """After the next run, move the weights onto huge pages in place, on a thread of their own
        (:mod:`.huge_pages`): where they are the lowering's 4 KiB pages (not a cache entry's file) and at least
        ``MIN_BYTES``. A compile asks once its checks have timed the session, so the move shares a core
        with none of them."""
        if self._collapsible and huge_page_bytes() is not None:
            self._collapsible = False
            self._collapse = threading.Thread(target=collapse, args=(self._weights,), daemon=True, name="cuvil-weights")

    def _call(self) -> None:
        """One native run, the caller first off the workers' CPUs; a watched session times it
        (:mod:`.worker_watch`). Under the lock. After it, the weights' move a compile asked for starts
        (:meth:`collapse_weights_later`): the first result neither waits for it nor shares a core with it."""
        self._placement.step_aside()
        if self._watch is None:
            self._fn()
        else:
            began = self._clock()
            self._fn()
            ended = self._clock()
            self._watch.observe(ended - began, ended)
        if self._collapse is not None:
            self._collapse, mover = None, self._collapse
            mover.start()

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Copy ``inputs`` into the arena, run the whole graph natively, return output copies. A bool input
        is taken as NumPy reads it: any nonzero byte is True."""
        with self._lock:
            self._take_inputs(inputs)
            if self._fault is not None:
                self._fault.value = 0  # a fault of an earlier raw run (stale arena inputs) is not this run's
            self._call()
            if self._fault is not None and self._fault.value:
                self._fault.value = 0
                raise RunTimeCheckError()
            out = {name: view.copy() for name, view in self._outputs}
            for spec, span in self._bounded:  # a length known only now: the valid rows (TensorType.bounded)
                out[spec.name] = spec.take(span)
            return out

    def _take_inputs(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Copy ``inputs`` into their arena bytes (the caller holds the lock)."""
        try:
            for name, view, shape, dtype in self._inputs:
                value = inputs[name]
                if getattr(value, "dtype", None) is dtype and value.shape == shape:
                    if dtype is _BOOL:  # each byte 0 or 1, as native code reads it
                        clean_bools(value, out=view)
                    else:
                        view[...] = value  # the fast path: exact type, plain copy into the arena
                else:
                    self._convert_into(name, view, value)
        except KeyError as e:
            raise InterpreterError(f"missing input {e.args[0]!r}; the model takes {list(self.input_names)}") from None

    def run_each(self, examples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Run the graph once per example (the leading axis of ``examples``, each of the one input's
        size), without a dict or a lock per example: the first output of each, stacked, and which
        examples ran without a run-time check fault (a faulted example's row is zeros)."""
        if len(self._inputs) != 1:
            raise InterpreterError(f"run_each needs a model of one input; this one takes {list(self.input_names)}")
        if self._bounded:
            raise InterpreterError("run_each stacks outputs of one shape; this model's length depends on the data")
        name, view, shape, dtype = self._inputs[0]
        try:
            xs = np.asarray(examples).reshape(len(examples), *shape)
            _check_fits(name, xs, dtype)
            xs = clean_bools(xs.astype(dtype, casting="same_kind", copy=False))
        except (ValueError, TypeError) as e:
            raise InterpreterError(f"input {name!r}: examples of {np.shape(examples)[1:]} do not fit {shape}: {e}"[:300]) \
                from None
        _, result = self._outputs[0]
        out, ran = np.zeros((len(xs), *result.shape), result.dtype), np.ones(len(xs), bool)
        fn, fault = self._fn, self._fault
        with self._lock:
            self._placement.step_aside()
            if fault is not None:
                fault.value = 0  # as in ``run``: an earlier raw run's fault is not the first example's
            for i, x in enumerate(xs):
                view[...] = x
                fn()
                if fault is not None and fault.value:
                    fault.value = 0
                    ran[i] = False
                else:
                    out[i] = result
        return out, ran

    @staticmethod
    def _convert_into(name: str, view: np.ndarray, value) -> None:
        value = np.asarray(value)
        if value.shape != view.shape:
            raise InterpreterError(f"input {name!r} has shape {value.shape}, the compiled model wants {view.shape}")
        _check_fits(name, value, view.dtype)
        try:
            np.copyto(view, value, casting="same_kind")
        except TypeError as e:
            raise InterpreterError(f"input {name!r}: {e}") from None

    def profile(self, runs: int = 20, inputs: Mapping[str, np.ndarray] | None = None) -> dict[str, float]:
        """Share of cycles per node over ``runs`` runs (a model lowered with ``profile=True``); ``inputs``
        as for :meth:`node_cycles`."""
        total = np.zeros(len(self.lowered.profile_nodes), np.float64)
        for counters in self._counted_runs(runs, inputs):
            total += counters
        return {name: float(c) / (float(total.sum()) or 1.0) for name, c in zip(self.lowered.profile_nodes, total)}

    def node_cycles(self, runs: int = 20, inputs: Mapping[str, np.ndarray] | None = None) -> dict[str, int]:
        """Each node's fewest cycles over ``runs`` runs (a model lowered with ``profile=True``): on a
        busy machine other work only ever adds cycles, so the least is the node's own cost. ``inputs``
        are copied in before each run; without them the first nodes read what later tensors left in
        the inputs' bytes (an int8 model's QuantizeLinear divided stray denormal floats: 5x its time)."""
        best = np.full(len(self.lowered.profile_nodes), np.iinfo(np.uint64).max, dtype=np.uint64)
        for counters in self._counted_runs(runs, inputs):
            np.minimum(best, counters, out=best)
        return {name: int(c) for name, c in zip(self.lowered.profile_nodes, best)}

    def _counted_runs(self, runs: int, inputs: Mapping[str, np.ndarray] | None) -> Iterator[np.ndarray]:
        """Each run's per-node cycle counters (a view of the arena: read it before the next)."""
        lw = self.lowered
        if lw.profile_offset is None:
            raise ValueError("this session was not lowered with profile=True")
        counters = self._arena[lw.profile_offset:lw.profile_offset + 8 * len(lw.profile_nodes)].view(np.uint64)
        with self._lock:
            for _ in range(runs):
                if inputs is not None:
                    self._take_inputs(inputs)
                counters[:] = 0
                self._fn()
                yield counters

    def run_raw(self) -> None:
        """One native call on whatever the arena holds (benchmarks: no copies at all). The inputs'
        bytes may have been reused by later tensors since the last ``run``: a model whose run-time
        checks read them (Gather's indices) may fault here, which the next ``run`` does not report."""
        with self._lock:
            self._call()


def _check_fits(name: str, value: np.ndarray, dtype: np.dtype) -> None:
    """Integers given for an integer input of a narrower type must fit it: NumPy's same-kind casting wraps
    them (an int64 index 2**32 + 1 for an i32 Gather selected row 1 where a typed index raised
    RunTimeCheckError); a safe cast, or any other kind, needs no look at the values."""
    if value.dtype.kind not in "iu" or np.dtype(dtype).kind not in "iu" or np.can_cast(value.dtype, dtype, "safe") \
            or not value.size:
        return
    info, lo, hi = np.iinfo(dtype), value.min(), value.max()
    if lo < info.min or hi > info.max:
        raise InterpreterError(f"input {name!r}: values from {lo} to {hi} do not fit its type {np.dtype(dtype).name}")
