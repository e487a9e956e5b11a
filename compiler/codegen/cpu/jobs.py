"""Which layers run as jobs of the worker pool and which layers after them join those jobs, from the graph
and the target alone.

The lowering asks this after the memory plan (``CpuLowering.own_jobs`` / ``partner``, which add what only
the plan knows: which views need no code, which tensors overlap). The memory planner asks it before, for
``held_until``: a layer joining a job must not write over any tensor of the job's earlier layers, whose
parts may still run on another core, so those tensors stay live until the job's last layer. Without that,
the planner gave a depthwise conv the bytes of the input of the pointwise conv before it, which died
there, and the depthwise conv ran alone (MobileNetV1 at 2 threads, 7 layers: 52k -> 118k cycles, half
their input read from the other core).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from ...ir.graph import Graph, Node
from ...ops import get_op
from ...target import Target
from .kernels import KernelKey
from .kernels.parts import Part
from .kernels.split import CHANNELWISE, CONVS, ELEMENTWISE, FOLLOWERS, ROWWISE, SPLITTERS


def pack_key(g: Graph, node: Node) -> KernelKey:
    """The key packers and splitters see: ``packed[i] == "const"`` marks every constant input."""
    consts = tuple("const" if n in g.constants else None for n in node.inputs)
    return KernelKey(node.op, node.attrs, tuple(g.types[i] for i in node.inputs),
                     tuple(g.types[o] for o in node.outputs), (), (), consts)


@functools.lru_cache(maxsize=1024)
def _split(key: KernelKey, target: Target, rows: tuple[tuple[int, int], ...] | None) -> tuple[Part, ...]:
    """The splitter's parts of a layer (none: empty), remembered: the planner asks (``held_until``) and then the
    lowering asks the same (ResNet-50's splitters: 10 ms a time)."""
    got = SPLITTERS[key.op](key, target) if rows is None else SPLITTERS[key.op](key, target, list(rows))
    return tuple(got or ())


def own_jobs(g: Graph, target: Target, has_code: Callable[[Node], bool]) -> dict[str, list[Part]]:
    """The nodes that run as jobs of their own, with the parts their splitter gives. A pool (a follower)
    splits on its own only while the workers still spin: right after another job, or after serial layers
    the cost model puts at no more than ``Tuning.follower_awake_us`` (:func:`serial_us`); after longer ones
    they may sleep, and waking one cost more than half a pool (Tiny-YOLO's first, 16x160x160 after its
    unsplit first conv: 0.62x its serial speed, where alone, workers awake, it ran 1.83x). Parts marked
    ``after_job_only`` (a conv split by pixel vectors, whose input a job must have spread over the cores)
    split only right after a job, a layer that joins it (:func:`joining_parts`) counted in it: MobileNetV2's
    projections after a depthwise conv too small to split alone, run in its expansion's job, ran whole.
    ``has_code``: whether a node runs code (a view the planner put on its input's bytes does not)."""
    found: dict[str, list[Part]] = {}
    since_job = math.inf  # the serial layers' cost-model us since the last job (none yet: the workers may sleep)
    tail, rows = None, None  # the job's last layer so far and its ranges of axis 1 (None: no job a layer may join)
    for node in g.nodes:
        if not has_code(node):
            continue
        awake = since_job <= target.tuning.follower_awake_us
        split = node.op in SPLITTERS and (awake or node.op not in FOLLOWERS)
        parts = list(_split(pack_key(g, node), target, None)) if split else None
        if parts and parts[0].after_job_only and since_job:
            parts = None
        if parts:
            found[node.name] = parts
            since_job, tail = 0.0, node
            rows = [p.rows for p in parts] if all(p.axis == 1 for p in parts) else None
        elif rows and joining_parts(g, target, tail, node, rows) is not None:
            tail = node  # runs in the job, part by part
        else:
            since_job, rows = since_job + serial_us(g, node, target), None
    return found


def serial_us(g: Graph, node: Node, target: Target) -> float:
    """The cost model's microseconds for ``node`` on one core, at the rates its splitter assumes (a conv's
    multiply-adds, the elements a pool, Resize or elementwise op reads or writes); inf for other ops, whose
    time it does not know."""
    rates = target.tuning
    out = math.prod(g.types[node.outputs[0]].shape)
    if node.op in CONVS:
        return out * math.prod(g.types[node.inputs[1]].shape[1:]) / rates.conv_macs_per_us
    if node.op in CHANNELWISE:
        return max(out, math.prod(g.types[node.inputs[0]].shape)) / rates.pool_elements_per_us
    if node.op in ELEMENTWISE or node.op in ROWWISE:
        return out / rates.elementwise_elements_per_us
    return math.inf


def job_layout(g: Graph, target: Target) -> dict[str, tuple[tuple[int, int], ...]]:
    """Each layer that runs as a job of its own, with its parts' ranges, from the graph and target alone: two
    targets with equal layouts split the model alike (the layers that join a job follow from its ranges)."""
    return {name: tuple(p.rows for p in parts) for name, parts in own_jobs(g, target, _runs_code).items()}


def _runs_code(node: Node) -> bool:
    """Whether a node runs code as far as the graph tells: a view may be placed on its input's bytes."""
    return not get_op(node.op).view


def joining_parts(g: Graph, target: Target, prev: Node, nxt: Node, rows: list[tuple[int, int]]) -> list[Part] | None:
    """``nxt``'s parts in ``rows`` when it may join the job whose last layer is ``prev``, as far as the graph
    tells: it reads ``prev``'s output first and computes each range of axis 1 from that range alone (a
    depthwise conv, a pool, an elementwise op, a softmax or norm over later axes, attention's MatMul by
    heads); its other operands are constants, or (elementwise, row-wise) tensors. Else None."""
    if nxt.op not in SPLITTERS or nxt.inputs[0] != prev.outputs[0] or len(nxt.outputs) != 1:
        return None
    x_t, out_t = g.types[nxt.inputs[0]], g.types[nxt.outputs[0]]
    in_lines = nxt.op in ELEMENTWISE or nxt.op in ROWWISE
    row_local = in_lines or (nxt.op == "MatMul" and nxt.inputs[1] not in g.constants)
    if not row_local and not all(i in g.constants for i in nxt.inputs[1:]):
        return None
    per_range = nxt.op in CHANNELWISE or nxt.attr.get("group", 1) == x_t.shape[1] or row_local
    if len(x_t.shape) < 2 or not per_range or out_t.shape[1] != x_t.shape[1]:
        return None
    return list(_split(pack_key(g, nxt), target, tuple(rows))) or None


def held_until(g: Graph, target: Target) -> dict[str, int]:
    """Value -> the planner's step (node index + 1) it must stay live until: every tensor of a job's layers
    but its last, until the last's step, so no joining layer's output is placed on one. A tensor a layer
    may take over in place (``OpDef.shares_value``) is left to the planner: its bytes may become that
    layer's output, which is held in turn or is the last layer's."""
    if target.threads < 2:
        return {}
    order = {node.name: i for i, node in enumerate(g.nodes)}
    held: dict[str, int] = {}
    for name, parts in own_jobs(g, target, _runs_code).items():
        if any(p.axis != 1 for p in parts):
            continue
        layers = [g.nodes[order[name]]]
        for nxt in g.nodes[order[name] + 1:]:
            if joining_parts(g, target, layers[-1], nxt, [p.rows for p in parts]) is None:
                break
            layers.append(nxt)
        last = order[layers[-1].name] + 1
        taken = {v for layer in layers for v in layer.inputs
                 if get_op(layer.op).shares_value(layer.attr, layer.inputs, v)}
        for layer in layers[:-1]:
            for v in (*layer.inputs, *layer.outputs):
                if v not in g.constants and v not in taken:
                    held[v] = max(held.get(v, 0), last)
    return held
