"""fuse: fewer, bigger kernels, so intermediate tensors never leave the cache.

Two rewrites, both into op-table entries of ``ops/fused.py`` whose references reuse the originals:

* **Epilogues.** A Conv or Gemm absorbs what follows it while each intermediate has one reader and
  is not a graph output, in ResNet's order: a constant per-channel ``Add`` (the bias, merged with
  an existing constant bias), an ``Add`` of a value of exactly the result's type (the residual),
  then one activation (see ``fused.ACTIVATIONS``) -> ``FusedConv`` / ``FusedGemm``.
* **Elementwise chains.** A fusable op (the op table's ``fusable`` trait) whose result only another
  fusable op reads joins that op's group; each group of two or more becomes one ``FusedElementwise`` (existing fused
  programs are inlined, so the pass can run again).

A fused node takes the place of the group's last node: every input of the group is defined by then.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.types import TensorType
from ..ops import get_op
from ..ops.fused import Step, activation_of, format_program, parse_program
from .rewrite import Names, as_constant, rebuild, sole_user, users

FUSED_BASE = {"Conv": "FusedConv", "Gemm": "FusedGemm"}


# per-channel bias ---------------------------------------------------------------------------------
def _conv_bias(c: np.ndarray, y: TensorType) -> np.ndarray | None:
    """``c`` as a [M] bias if adding it to Conv's (N, M, ...) result adds one value per channel."""
    if c.ndim > y.rank:
        return None
    shape = (1,) * (y.rank - c.ndim) + c.shape
    m = y.shape[1]
    if shape[0] != 1 or any(d != 1 for d in shape[2:]) or shape[1] not in (1, m):
        return None
    return np.broadcast_to(c.reshape(-1), (m,)).astype(np.float64)


def _gemm_bias(c: np.ndarray, y: TensorType) -> np.ndarray | None:
    """``c`` itself if it broadcasts to Gemm's (M, N) result without growing it (a valid Gemm C)."""
    if c.ndim > 2:
        return None
    shape = (1,) * (2 - c.ndim) + c.shape
    return c.astype(np.float64) if all(d == 1 or d == yd for d, yd in zip(shape, y.shape)) else None


BIAS_OF = {"Conv": _conv_bias, "Gemm": _gemm_bias}


def _merge_bias(base: Node, bias: np.ndarray | None, extra: np.ndarray) -> tuple[np.ndarray, dict]:
    """The combined bias and the base attributes it implies (Gemm: beta folded into C)."""
    if base.op == "Gemm":
        return (extra if bias is None else base.attr["beta"] * bias + extra), {"beta": 1.0}
    return (extra if bias is None else bias + extra), {}


# epilogues ----------------------------------------------------------------------------------------
def _grow_epilogue(graph: Graph, base: Node, uses, consts, names: Names, claimed) -> tuple[list[Node], Node, dict] | None:
    """Members absorbed after ``base``, the fused node, and new constants; None if nothing fuses.

    ``claimed`` holds nodes already absorbed by an earlier base (a residual Add of two convs).
    """
    bias_name = base.inputs[2] if len(base.inputs) > 2 else None
    bias = consts[bias_name].astype(np.float64) if bias_name in consts else None
    attrs, new_consts = dict(base.attr), {}
    residual, act, stage = None, None, 0  # stage: 0 bias next, 1 residual next, 2 activation next
    members, y = [base], base.outputs[0]
    while stage < 3 and (nxt := sole_user(graph, y, uses)) is not None and nxt.name not in claimed:
        other = [i for i in nxt.inputs if i != y]
        is_add = nxt.op == "Add" and len(other) == 1
        extra = BIAS_OF[base.op](consts[other[0]], graph.types[y]) if is_add and other[0] in consts else None
        if stage == 0 and extra is not None and (bias_name is None or bias is not None):
            bias, changed = _merge_bias(base, bias, extra)
            attrs.update(changed)
            bias_name, stage = names.fresh(f"{base.name}.bias_fused"), 1
            new_consts = {bias_name: bias}
        elif stage <= 1 and is_add and graph.types[other[0]] == graph.types[y]:
            residual, stage = other[0], 2
        elif (found := activation_of(nxt.op, nxt.attr)) is not None:
            act, stage = found, 3
        else:
            break
        members.append(nxt)
        y = nxt.outputs[0]
    if len(members) == 1:
        return None
    dtype = graph.types[base.outputs[0]].dtype.numpy
    name, alpha, beta = act or ("none", 0.0, 0.0)
    fused = Node.make(
        FUSED_BASE[base.op], list(base.inputs[:2]) + [n for n in (bias_name, residual) if n is not None], [y],
        name=base.name, **attrs, has_bias=int(bias_name is not None), has_residual=int(residual is not None),
        activation=name, act_alpha=alpha, act_beta=beta)
    return members, fused, {k: as_constant(v, dtype) for k, v in new_consts.items()}


def _fuse_epilogues(graph: Graph) -> Graph:
    uses, names, consts = users(graph), Names(graph), dict(graph.constants)
    placed: dict[str, Node | None] = {}  # member name -> fused node at its place, or None: removed
    for node in graph.nodes:
        if node.op not in FUSED_BASE or node.name in placed:
            continue
        grown = _grow_epilogue(graph, node, uses, consts, names, placed)
        if grown is None:
            continue
        members, fused, new_consts = grown
        consts.update(new_consts)
        placed.update({m.name: None for m in members})
        placed[members[-1].name] = fused
    if not placed:
        return graph
    nodes = [placed.get(n.name, n) for n in graph.nodes]
    return rebuild(graph, [n for n in nodes if n is not None], consts)


# elementwise chains -------------------------------------------------------------------------------
def _fusable(node: Node) -> bool:
    """A step-able op, or a FusedElementwise whose program is inlined into the group."""
    return node.op == "FusedElementwise" or get_op(node.op).fusable


def _program(members: list[Node]) -> tuple[list[str], str]:
    """External inputs (first-use order) and the canonical program of a group, schedule order."""
    made = {o for m in members for o in m.outputs}
    ext = list(dict.fromkeys(i for m in members for i in m.inputs if i not in made))
    slot = {v: k for k, v in enumerate(ext)}
    steps: list[Step] = []
    for m in members:
        inner = parse_program(m.attr["program"]) if m.op == "FusedElementwise" else (Step(m.op, tuple(range(len(m.inputs))), m.attrs),)
        local = [slot[i] for i in m.inputs]
        for s in inner:
            steps.append(Step(s.op, tuple(local[a] for a in s.args), s.attrs))
            local.append(len(ext) + len(steps) - 1)
        slot[m.outputs[0]] = local[-1]
    return ext, format_program(steps)


def _fuse_elementwise(graph: Graph) -> Graph:
    uses = users(graph)
    root: dict[str, str] = {}  # node name -> name of the last node of its group
    for node in reversed(graph.nodes):
        if _fusable(node):
            user = sole_user(graph, node.outputs[0], uses)
            root[node.name] = root[user.name] if user is not None and _fusable(user) else node.name
    groups: dict[str, list[Node]] = {}
    for node in graph.nodes:
        if node.name in root:
            groups.setdefault(root[node.name], []).append(node)
    groups = {r: ms for r, ms in groups.items() if len(ms) > 1}
    if not groups:
        return graph
    nodes = []
    for node in graph.nodes:
        r = root.get(node.name)
        if r not in groups:
            nodes.append(node)
        elif r == node.name:
            ext, program = _program(groups[r])
            nodes.append(Node.make("FusedElementwise", ext, node.outputs, name=node.name, program=program))
    return rebuild(graph, nodes)


def fuse(graph: Graph) -> Graph:
    return _fuse_elementwise(_fuse_epilogues(graph))
