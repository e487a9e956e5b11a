"""Small hand-built graphs that tests of different modules share."""

from __future__ import annotations

import numpy as np

from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.ir.types import TensorType


def mobilenet_block(residual: bool):
    """A MobileNet block: 1x1 expand, 3x3 depthwise, 1x1 project (16 -> 32 -> 32 -> 16 channels, 8x8),
    plus its input when ``residual`` (which keeps the input's bytes alive past the depthwise conv); and an
    input for it."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("block")
    x = b.input("x", TensorType.parse("f32[1,16,8,8]"))

    def conv(v, oc, c, k, group):
        w = b.constant(rng.standard_normal((oc, c // group, k, k)).astype(np.float32))
        return b.add1("Conv", [v, w], pads=(k // 2,) * 4, strides=(1, 1), dilations=(1, 1), group=group)
    y = conv(conv(conv(x, 32, 16, 1, 1), 32, 32, 3, 32), 16, 32, 1, 1)
    return b.build([b.add1("Add", [y, x]) if residual else y]), rng.standard_normal((1, 16, 8, 8))
