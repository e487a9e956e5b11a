"""split_groups: an int8 conv of several channels a group becomes one QConv a group (Split, the QConvs, Concat).

Each group's conv then takes the packed im2col GEMM that a group-1 QConv has, where the grouped kernel
(``quant_grouped.py``) adds one int16 plane into int32 planes channel by channel, tap by tap, its time
growing with the channels a group. RegNetY-style models (Zen 4, int8 / ONNX Runtime int8, 1 thread): 16-48
channels a group 1.33 -> 0.47x (the grouped convs 34-104 us against ORT's 14-44, then 0.5-3.6 us a group);
8 channels a group 0.62 -> 0.30x and, at stride 2, 0.86 -> 0.38x; 4 channels 0.28 -> 0.18x; 2 channels
0.13x either way. At 2 threads the 16-48-channel one 1.58 -> 0.51x (a group's conv is too small to split
over the workers; the grouped kernel's split by groups gained nothing). Depthwise convs (one channel a
group) keep their own kernels. Exact: each output is the same sum, requantized by its own channel's
multiplier.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from .rewrite import Names, as_constant, replace_each

MIN_GROUP_CHANNELS = 2
"""A QConv of at least this many input channels a group is split (with constant weights and bias)."""


def _split(graph: Graph, node: Node, names: Names, consts: dict) -> list[Node] | None:
    a, ins = node.attr, node.inputs
    g = a["group"]
    if g == 1 or ins[1] not in consts or (len(ins) > 2 and ins[2] not in consts):
        return None
    w = np.asarray(consts[ins[1]])
    m, cg = w.shape[:2]
    if cg < MIN_GROUP_CHANNELS:
        return None
    mg, scales = m // g, a["w_scale"]
    bias = np.asarray(consts[ins[2]]) if len(ins) > 2 else None
    parts = [names.fresh(f"{ins[0]}_group{i}") for i in range(g)]
    nodes = [Node.make("Split", [ins[0]], parts, name=names.fresh(f"{node.name}/split"), axis=1, split=[cg] * g)]
    outs = []
    for i, part in enumerate(parts):
        lo, hi = i * mg, (i + 1) * mg
        wn = names.fresh(f"{ins[1]}_group{i}")
        consts[wn] = as_constant(w[lo:hi], w.dtype)
        group_ins = [part, wn]
        if bias is not None:
            bn = names.fresh(f"{ins[2]}_group{i}")
            consts[bn] = as_constant(bias[lo:hi], bias.dtype)
            group_ins.append(bn)
        outs.append(names.fresh(f"{node.outputs[0]}_group{i}"))
        attrs = {**a, "group": 1, "w_scale": scales[lo:hi] if len(scales) == m else scales}
        nodes.append(Node.make("QConv", group_ins, [outs[-1]], name=names.fresh(f"{node.name}/group{i}"), **attrs))
    nodes.append(Node.make("Concat", outs, [node.outputs[0]], name=names.fresh(f"{node.name}/concat"), axis=1))
    return nodes


def split_groups(graph: Graph) -> Graph:
    return replace_each(graph, "QConv", _split)
