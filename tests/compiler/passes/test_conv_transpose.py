import numpy as np
import pytest

from cuvil.compiler import N, Node
from cuvil.compiler.passes import conv_transpose

from .graphs import assert_same, f32, graph, ops, weights

CASES = [  # x shape, (C, M/group, *kernel), attrs, the rewrite's ops
    ((N, 6, 5, 4), (6, 3, 2, 2), dict(strides=[2, 2]), ["Conv", "Reshape", "Transpose", "Reshape"]),
    ((N, 4, 3, 5), (4, 2, 3, 2), dict(strides=[3, 2], pads=[1, 0, 2, 1], group=2),
     ["Conv", "Reshape", "Transpose", "Reshape", "Pad"]),
    ((N, 3, 7), (3, 2, 4), dict(strides=[4]), ["Conv", "Reshape", "Transpose", "Reshape"]),
    ((N, 4, 5, 6), (4, 3, 4, 4), dict(strides=[2, 2], pads=[1, 1, 1, 1]),  # CenterNet's: phases, no zeros
     ["Conv", "Reshape", "Transpose", "Reshape", "Pad"]),
    ((N, 4, 5, 6), (4, 2, 3, 3), dict(strides=[2, 3], pads=[1, 0, 0, 2], output_padding=[1, 2], group=2),
     ["Conv"] * 6 + ["Concat", "Reshape", "Transpose", "Reshape", "Pad"]),  # 3 over stride 2: a Conv a phase
    ((N, 3, 7), (3, 2, 5), dict(strides=[2], pads=[2, 1], output_padding=[1]),
     ["Conv"] * 2 + ["Concat", "Reshape", "Transpose", "Reshape", "Pad"]),
    ((N, 6, 5, 4), (6, 4, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),  # torch decoders':
     ["Conv"] * 4 + ["Concat", "Reshape", "Transpose", "Reshape"]),  # the cropped output's phases, no crop after
    ((N, 3, 5, 4), (3, 2, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]),  # odd output (9x7): the tails cropped
     ["Conv"] * 4 + ["Concat", "Reshape", "Transpose", "Reshape", "Pad"]),
    ((N, 3, 5), (3, 2, 3), dict(strides=[2], pads=[4, 0]),  # a pad past a phase's taps: one Conv, cropped
     ["Conv", "Reshape", "Transpose", "Reshape", "Pad"]),
    ((N, 3, 4, 5), (3, 2, 1, 3), dict(strides=[2, 2]),  # a kernel under its stride: a phase without taps
     ["Conv", "Reshape", "Transpose", "Reshape", "Pad"]),
    ((N, 4, 5, 6), (4, 2, 3, 2), dict(strides=[2, 3], pads=[1, 0, 0, 2], dilations=[1, 2], output_padding=[1, 2],
                                      group=2), ["Reshape", "Pad", "Reshape", "Conv"]),
    ((N, 3, 6, 5), (3, 2, 3, 3), dict(pads=[2, 0, 3, 1]), ["Pad", "Conv"]),
    ((N, 2, 9), (2, 3, 5), dict(strides=[1], dilations=[2], pads=[1, 3]), ["Conv"]),
]


def _convt(xs, ws, attrs, bias, rng):
    nd = len(xs) - 2
    a = dict(strides=[1] * nd, pads=[0] * 2 * nd, dilations=[1] * nd, output_padding=[0] * nd, group=1) | attrs
    consts = {"w": weights(rng, *ws)} | ({"b": weights(rng, ws[1] * a["group"])} if bias else {})
    return graph({"x": f32(*xs)}, consts, [Node.make("ConvTranspose", ["x", *consts], ["y"], **a)], ["y"])


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs, ws, attrs, want", CASES)
def test_conv_transpose_becomes_conv(rng, xs, ws, attrs, want, bias):
    g = _convt(xs, ws, attrs, bias, rng)
    out = conv_transpose(g)
    assert ops(out) == want and out.nodes[-1].outputs == ("y",)
    assert_same(g, out, rng)


def test_weights_from_an_input_and_3d_keep_the_gather(rng):
    g3 = _convt((N, 2, 3, 3, 3), (2, 2, 2, 2, 2), dict(strides=[2, 2, 2]), True, rng)
    assert conv_transpose(g3) is g3
    a = dict(strides=[2, 2], pads=[0] * 4, dilations=[1, 1], output_padding=[0, 0], group=1)
    gi = graph({"x": f32(N, 2, 3, 3), "w": f32(2, 2, 2, 2)}, {}, [Node.make("ConvTranspose", ["x", "w"], ["y"], **a)],
               ["y"])
    assert conv_transpose(gi) is gi


def test_an_empty_output_is_left_as_it_is(rng):
    """Strides [2, 1] and pads [1, 2, 2, 2] over a 2x7 input: an output of height 0. The Conv the rewrite
    made did not fit the cropped input, and compiling with the passes on failed (the reference and
    unoptimized code give the empty tensor)."""
    g = _convt((1, 3, 2, 7), (3, 2, 1, 2), dict(strides=[2, 1], pads=[1, 2, 2, 2]), False, rng)
    assert g.types["y"].shape == (1, 2, 0, 4)
    assert conv_transpose(g) is g
