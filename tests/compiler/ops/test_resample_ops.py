"""ConvTranspose and Resize references against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler.errors import ShapeError

from .ort_check import Const, assert_close, infer, randn, run_cuvil, run_ort

CONVT = [  # (x shape, w shape, strides, pads, dilations, output_padding, group)
    ((1, 2, 5), (2, 3, 3), [2], [0, 0], [1], [0], 1),
    ((2, 4, 4, 5), (4, 2, 3, 3), [2, 1], [1, 0, 1, 1], [1, 2], [1, 0], 2),
    ((1, 3, 3, 3), (3, 2, 2, 2), [2, 2], [0, 0, 0, 0], [1, 1], [0, 0], 1),
    ((1, 2, 3, 4, 3), (2, 1, 2, 3, 2), [1, 2, 2], [0, 1, 0, 0, 0, 1], [1, 1, 2], [0, 1, 0], 1),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("case", CONVT, ids=str)
def test_conv_transpose_matches_onnxruntime(rng, case, bias):
    xs, ws, strides, pads, dil, extra, group = case
    x, w = randn(rng, xs), randn(rng, ws)
    b = [randn(rng, (ws[1] * group,))] if bias else []
    attrs = dict(strides=strides, pads=pads, dilations=dil, output_padding=extra, group=group)
    want = run_ort("ConvTranspose", [x, Const(w), *map(Const, b)], attrs)
    assert_close(run_cuvil("ConvTranspose", [x, w, *b], **attrs), want, rtol=1e-5, atol=1e-5)


def test_conv_transpose_rejects_mismatched_weights():
    with pytest.raises(ShapeError, match="W"):
        infer("ConvTranspose", [(1, 3, 4, 4), (2, 3, 3, 3)], strides=[1, 1], pads=[0] * 4, dilations=[1, 1],
              output_padding=[0, 0])


RESIZE = [  # onnx attrs, scales (None: sizes), sizes
    ({"mode": "nearest"}, [1, 1, 2, 3], None),
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, [1, 1, 0.6, 1.7], None),
    ({"mode": "linear"}, [1, 1, 2, 2], None),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None, [1, 2, 7, 3]),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None, [1, 2, 1, 9]),
    ({"mode": "cubic"}, [1, 1, 0.8, 1.6], None),
    ({"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}, [1, 1, 1.5, 2.5], None),
]


@pytest.mark.parametrize("case", RESIZE, ids=str)
def test_resize_matches_onnxruntime(rng, case):
    attrs, scales, sizes = case
    x = randn(rng, (1, 2, 5, 4))
    onnx_in = [x, Const(np.zeros(0, np.float32))]
    onnx_in += [Const(np.array(scales, np.float32))] if scales else [Const(np.zeros(0, np.float32)), Const(np.array(sizes, np.int64))]
    want = run_ort("Resize", onnx_in, attrs, opset=13)
    full_scales = scales or [s / n for s, n in zip(sizes, x.shape)]
    full_sizes = [int(np.floor(s * n)) for s, n in zip(scales, x.shape)] if scales else sizes
    assert_close(run_cuvil("Resize", [x], sizes=full_sizes, scales=full_scales, **attrs), want, rtol=1e-5, atol=1e-6)


def test_resize_nearest_gathers_integers_exactly():
    x = np.arange(12, dtype=np.int64).reshape(1, 1, 3, 4) * (1 << 40)
    got, = run_cuvil("Resize", [x], sizes=[-1, -1, 6, 8], scales=[1.0, 1.0, 2.0, 2.0])
    assert np.array_equal(got, np.repeat(np.repeat(x, 2, axis=2), 2, axis=3))


def test_resize_rejects_unknown_modes():
    with pytest.raises(ShapeError, match="mode"):
        infer("Resize", [(1, 1, 2, 2)], sizes=[-1, -1, 4, 4], scales=[1.0, 1.0, 2.0, 2.0], mode="bilinear")


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_matches_onnxruntime(rng, mode, padding_mode, align_corners):
    x, grid = randn(rng, (2, 3, 5, 4)), rng.uniform(-2.5, 2.5, (2, 6, 7, 2)).astype(np.float32)
    attrs = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    assert_close(run_cuvil("GridSample", [x, grid], **attrs), run_ort("GridSample", [x, grid], attrs, opset=20),
                 rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_volumetric_grid_sample_matches_onnxruntime(rng, mode):
    x, grid = randn(rng, (1, 2, 3, 4, 5)), rng.uniform(-1.3, 1.3, (1, 2, 3, 4, 3)).astype(np.float32)
    attrs = dict(mode=mode, padding_mode="border", align_corners=0)
    assert_close(run_cuvil("GridSample", [x, grid], **attrs), run_ort("GridSample", [x, grid], attrs, opset=20),
                 rtol=1e-4, atol=1e-5)


def test_grid_sample_refuses_a_grid_of_the_wrong_rank():
    with pytest.raises(ShapeError, match="GridSample"):
        infer("GridSample", [(1, 1, 4, 4), (1, 3, 3, 3)])
