"""share_constants: constants of the same dtype, shape and bytes become one.

Why: exporters repeat a weight per use. torch's export of an LSTM over 49 frames transposes each
recurrent matrix once per step, so LSTM KWS's graph held 48 copies of each: 6.2 of its 6.4 MB of
weights, in the bundle pushed to every device, in the packed weights and in the cold compile's
peak. A constant is read-only, so one copy serves every reader. Only constants of one shape and
dtype are compared, their first bytes before all of them, so unlike weights cost next to nothing.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from ..ir.graph import Graph
from .rewrite import rebuild

PROBE = 64  # bytes compared first: different weights almost always differ there


def share_constants(graph: Graph, keep: Collection[str] = ()) -> Graph:
    """``keep``: names that stay, each its own constant (a frontend's parameters, which training and
    delta bundles find by name); a constant of another name may still become one of them."""
    kept: dict[tuple, list[tuple[str, np.ndarray]]] = {}
    alias: dict[str, str] = {}
    fixed = set(graph.outputs) | set(keep)  # never replaced by a twin
    for name, value in graph.constants.items():
        raw = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
        same_kind = kept.setdefault((value.dtype.str, value.shape), [])
        twin = None if name in fixed else next(
            (k for k, b in same_kind if np.array_equal(b[:PROBE], raw[:PROBE]) and np.array_equal(b, raw)), None)
        if twin is None:
            same_kind.append((name, raw))
        else:
            alias[name] = twin
    if not alias:
        return graph
    nodes = [n.replace(inputs=tuple(alias.get(i, i) for i in n.inputs)) if alias.keys() & set(n.inputs) else n
             for n in graph.nodes]
    return rebuild(graph, nodes, {k: v for k, v in graph.constants.items() if k not in alias})
