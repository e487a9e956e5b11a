"""Lowering for the CPU: Graph + Target + batch -> one LLVM module with one entry point, packed weights, a plan.

The shared driver (``driver.prepare``) checks limits, optimizes, binds, verifies and plans;
``cpu/lowering.py`` builds the module. Everything here is pure Python (``llvmlite.ir``); native
compilation is the edge runtime's.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from llvmlite import ir

from ..ir.graph import Graph
from ..memory.scratch import check_scratch
from ..target import Target
from .cpu.jobs import held_until
from .cpu.kernels import KERNELS
from .cpu.lowering import CpuLowering
from .cpu.threads import check_threads
from .driver import hand_over_constants, prepare
from .irtext import module_text
from .lowered import LoweredModel


def entry_name(graph: Graph, batch: int) -> str:
    return f"cuvil_{re.sub(r'[^A-Za-z0-9_]', '_', graph.name) or 'model'}_b{batch}"


def lower(graph: Graph, target: Target, batch: int = 1, optimize: bool = True, emit: bool = True,
          profile: bool = False, retarget: Callable[[Graph, Target], Target] | None = None,
          stream: Callable[[ir.Module], None] | None = None) -> LoweredModel:
    """Lower ``graph`` for ``target`` at a fixed ``batch`` size (compile once per batch size).

    ``emit=False`` skips the kernel bodies and the IR text (``llvm_ir`` is empty), for callers
    that want only weights, plan and sizes (a disk cache hit needs no lowering at all).
    ``profile=True`` adds a cycle counter per node after the scratch region (``Session.profile``).
    ``retarget(graph, target)`` sees the optimized, batch-bound graph and returns the Target to
    lower it for (an on-device tuner fixes conv choices there).
    ``stream(module)`` is called after each node and once at the end, so a caller may compile the
    kernels finished so far while the rest is lowered; ``llvm_ir`` is then empty (the caller saw it all).
    It may also print the entry point's instructions so far and take them out of its block
    (``irtext.take_instructions``): the entry is only ever appended to.
    """
    check_threads(target)
    with cycle_collection(on=False):
        prep, consts = hand_over_constants(
            prepare(graph, target, batch, optimize=optimize, kernels=KERNELS, backend="native", retarget=retarget,
                    held=held_until))
        name = entry_name(graph, batch)
        del graph  # a graph handed over optimized already (a cold compile's) must not keep the weights alive
        low = CpuLowering(prep, emit, profile, stream, consts)
        del consts  # the lowering's now: it lets each array go after its last node
        low.run(name)
        if stream is not None:
            stream(low.module)
        check_scratch(prep.graph, prep.plan, low.scratch.spans, _arena_end(low), low.reserved)
        g = prep.graph
        return LoweredModel(
            llvm_ir=module_text(low.module) if emit and stream is None else "", entry=name, weights=low.weights.array(), plan=prep.plan,
            arena_bytes=_arena_end(low), inputs=prep.io(g.inputs), outputs=prep.io(g.outputs),
            kernel_count=len(low.kernels), target=prep.target, batch=batch, node_count=len(g.nodes),
            profile_offset=low.profile_offset, profile_nodes=tuple(low.profiled), fault_offset=low.fault_offset,
            scratch_spans=tuple(low.scratch.spans), split_nodes=low.split_nodes,
        )


@contextmanager
def cycle_collection(on: bool) -> Iterator[None]:
    """The cyclic collector on or off for a while, as it was after. Off while lowering: its ~10^5
    llvmlite objects all stay reachable until the text is printed, and the collector's passes over
    them find nothing and cost 25-30% of lowering (ResNet-50). On while tuning inside it: each
    candidate's module is cyclic garbage once printed (``edge_runtime/autotune.py``)."""
    was = gc.isenabled()
    if on:
        gc.enable()
    else:
        gc.disable()
    try:
        yield
    finally:
        if was != on:
            (gc.enable if was else gc.disable)()


def _arena_end(low: CpuLowering) -> int:
    if low.profile_offset is not None:
        return low.profile_offset + 8 * len(low.profiled)
    return low.tensors_end
