"""crop_taps: a Conv's kernel taps that read only padding, for every output position, are dropped.

Small inputs make such taps common: torchvision's ResNet-18 layout on 32x32 images reaches its
last stage at 1x1 pixels, where a 3x3 conv with one pixel of padding reads its centre tap only; the other eight
multiply zeros, yet their weights (8/9 of the stage's 9.4 MB per conv) are streamed from memory on
every inference. Cropping the kernel to the taps some output reads, and the pads to what the
cropped window still needs, leaves every output the same sum of the same non-zero products (a
dropped product is ``w * 0``). The output shape is unchanged; where a cropped dimension would need
a negative pad (dilations larger than the pad), that dimension is left whole.
"""

from __future__ import annotations

from ..errors import VerifyError
from ..ir.graph import Graph, Node
from .rewrite import Names, as_constant, rebuild


def used_taps(n: int, k: int, stride: int, dilation: int, pad_begin: int, out: int) -> tuple[int, int] | None:
    """First and last tap of a ``k``-tap window that some output position reads inside ``n``
    input positions; None when every tap reads padding only."""
    def read(t: int) -> bool:  # the first output whose read of tap t is not before the input, is inside it
        first = max(0, -(-(pad_begin - t * dilation) // stride))
        return first < out and first * stride - pad_begin + t * dilation < n

    used = [t for t in range(k) if read(t)]
    return (used[0], used[-1]) if used else None


def cropped_geometry(spatial, kernel, attrs, out) -> tuple[list[slice], list[int]] | None:
    """Per spatial dimension the taps to keep and the new pads (begin..., end...), or None when
    nothing is to crop (or an output reads padding only: then the conv is its bias, left as is)."""
    nd = len(kernel)
    strides, pads, dilations = attrs["strides"], attrs["pads"], attrs["dilations"]
    keep, begin, end = [slice(0, k) for k in kernel], list(pads[:nd]), list(pads[nd:])
    for i in range(nd):
        taps = used_taps(spatial[i], kernel[i], strides[i], dilations[i], pads[i], out[i])
        if taps is None:
            return None
        lo, hi = taps
        if (lo, hi) == (0, kernel[i] - 1):
            continue  # every tap is read: the pads stay as they are, even an end pad no window reaches
        b = pads[i] - lo * dilations[i]
        reach = (out[i] - 1) * strides[i] + (hi - lo) * dilations[i] + 1  # the cropped window's last read + 1
        e = max(0, reach - spatial[i] - b)
        if b >= 0 and (spatial[i] + b + e - reach) // strides[i] == 0:  # no negative pad, no extra output
            keep[i], begin[i], end[i] = slice(lo, hi + 1), b, e
    if all(s.start == 0 and s.stop == k for s, k in zip(keep, kernel)):
        return None
    return keep, begin + end


def crop_taps(graph: Graph) -> Graph:
    consts = dict(graph.constants)
    names = Names(graph)
    nodes: list[Node] = []
    changed = False
    for node in graph.nodes:
        w = consts.get(node.inputs[1]) if node.op == "Conv" else None
        x = graph.types[node.inputs[0]] if w is not None else None
        if w is None or not all(isinstance(d, int) for d in x.shape[2:]):
            nodes.append(node)
            continue
        out = graph.types[node.outputs[0]].shape[2:]
        crop = cropped_geometry(x.shape[2:], w.shape[2:], node.attr, out)
        if crop is None:
            nodes.append(node)
            continue
        keep, pads = crop
        name = names.fresh(f"{node.inputs[1]}.cropped")
        consts[name] = as_constant(w[(slice(None), slice(None), *keep)], w.dtype)
        nodes.append(node.replace(inputs=(node.inputs[0], name, *node.inputs[2:]), attrs={**node.attr, "pads": pads}))
        changed = True
    if not changed:
        return graph
    new = rebuild(graph, nodes, consts)
    if any(new.types[o] != graph.types[o] for n in nodes for o in n.outputs):
        raise VerifyError("crop_taps changed a conv's output type")  # a fault of the geometry above, not the input
    return new
