import itertools

import numpy as np
import pytest

from cuvil.compiler import N, Node
from cuvil.compiler.passes import DEFAULT_PIPELINE, crop_taps, dce, optimize
from cuvil.compiler.passes.crop_taps import used_taps

from .graphs import assert_same, f32, graph, weights


def conv_graph(rng, x_shape, w_shape, bias: bool = True, **attrs):
    consts = {"w": weights(rng, *w_shape)}
    if bias:
        consts["b"] = weights(rng, w_shape[0])
    node = Node.make("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs)
    return graph({"x": f32(N, *x_shape)}, consts, [node], ["y"])


def cropped(g):
    out = dce(crop_taps(g))
    conv = out.nodes[0]
    return out, out.constants[conv.inputs[1]], conv.attr["pads"]


def test_used_taps_is_the_definition_in_closed_form():
    """Tap t is read if some output o reads position o*stride - pad + t*dilation inside the input: the
    pass solves that per tap (a 16,000-sample audio conv would otherwise loop 16,000 times per tap)."""
    for n, k, s, d, pb, out in itertools.product(range(1, 7), range(1, 5), range(1, 4), range(1, 4), range(5), range(1, 6)):
        used = [t for t in range(k) if any(0 <= o * s - pb + t * d < n for o in range(out))]
        assert used_taps(n, k, s, d, pb, out) == ((used[0], used[-1]) if used else None), (n, k, s, d, pb, out)


@pytest.mark.parametrize("group,bias", [(1, True), (1, False), (8, True)])
def test_3x3_on_one_pixel_keeps_the_centre_tap(rng, group, bias):
    """ResNet-18's last stage at 32x32 inputs: every tap but the centre reads padding."""
    g = conv_graph(rng, (8, 1, 1), (8 if group == 8 else 6, 8 // group, 3, 3), bias,
                   strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=group)
    out, w, pads = cropped(g)
    assert w.shape[2:] == (1, 1) and pads == (0, 0, 0, 0)
    np.testing.assert_array_equal(w, g.constants["w"][:, :, 1:2, 1:2])
    assert set(out.constants) == {"b", out.nodes[0].inputs[1]} if bias else {out.nodes[0].inputs[1]}
    assert_same(g, out, rng)


def test_stride_2_on_2x2_keeps_the_lower_right_taps(rng):
    """Output (0, 0) reads rows and columns -1, 0, 1: tap 0 reads padding only, the end pad is not needed."""
    g = conv_graph(rng, (4, 2, 2), (5, 4, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1], dilations=[1, 1])
    out, w, pads = cropped(g)
    assert w.shape == (5, 4, 2, 2) and pads == (0, 0, 0, 0)
    np.testing.assert_array_equal(w, g.constants["w"][:, :, 1:, 1:])
    assert out.types["y"] == g.types["y"]
    assert_same(g, out, rng)


def test_one_dimension_only(rng):
    """A 1-row image: the rows crop to the centre, the columns (every tap reads an input) stay."""
    g = conv_graph(rng, (3, 1, 6), (4, 3, 3, 3), strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1])
    out, w, pads = cropped(g)
    assert w.shape == (4, 3, 1, 3) and pads == (0, 1, 0, 1)
    assert_same(g, out, rng)


def test_pads_alone_are_left_as_they_are(rng):
    """A stride-2 conv whose end pad no window reaches keeps it: only dropped taps change a conv."""
    g = conv_graph(rng, (3, 8, 8), (4, 3, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1], dilations=[1, 1])
    assert crop_taps(g) is g


def test_nothing_to_crop_returns_the_graph(rng):
    g = conv_graph(rng, (3, 4, 4), (4, 3, 3, 3), strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1])
    assert crop_taps(g) is g


def test_a_dilation_past_the_pad_leaves_the_dimension_whole(rng):
    """Taps at -1, 2, 5 of a 5-wide input: only the middle one reads it, but cropping to it would need
    a pad of -2, so the dimension keeps its kernel."""
    g = conv_graph(rng, (2, 5, 5), (3, 2, 3, 3), strides=[1, 1], pads=[1, 1, 1, 1], dilations=[3, 3])
    assert crop_taps(g) is g


def test_a_crop_that_would_add_an_output_is_not_made(rng):
    """Taps at 0 and 3 of a 3-wide input with one end pad: dropping the last tap without its pad
    would let the window fit three times."""
    g = conv_graph(rng, (2, 3, 3), (3, 2, 2, 2), strides=[1, 1], pads=[0, 0, 1, 1], dilations=[3, 3])
    assert crop_taps(g) is g


def test_outputs_of_padding_alone_are_left_to_the_conv(rng):
    g = conv_graph(rng, (2, 1, 1), (3, 2, 1, 1), strides=[3, 3], pads=[2, 2, 2, 2], dilations=[1, 1])
    assert g.types["y"].shape[2:] == (2, 2)
    assert crop_taps(g) is g


def test_weights_computed_at_run_time_are_not_touched(rng):
    g = graph({"x": f32(N, 2, 1, 1), "w": f32(3, 2, 3, 3)}, {}, [
        Node.make("Conv", ["x", "w"], ["y"], strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1])], ["y"])
    assert crop_taps(g) is g


def test_an_imagenet_resnet18_on_32x32_images_reads_its_last_stage_from_a_ninth_of_the_weights():
    """The stem and three stride-2 stages leave 1x1 pixels: the last stage's 3x3 convs keep their centre
    tap, its stride-2 entry its lower-right 2x2; the zoo's CIFAR ResNet-18 (4x4 at the end) keeps all."""
    pytest.importorskip("torch")
    archs, zoo = pytest.importorskip("tests.archs"), pytest.importorskip("tests.zoo")
    frontend = pytest.importorskip("cuvil.compiler.frontends.torch")
    model, example = archs.ARCHS["resnet18_imagenet"](size=32)[:2]
    g = frontend.import_torch(model.eval(), example)
    out = optimize(g)
    kernels = sorted(tuple(out.constants[n.inputs[1]].shape[2:]) for n in out.nodes if n.op in ("Conv", "FusedConv")
                     and out.constants[n.inputs[1]].shape[0] == 512)
    assert kernels == [(1, 1), (1, 1), (1, 1), (1, 1), (2, 2)]  # three 3x3 -> 1x1, the 1x1 shortcut, 3x3/2 -> 2x2
    before = sum(c.size for c in optimize(g, tuple(p for p in DEFAULT_PIPELINE if p is not crop_taps)).constants.values())
    assert sum(c.size for c in out.constants.values()) < 0.45 * before
    assert_same(g, out, np.random.default_rng(0), tol=1e-4, trials=1)
    cifar, example = zoo.ZOO["resnet18"]()
    g = dce(optimize(frontend.import_torch(cifar.eval(), example), DEFAULT_PIPELINE[:DEFAULT_PIPELINE.index(crop_taps)]))
    assert crop_taps(g) is g
