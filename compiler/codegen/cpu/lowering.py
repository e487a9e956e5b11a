"""The CPU backend's module builder: one internal kernel per node (``kernels``), called from one entry.

The entry ``void <entry>(i8* noalias arena, i8* noalias weights)`` calls one internal kernel per
node with pointers at constant offsets (``<entry>_bind`` / ``<entry>_bound`` are the same call with
the pointers stored once, for the runtime's hot path); identical kernels (same :class:`KernelKey`)
are emitted once; layers a splitter cuts into parts run as one job of the worker pool (a depthwise
conv after a split layer, in the same channel ranges, joins its job: one handoff for both). Everything
before the first kernel is the shared driver's (``driver.prepare``).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from ...digest import short_hex
from ...ir.graph import Node
from ...memory.scratch import ScratchPlacer
from ...ops import get_op
from ...target import Target
from .. import irhelpers as h
from ..driver import Prepared, WeightBlock, placement
from .kernels import KERNELS, KernelContext, KernelDef, KernelKey
from .kernels.parts import Part, slice_constant
from .jobs import joining_parts, own_jobs, pack_key
from .kernels.split import ELEMENTWISE, ROWWISE
from .workers import Pool


@dataclass(frozen=True)
class Layer:
    """A split layer in a job: its node, kernel, parts, in-place inputs and output's arena offset."""

    node: Node
    kd: KernelDef
    parts: list[Part]
    alias: tuple
    out_at: int


class CpuLowering:
    """One LLVM module for a prepared graph: an entry that calls one kernel per node (see ``lower.py``)."""

    def __init__(self, prep: Prepared, emit: bool = True, profile: bool = False,
                 stream: Callable[[ir.Module], None] | None = None, consts: dict[str, np.ndarray] | None = None):
        """``consts``: the constants' arrays when the caller handed them over (``driver.hand_over_constants``):
        each is dropped after the last node that reads it; else the graph's own."""
        self.prep, self.emit, self.profile, self.stream = prep, emit, profile, stream
        self.consts = dict(prep.graph.constants) if consts is None else consts
        self.g, self.target, self.plan = prep.graph, prep.target, prep.plan
        graph, target, plan = self.g, self.target, self.plan
        self.profiled: list[str] = []
        self.pending: list = []
        self.profile_offset: int | None = None
        self.module = ir.Module(name=re.sub(r"\W", "_", graph.name) or "model")
        self.module.triple = target.triple
        self.attrs = h.target_attrs(target)
        self.weights = WeightBlock()
        self.kernels: dict[KernelKey, ir.Function] = {}
        self.fault_offset = prep.fault_offset
        self.reserved = [] if self.fault_offset is None else [(self.fault_offset, self.fault_offset + h.ALIGN)]
        self.scratch = ScratchPlacer(graph, plan, self.reserved)  # each kernel's scratch where no value lives then
        self.split_nodes = 0
        self.fused: set[str] = set()
        self.jobs: dict[str, list[Part]] = {}  # nodes that run as jobs of their own, with their parts (own_jobs)
        self.order: dict[str, int] = {}
        self.pool: Pool | None = None

    @property
    def tensors_end(self) -> int:
        """The arena's end before the profile counters: the plan's values, the fault word, the scratch."""
        return max([self.plan.arena_bytes, self.scratch.end] + [hi for _, hi in self.reserved])

    def new_function(self, name: str, args: list[ir.Type], internal: bool, aligns: tuple[int, ...] = ()) -> ir.Function:
        fn = ir.Function(self.module, ir.FunctionType(h.VOID, args), name=name)
        if internal:
            fn.linkage = "internal"
        h.set_fn_attrs(fn, ["nounwind"] + (["noinline"] if internal else []), self.attrs)
        h.mark_pointer_args(fn, [True] * len(args), aligns=aligns)
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
        self.order = {node.name: i for i, node in enumerate(self.g.nodes)}
        self.jobs = self.own_jobs() if self.target.threads > 1 else {}
        nudged = self.ahead_of_jobs()
        last = {name: i for i, node in enumerate(self.g.nodes) for name in node.inputs if name in self.consts}
        done: dict[int, list[str]] = {}
        for name, i in last.items():
            done.setdefault(i, []).append(name)
        for i, node in enumerate(self.g.nodes):
            if node.name in nudged:
                b.call(self.pool.nudge, [])
            if node.name not in self.fused:  # else it ran in its producer's job
                self.lower_node(b, node, KERNELS[node.op], arena, weights)
                if self.stream is not None:  # its kernels are finished: the caller may compile them now
                    self.stream(self.module)
                    b.position_at_end(b.block)  # the caller may have taken the entry's instructions (see lower)
            for name in done.get(i, ()):  # packed by now (a fused node's in its producer's job, before it)
                del self.consts[name]
        if self.profile:
            base = -(-self.tensors_end // h.ALIGN) * h.ALIGN
            self.profile_offset = base
            counters = h.byte_ptr(b, arena, base, h.I64)
            for slot, t0, t1 in self.pending:
                cell = h.gep(b, counters, slot)
                b.store(b.add(b.load(cell), b.sub(t1, t0)), cell)
        b.ret_void()

    def own_jobs(self) -> dict[str, list[Part]]:
        """The nodes that run as jobs of their own, with their parts (:func:`.jobs.own_jobs`)."""
        return own_jobs(self.g, self.target, lambda node: placement(self.prep, node) is not None)

    def ahead_of_jobs(self) -> set[str]:
        """The nodes before which the caller nudges sleeping workers: the last node with code of its
        own before each job, so the workers wake while it runs and the job finds them spinning."""
        if self.target.threads < 2:
            return set()
        found, last = set(), None
        for node in self.g.nodes:
            if placement(self.prep, node) is None:
                continue
            if node.name in self.jobs:
                found |= {last} - {None}
                last = None
            else:
                last = node.name
        return found

    def lower_node(self, b: ir.IRBuilder, node: Node, kd: KernelDef, arena: ir.Value, weights: ir.Value) -> None:
        g = self.g
        in_types = tuple(g.types[i] for i in node.inputs)
        out_types = tuple(g.types[o] for o in node.outputs)
        alias = placement(self.prep, node)
        if alias is None:
            return  # the planner made the view share its input's bytes: nothing to do
        scalars: list[tuple[int, float | int]] = []
        packed: list[str | None] = [None] * len(node.inputs)
        args: list[ir.Value | None] = []
        out_ranges = [self.prep.span(o) for o in node.outputs]
        parts = self.jobs.get(node.name)
        for i, name in enumerate(node.inputs):
            t = in_types[i]
            if name in g.constants and parts:
                args.append(None)  # each part packs its own slice
                continue
            if name in g.constants:
                arr = self.consts[name]
                if kd.scalars and arr.size == 1:
                    v = arr.reshape(-1)[0]
                    scalars.append((i, float(v) if t.dtype.is_float else int(v)))
                    args.append(None)
                    continue
                layout = None
                if kd.pack is not None:
                    got = kd.pack(pack_key(self.g, node), i, arr, self.target)
                    if got is not None:
                        layout, arr = got
                packed[i] = layout
                args.append(h.byte_ptr(b, weights, self.weights.add((name, layout), arr), h.LLTYPE[t.dtype]))
            elif alias[i] is not None:
                args.append(None)  # read through the output it shares
            else:
                args.append(h.byte_ptr(b, arena, self.prep.span(name)[0], h.LLTYPE[t.dtype]))
        if parts:
            first = Layer(node, kd, parts, alias, out_ranges[0][0])
            self.lower_parts(b, [first] + self.partners(node, parts), arena, weights)
            return
        key = kd.code_of(KernelKey(node.op, node.attrs, in_types, out_types, alias, tuple(scalars), tuple(packed)))
        fn = self.kernels.get(key) or self.emit_kernel(key, kd)
        outs = [h.byte_ptr(b, arena, lo, h.LLTYPE[t.dtype]) for (lo, _), t in zip(out_ranges, out_types)]
        extra = []
        if kd.scratch is not None:
            step = self.order[node.name] + 1
            at = self.scratch.place(node.name, step, step, kd.scratch(key, self.target))
            extra.append(h.byte_ptr(b, arena, at, h.I8))
        if get_op(node.op).run_time_check:
            extra.append(h.byte_ptr(b, arena, self.fault_offset, h.I32))
        if self.profile:
            t0 = h.cycle_counter(b)
        b.call(fn, outs + [a for a in args if a is not None] + extra)
        if self.profile:
            slot = len(self.profiled)
            self.profiled.append(node.name)
            self.pending.append((slot, t0, h.cycle_counter(b)))

    def partners(self, node: Node, parts: list[Part]) -> list[Layer]:
        """The nodes after ``node`` that run in its job, part by part after its parts (one handoff for
        all): each reads the one before it first and computes each range of axis 1 from that range alone
        (a depthwise conv, a pool, an elementwise op, a softmax or norm over later axes, attention's
        MatMul by heads), split into the same ranges. Its other operands are constants or tensors no
        layer of the job writes; its output overlaps no tensor of the job, except an elementwise or
        row-wise op's in place on its first operand (each part rewrites its own range)."""
        if any(p.axis != 1 for p in parts):
            return []
        tensors = [t for t in list(node.inputs) + list(node.outputs) if t not in self.g.constants]
        written = list(node.outputs)
        found, prev = [], node
        for nxt in self.g.nodes[self.order[node.name] + 1:]:
            layer = self.partner(prev, nxt, [p.rows for p in parts], tensors, written)
            if layer is None:
                break
            found.append(layer)
            tensors += [t for t in list(nxt.inputs) + list(nxt.outputs) if t not in self.g.constants]
            written += list(nxt.outputs)
            prev = nxt
        return found

    def partner(self, prev: Node, nxt: Node, rows: list[tuple[int, int]], tensors: list[str],
                written: list[str]) -> Layer | None:
        """``nxt`` as a layer of the job whose last layer is ``prev`` (see :meth:`partners`), or None: what the
        graph allows (:func:`.jobs.joining_parts`), where the plan put no operand on bytes the job writes."""
        theirs = joining_parts(self.g, self.target, prev, nxt, rows)
        if theirs is None:
            return None
        consts = self.g.constants
        alias = placement(self.prep, nxt)
        in_place = alias is not None and alias[0] is not None and (nxt.op in ELEMENTWISE or nxt.op in ROWWISE)
        if alias is None or any(a is not None for a in alias[1:]) or (alias[0] is not None and not in_place):
            return None
        if any(self.overlap(t, u) for t in nxt.inputs[1:] if t not in consts for u in written):
            return None  # another part may be writing it
        if not in_place and any(self.overlap(nxt.outputs[0], u) for u in tensors):
            return None
        self.fused.add(nxt.name)
        return Layer(nxt, KERNELS[nxt.op], theirs, alias, self.prep.span(nxt.outputs[0])[0])

    def overlap(self, a: str, b: str) -> bool:
        (lo, hi), (lo2, hi2) = self.prep.span(a), self.prep.span(b)
        return lo < hi2 and lo2 < hi

    def lower_parts(self, b: ir.IRBuilder, layers: list[Layer], arena: ir.Value, weights: ir.Value) -> None:
        """One job for the pool: part p runs part p of each layer in turn, each part with scratch of its own."""
        # external, named after the entry: the parallel native compiler keeps it with the entry points
        job = self.new_function(f"{self.entry_name}_j{self.split_nodes}", [h.I8P, h.I8P, h.I32], internal=False)
        self.split_nodes += len(layers)
        jb = ir.IRBuilder(job.append_basic_block("entry"))
        j_arena, j_weights, which = job.args
        done = job.append_basic_block("done")
        switch = jb.switch(which, done)
        count = len(layers[0].parts)
        blocks = []
        for p in range(count):
            blocks.append(job.append_basic_block(f"part{p}"))
            switch.add_case(ir.Constant(h.I32, p), blocks[-1])
        ready = [self.part_calls(jb, layer, blocks, j_arena, j_weights) for layer in layers]
        stride = max((-(-layer.kd.scratch(key, part.target) // h.ALIGN) * h.ALIGN
                      for layer, calls in zip(layers, ready) if layer.kd.scratch is not None
                      for key, _, part, _ in calls), default=0)  # one stride for all parts: the largest need
        steps = [self.order[layer.node.name] + 1 for layer in layers]
        base = self.scratch.place(layers[0].node.name, min(steps), max(steps), stride, count) if stride else 0
        for p, blk in enumerate(blocks):
            jb.position_at_end(blk)
            lo = base + p * stride
            for layer, calls in zip(layers, ready):
                key, args, part, at = calls[p]
                out_at = layer.out_at + part.out_offset
                aligns = tuple(map(_alignment, (out_at, *at)))
                cache = (key, part.target.conv_choices, aligns)
                fn = self.kernels.get(cache)
                if fn is None:
                    fn = self.emit_kernel(key, layer.kd, part.target, cache, aligns)
                    if self.stream is not None:  # each part's kernel printed and let go at once, not the job's all
                        self.stream(self.module)
                out = h.byte_ptr(jb, j_arena, out_at, h.LLTYPE[key.out_types[0].dtype])
                extra = [h.byte_ptr(jb, j_arena, lo, h.I8)] if layer.kd.scratch is not None else []
                if get_op(key.op).run_time_check:
                    extra.append(h.byte_ptr(jb, j_arena, self.fault_offset, h.I32))
                jb.call(fn, [out] + args + extra)
            jb.branch(done)
        jb.position_at_end(done)
        jb.ret_void()
        b.position_at_end(b.block)  # the stream may have taken the entry's instructions meanwhile (see run)
        t0 = h.cycle_counter(b) if self.profile else None
        b.call(self.pool.par, [job, arena, weights, ir.Constant(h.I32, count)])
        if self.profile:  # the job's cycles go to its first layer
            t1 = h.cycle_counter(b)
            for i, layer in enumerate(layers):
                self.pending.append((len(self.profiled), t0, t1 if i == 0 else t0))
                self.profiled.append(layer.node.name)

    def part_calls(self, jb: ir.IRBuilder, layer: Layer, blocks: list, j_arena: ir.Value,
                   j_weights: ir.Value) -> list[tuple[KernelKey, list[ir.Value], Part, list[int]]]:
        """Per part: its kernel key, its operands (addressed in its block), the part, and each operand's
        byte offset in its block (the alignment its kernel may assume)."""
        node, kd, alias = layer.node, layer.kd, layer.alias
        ready = []
        for blk, part in zip(blocks, layer.parts):
            jb.position_at_end(blk)
            key = dataclasses.replace(part.key, alias=alias)
            args, at, packed = [], [], list(key.packed)
            for i, name in enumerate(node.inputs):
                t = key.in_types[i]
                if name in self.g.constants:
                    layout, arr = None, slice_constant(self.consts[name], part, i)
                    got = kd.pack(part.key, i, arr, part.target) if kd.pack is not None else None
                    if got is not None:
                        layout, arr = got
                    packed[i] = layout
                    stored = f"{name}#{part.rows[0]}:{part.rows[1]}" if part.axes[i] is not None else name  # whole: once
                    at.append(self.weights.add((stored, layout), arr))
                    args.append(h.byte_ptr(jb, j_weights, at[-1], h.LLTYPE[t.dtype]))
                elif alias[i] is None:
                    at.append(self.prep.span(name)[0] + part.byte_offsets[i])
                    args.append(h.byte_ptr(jb, j_arena, at[-1], h.LLTYPE[t.dtype]))
            ready.append((kd.code_of(dataclasses.replace(key, packed=tuple(packed))), args, part, at))
        return ready

    def emit_kernel(self, key: KernelKey, kd: KernelDef, target: Target | None = None, cache=None,
                    aligns: tuple[int, ...] = ()) -> ir.Function:
        """``aligns``: the alignment of the outputs' and passed inputs' pointers where a part's offsets
        leave less than the arena's (default: every tensor starts on ``h.ALIGN``)."""
        out_tys = [h.LLTYPE[t.dtype].as_pointer() for t in key.out_types]
        passed = [i for i in range(len(key.in_types)) if key.alias[i] is None and i not in dict(key.scalars)]
        in_tys = [h.LLTYPE[key.in_types[i].dtype].as_pointer() for i in passed]
        checks = get_op(key.op).run_time_check
        extra = ([h.I8P] if kd.scratch is not None else []) + ([h.I32.as_pointer()] if checks else [])
        fn = self.new_function(kernel_name(self.module, key if cache is None else cache, key.op), out_tys + in_tys + extra,
                               internal=True, aligns=aligns)
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


def kernel_name(module: ir.Module, key, op: str) -> str:
    """``k<digest of key>_<op>``: named by what decides its code, not by its place among the kernels, so a
    plan built again (the split check's next plan) names a layer it does not change alike, prints the same
    text, and an object built from that text before serves again (``edge_runtime/stream.py``). A digest
    met already (keys alike by their repr only) takes a counter."""
    stem = f"k{short_hex(repr(key), 10)}"
    return next(f"{stem}{n}_{op}" for n in itertools.chain([""], itertools.count(1)) if f"{stem}{n}_{op}" not in module.globals)


def _alignment(offset: int) -> int:
    """The alignment a pointer at ``offset`` bytes into the arena or weights (both ``h.ALIGN``-aligned) has."""
    return min(h.ALIGN, offset & -offset) if offset else h.ALIGN
