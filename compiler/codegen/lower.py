"""Lowering: Graph + Target + batch -> one LLVM module with one entry point, packed weights, a plan.

The entry ``void <entry>(i8* noalias arena, i8* noalias weights)`` calls one internal kernel per
node with pointers at constant offsets (``<entry>_bind`` / ``<entry>_bound`` are the same call with
the pointers stored once, for the runtime's hot path); identical kernels (same :class:`KernelKey`) are emitted
once. Everything here is pure Python (``llvmlite.ir``); native compilation is the edge runtime's.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from ..errors import CompileError
from ..ir.dtypes import DType
from ..ir.graph import Graph, Node
from ..ir.infer import bind_batch
from ..ir.limits import check_graph
from ..memory.plan import MemoryPlan
from ..memory.scratch import check_worker_scratch
from ..memory.planner import plan_memory
from ..ops import get_op
from ..passes.pipeline import optimize as optimize_graph
from ..target import Target
from . import irhelpers as h
from .cpu.kernels import KERNELS, KernelContext, KernelDef, KernelKey
from .cpu.kernels.split import SPLITTERS, Part, slice_constant
from .cpu.workers import Pool, check_threads

@dataclass(frozen=True)
class IOSpec:
    """Where a graph input or output lives in the arena."""

    name: str
    offset: int
    dtype: DType
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class LoweredModel:
    llvm_ir: str
    entry: str
    weights: bytes
    plan: MemoryPlan
    arena_bytes: int  # the plan's arena plus the kernels' shared scratch region
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    kernel_count: int
    target: Target
    batch: int
    node_count: int
    profile_offset: int | None = None  # arena offset of one u64 cycle counter per profiled node
    profile_nodes: tuple[str, ...] = ()
    fault_offset: int | None = None  # arena offset of the i32 a run-time check sets (OpDef.run_time_check)
    worker_scratch: tuple[tuple[str, int, int, int], ...] = ()  # (node, part, first byte, end) of split layers
    split_nodes: int = 0  # layers whose work is shared by the threads

    @property
    def threads(self) -> int:
        return self.target.threads


class WeightBlock:
    """One read-only block; every tensor starts at a 64-byte boundary, each (name, layout) once."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.offsets: dict[tuple[str, str | None], int] = {}

    def add(self, key: tuple[str, str | None], arr: np.ndarray) -> int:
        if key not in self.offsets:
            self.offsets[key] = self.size
            data = np.ascontiguousarray(arr).tobytes()
            pad = -len(data) % h.ALIGN
            self.parts.append(data + b"\0" * pad)
            self.size += len(data) + pad
        return self.offsets[key]

    def tobytes(self) -> bytes:
        return b"".join(self.parts)


class _Lowering:
    def __init__(self, graph: Graph, target: Target, plan: MemoryPlan, emit: bool = True, profile: bool = False):
        self.g, self.target, self.plan, self.emit, self.profile = graph, target, plan, emit, profile
        self.profiled: list[str] = []
        self.pending: list = []
        self.profile_offset: int | None = None
        self.module = ir.Module(name=re.sub(r"\W", "_", graph.name) or "model")
        self.module.triple = target.triple
        self.attrs = h.target_attrs(target)
        self.weights = WeightBlock()
        self.kernels: dict[KernelKey, ir.Function] = {}
        self.scratch_offset = -(-plan.arena_bytes // h.ALIGN) * h.ALIGN
        self.fault_offset: int | None = None
        if any(get_op(n.op).run_time_check for n in graph.nodes):
            self.fault_offset, self.scratch_offset = self.scratch_offset, self.scratch_offset + h.ALIGN
        self.scratch_bytes = 0
        self.worker_scratch: list[tuple[str, int, int, int]] = []
        self.split_nodes = 0
        self.pool: Pool | None = None

    def new_function(self, name: str, args: list[ir.Type], internal: bool) -> ir.Function:
        fn = ir.Function(self.module, ir.FunctionType(h.VOID, args), name=name)
        if internal:
            fn.linkage = "internal"
        h.set_fn_attrs(fn, ["nounwind"] + (["noinline"] if internal else []), self.attrs)
        h.mark_pointer_args(fn, [True] * len(args))
        return fn

    def bound_entry(self, entry: ir.Function) -> None:
        """``<entry>_bind(arena, weights)`` stores the pointers once; ``<entry>_bound()`` runs with
        them. A call without arguments is the cheapest crossing from Python (ctypes converts none)."""
        slots = []
        for suffix in ("arena", "weights"):
            gv = ir.GlobalVariable(self.module, h.I8P, f"{entry.name}_{suffix}")
            gv.linkage = "internal"
            gv.initializer = ir.Constant(h.I8P, None)
            slots.append(gv)
        bind = self.new_function(f"{entry.name}_bind", [h.I8P, h.I8P], internal=False)
        b = ir.IRBuilder(bind.append_basic_block("entry"))
        for gv, arg in zip(slots, bind.args):
            b.store(arg, gv)
        b.ret_void()
        bound = self.new_function(f"{entry.name}_bound", [], internal=False)
        b = ir.IRBuilder(bound.append_basic_block("entry"))
        b.call(entry, [b.load(gv) for gv in slots])
        b.ret_void()

    def run(self, entry_name: str) -> None:
        entry = self.new_function(entry_name, [h.I8P, h.I8P], internal=False)
        self.entry_name = entry_name
        self.bound_entry(entry)
        self.pool = Pool(self.module, entry_name, self.target, self.attrs)
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        arena, weights = entry.args
        missing: dict[str, list[str]] = {}
        for node in self.g.nodes:
            kd = KERNELS.get(node.op)
            if kd is None:
                missing.setdefault(node.op, []).append(node.name)
                continue
            self.lower_node(b, node, kd, arena, weights)
        if self.profile:
            base = self.scratch_offset + -(-self.scratch_bytes // h.ALIGN) * h.ALIGN
            self.profile_offset = base
            counters = h.byte_ptr(b, arena, base, h.I64)
            for slot, t0, t1 in self.pending:
                cell = h.gep(b, counters, slot)
                b.store(b.add(b.load(cell), b.sub(t1, t0)), cell)
        if missing:
            names = "; ".join(f"{op} ({', '.join(ns[:5])})" for op, ns in sorted(missing.items()))
            raise CompileError(f"no native kernel for {len(missing)} op(s): {names}")
        b.ret_void()

    def _range(self, name: str) -> tuple[int, int]:
        return self.plan.offsets[name], self.plan.offsets[name] + self.g.types[name].nbytes(self.plan.batch)

    def lower_node(self, b: ir.IRBuilder, node: Node, kd: KernelDef, arena: ir.Value, weights: ir.Value) -> None:
        g = self.g
        in_types = tuple(g.types[i] for i in node.inputs)
        out_types = tuple(g.types[o] for o in node.outputs)
        alias: list[int | None] = [None] * len(node.inputs)
        scalars: list[tuple[int, float | int]] = []
        packed: list[str | None] = [None] * len(node.inputs)
        args: list[ir.Value | None] = []
        out_ranges = [self._range(o) for o in node.outputs]
        splitter = SPLITTERS.get(node.op)
        parts = splitter(self.pack_key(node, in_types, out_types), self.target) if splitter else None
        for i, name in enumerate(node.inputs):
            t = in_types[i]
            if name in g.constants and parts:
                args.append(None)  # each part packs its own slice
                continue
            if name in g.constants:
                arr = g.constants[name]
                if kd.scalars and arr.size == 1:
                    v = arr.reshape(-1)[0]
                    scalars.append((i, float(v) if t.dtype.is_float else int(v)))
                    args.append(None)
                    continue
                layout = None
                if kd.pack is not None:
                    got = kd.pack(self.pack_key(node, in_types, out_types), i, arr, self.target)
                    if got is not None:
                        layout, arr = got
                packed[i] = layout
                args.append(h.byte_ptr(b, weights, self.weights.add((name, layout), arr), h.LLTYPE[t.dtype]))
                continue
            lo, hi = self._range(name)
            hit = [j for j, (olo, ohi) in enumerate(out_ranges) if lo < ohi and olo < hi]
            if hit:
                j = hit[0]
                same = lo == out_ranges[j][0] and hi == out_ranges[j][1]
                if get_op(node.op).view and same:
                    return  # the planner made the view share its input's bytes: nothing to do
                if not (same and len(hit) == 1 and get_op(node.op).shares(node.attr, i)):
                    raise CompileError(f"node {node.name!r} ({node.op}): input {name!r} overlaps output "
                                       f"{node.outputs[j]!r} in the memory plan, which the kernel cannot do in place")
                alias[i] = j
                args.append(None)
                continue
            args.append(h.byte_ptr(b, arena, lo, h.LLTYPE[t.dtype]))
        if parts:
            self.lower_parts(b, node, kd, parts, tuple(alias), out_ranges[0][0], arena, weights)
            return
        key = KernelKey(node.op, node.attrs, in_types, out_types, tuple(alias), tuple(scalars), tuple(packed))
        fn = self.kernels.get(key) or self.emit_kernel(key, kd)
        outs = [h.byte_ptr(b, arena, lo, h.LLTYPE[t.dtype]) for (lo, _), t in zip(out_ranges, out_types)]
        extra = []
        if kd.scratch is not None:
            self.scratch_bytes = max(self.scratch_bytes, kd.scratch(key, self.target))
            extra.append(h.byte_ptr(b, arena, self.scratch_offset, h.I8))
        if get_op(node.op).run_time_check:
            extra.append(h.byte_ptr(b, arena, self.fault_offset, h.I32))
        if self.profile:
            t0 = h.cycle_counter(b)
        b.call(fn, outs + [a for a in args if a is not None] + extra)
        if self.profile:
            slot = len(self.profiled)
            self.profiled.append(node.name)
            self.pending.append((slot, t0, h.cycle_counter(b)))

    def lower_parts(self, b: ir.IRBuilder, node: Node, kd: KernelDef, parts: list[Part], alias: tuple,
                    out_at: int, arena: ir.Value, weights: ir.Value) -> None:
        """One job for the pool: part p's kernel on its slices, each part with scratch of its own."""
        # external, named after the entry: the parallel native compiler keeps it with the entry points
        job = self.new_function(f"{self.entry_name}_j{self.split_nodes}", [h.I8P, h.I8P, h.I32], internal=False)
        self.split_nodes += 1
        jb = ir.IRBuilder(job.append_basic_block("entry"))
        j_arena, j_weights, which = job.args
        done = job.append_basic_block("done")
        switch = jb.switch(which, done)
        oc = self.g.types[node.outputs[0]].shape[1]
        ready = []
        for p, part in enumerate(parts):
            blk = job.append_basic_block(f"part{p}")
            switch.add_case(ir.Constant(h.I32, p), blk)
            jb.position_at_end(blk)
            key = dataclasses.replace(part.key, alias=alias)
            args, packed = [], list(key.packed)
            for i, name in enumerate(node.inputs):
                t = key.in_types[i]
                if name in self.g.constants:
                    layout, arr = None, slice_constant(self.g.constants[name], part, oc)
                    got = kd.pack(part.key, i, arr, part.target) if kd.pack is not None else None
                    if got is not None:
                        layout, arr = got
                    packed[i] = layout
                    at = self.weights.add((f"{name}#{part.rows[0]}:{part.rows[1]}", layout), arr)
                    args.append(h.byte_ptr(jb, j_weights, at, h.LLTYPE[t.dtype]))
                elif alias[i] is None:
                    args.append(h.byte_ptr(jb, j_arena, self._range(name)[0] + part.byte_offsets[i], h.LLTYPE[t.dtype]))
            ready.append((blk, dataclasses.replace(key, packed=tuple(packed)), args, part))
        stride = 0
        if kd.scratch is not None:  # one stride for all parts: the largest part's need
            stride = max(-(-kd.scratch(key, part.target) // h.ALIGN) * h.ALIGN for _, key, _, part in ready)
            self.scratch_bytes = max(self.scratch_bytes, stride * len(parts))
        for p, (blk, key, args, part) in enumerate(ready):
            jb.position_at_end(blk)
            choice = part.target.conv_choices
            fn = self.kernels.get((key, choice)) or self.emit_kernel(key, kd, part.target, cache=(key, choice))
            out = h.byte_ptr(jb, j_arena, out_at + part.out_offset, h.LLTYPE[key.out_types[0].dtype])
            extra = []
            if kd.scratch is not None:
                lo = self.scratch_offset + p * stride
                self.worker_scratch.append((node.name, p, lo, lo + stride))
                extra.append(h.byte_ptr(jb, j_arena, lo, h.I8))
            if get_op(key.op).run_time_check:
                extra.append(h.byte_ptr(jb, j_arena, self.fault_offset, h.I32))
            jb.call(fn, [out] + args + extra)
            jb.branch(done)
        jb.position_at_end(done)
        jb.ret_void()
        t0 = h.cycle_counter(b) if self.profile else None
        b.call(self.pool.par, [job, arena, weights, ir.Constant(h.I32, len(parts))])
        if self.profile:
            self.pending.append((len(self.profiled), t0, h.cycle_counter(b)))
            self.profiled.append(node.name)

    def pack_key(self, node: Node, in_types, out_types) -> KernelKey:
        """The key packers see: ``packed[i] == "const"`` marks every constant input."""
        consts = tuple("const" if n in self.g.constants else None for n in node.inputs)
        return KernelKey(node.op, node.attrs, in_types, out_types, (), (), consts)

    def emit_kernel(self, key: KernelKey, kd: KernelDef, target: Target | None = None, cache=None) -> ir.Function:
        out_tys = [h.LLTYPE[t.dtype].as_pointer() for t in key.out_types]
        passed = [i for i in range(len(key.in_types)) if key.alias[i] is None and i not in dict(key.scalars)]
        in_tys = [h.LLTYPE[key.in_types[i].dtype].as_pointer() for i in passed]
        checks = get_op(key.op).run_time_check
        extra = ([h.I8P] if kd.scratch is not None else []) + ([h.I32.as_pointer()] if checks else [])
        fn = self.new_function(f"k{len(self.kernels)}_{key.op}", out_tys + in_tys + extra, internal=True)
        self.kernels[key if cache is None else cache] = fn
        if not self.emit:
            return fn  # a declaration is enough when only weights, plan and sizes are wanted
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        outs = list(fn.args[: len(out_tys)])
        ins: list[ir.Value | None] = [None] * len(key.in_types)
        for i, arg in zip(passed, fn.args[len(out_tys):]):
            ins[i] = arg
        for i, j in enumerate(key.alias):
            if j is not None:
                want = h.LLTYPE[key.in_types[i].dtype].as_pointer()
                ins[i] = outs[j] if outs[j].type == want else b.bitcast(outs[j], want)
        rest = list(fn.args[len(out_tys) + len(in_tys):])
        scratch = rest.pop(0) if kd.scratch is not None else None
        fault = rest.pop(0) if checks else None
        kd.emit(KernelContext(b, target or self.target, key, ins, outs, scratch, fault))
        b.ret_void()
        return fn


def entry_name(graph: Graph, batch: int) -> str:
    return f"cuvil_{re.sub(r'[^A-Za-z0-9_]', '_', graph.name) or 'model'}_b{batch}"


def lower(graph: Graph, target: Target, batch: int = 1, optimize: bool = True, emit: bool = True,
          profile: bool = False, retarget: Callable[[Graph, Target], Target] | None = None) -> LoweredModel:
    """Lower ``graph`` for ``target`` at a fixed ``batch`` size (compile once per batch size).

    ``emit=False`` skips the kernel bodies and the IR text (``llvm_ir`` is empty), for callers
    that want only weights, plan and sizes (a disk cache hit needs no lowering at all).
    ``profile=True`` adds a cycle counter per node after the scratch region (``Session.profile``).
    ``retarget(graph, target)`` sees the optimized, batch-bound graph and returns the Target to
    lower it for (an on-device tuner fixes conv choices there).
    """
    check_graph(graph, batch)  # a LimitError before any work the graph asks for
    check_threads(target)
    with _no_cycle_collection():
        return _lower(graph, target, batch, optimize, emit, profile, retarget)


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Lowering allocates ~10^5 llvmlite objects that all stay reachable until the text is printed:
    the cyclic collector's passes over them find nothing and cost 25-30% of lowering (ResNet-50)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _lower(graph: Graph, target: Target, batch: int, optimize: bool, emit: bool, profile: bool,
           retarget: Callable[[Graph, Target], Target] | None) -> LoweredModel:
    g = bind_batch(optimize_graph(graph) if optimize else graph, batch)
    if retarget is not None:
        target = retarget(g, target)
    plan = plan_memory(g, batch, alignment=h.ALIGN)
    low = _Lowering(g, target, plan, emit, profile)
    name = entry_name(graph, batch)
    low.run(name)

    check_worker_scratch(low.worker_scratch, plan.arena_bytes, _arena_end(low))

    def spec(v: str) -> IOSpec:
        t = g.types[v]
        return IOSpec(v, plan.offsets[v], t.dtype, tuple(t.shape))  # type: ignore[arg-type]

    return LoweredModel(
        llvm_ir=str(low.module) if emit else "", entry=name, weights=low.weights.tobytes(), plan=plan,
        arena_bytes=_arena_end(low),
        inputs=tuple(spec(v) for v in g.inputs), outputs=tuple(spec(v) for v in g.outputs),
        kernel_count=len(low.kernels), target=target, batch=batch, node_count=len(g.nodes),
        profile_offset=low.profile_offset, profile_nodes=tuple(low.profiled), fault_offset=low.fault_offset,
        worker_scratch=tuple(low.worker_scratch), split_nodes=low.split_nodes,
    )


def _arena_end(low: _Lowering) -> int:
    if low.profile_offset is not None:
        return low.profile_offset + 8 * len(low.profiled)
    if low.scratch_bytes or low.fault_offset is not None:
        return low.scratch_offset + low.scratch_bytes
    return low.plan.arena_bytes
