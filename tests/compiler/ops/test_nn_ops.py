"""nn ops against ONNX Runtime: Conv, pools, normalisation, softmax; plus shape-rule rejections."""


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil.compiler import DType, N, TensorType
from cuvil.compiler.errors import ShapeError
from cuvil.compiler.ir.infer import infer_op
from cuvil.compiler.ops import get_op

from .ort_check import assert_close, infer, randn, run_cuvil, run_ort

F32 = DType.F32


def geometry(nd, strides=None, pads=None, dilations=None):
    return {"strides": strides or [1] * nd, "pads": pads or [0] * (2 * nd), "dilations": dilations or [1] * nd}


# --- Conv ------------------------------------------------------------------------------------------
CONV_CASES = {
    "1d": ((2, 3, 11), (4, 3, 3), geometry(1), True),
    "1d_stride_dilation_asym_pads": ((1, 2, 13), (3, 2, 3), geometry(1, [2], [2, 0], [2]), False),
    "2d_plain": ((1, 3, 8, 8), (5, 3, 3, 3), geometry(2), True),
    "2d_same_pad": ((2, 4, 7, 9), (6, 4, 3, 3), geometry(2, pads=[1, 1, 1, 1]), False),
    "2d_asym_pads": ((1, 3, 7, 6), (4, 3, 3, 2), geometry(2, pads=[0, 2, 1, 0]), True),
    "2d_strides": ((1, 3, 9, 10), (4, 3, 3, 3), geometry(2, [2, 3], [1, 1, 1, 1]), True),
    "2d_dilation": ((1, 2, 10, 10), (3, 2, 3, 3), geometry(2, dilations=[2, 3], pads=[2, 3, 2, 3]), False),
    "2d_rect_kernel_1x1": ((2, 8, 5, 5), (16, 8, 1, 1), geometry(2), True),
    "2d_stem_7x7_s2": ((1, 3, 32, 32), (8, 3, 7, 7), geometry(2, [2, 2], [3, 3, 3, 3]), False),
    "2d_group2": ((1, 4, 6, 6), (6, 2, 3, 3), {**geometry(2, pads=[1, 1, 1, 1]), "group": 2}, True),
    "2d_depthwise": ((2, 6, 9, 9), (6, 1, 3, 3), {**geometry(2, [2, 2], [1, 1, 1, 1]), "group": 6}, True),
    "2d_depthwise_mult2": ((1, 3, 8, 8), (6, 1, 3, 3), {**geometry(2, pads=[0, 1, 1, 0]), "group": 3}, False),
    "3d": ((1, 2, 5, 6, 7), (3, 2, 2, 3, 3), geometry(3, [1, 2, 1], [0, 1, 1, 1, 0, 1]), True),
}


@pytest.mark.parametrize("case", CONV_CASES.values(), ids=CONV_CASES.keys())
def test_conv_matches_onnxruntime(rng, case):
    xs, ws, attrs, bias = case
    x, w = randn(rng, xs), randn(rng, ws)
    ins = [x, w] + ([randn(rng, (ws[0],))] if bias else [])
    assert_close(run_cuvil("Conv", ins, **attrs), run_ort("Conv", ins, attrs))


def test_conv_keeps_dtype_and_batch_symbol(rng):
    x, w = randn(rng, (1, 2, 5, 5), np.float64), randn(rng, (3, 2, 3, 3), np.float64)
    (y,) = run_cuvil("Conv", [x, w], **geometry(2))
    assert y.dtype == np.float64 and y.shape == (1, 3, 3, 3)
    (t,) = infer_op("Conv", [TensorType(F32, (N, 3, 32, 32)), TensorType(F32, (8, 3, 3, 3))],
                    get_op("Conv").normalize_attrs(geometry(2, [2, 2], [1, 1, 1, 1])))
    assert t == TensorType(F32, (N, 8, 16, 16))


CONV_ERRORS = {
    "channel_mismatch": ([(1, 3, 8, 8), (4, 2, 3, 3)], geometry(2)),
    "group_not_dividing": ([(1, 3, 8, 8), (4, 1, 3, 3)], {**geometry(2), "group": 2}),
    "filters_not_divisible": ([(1, 4, 8, 8), (3, 2, 3, 3)], {**geometry(2), "group": 2}),
    "bias_shape": ([(1, 3, 8, 8), (4, 3, 3, 3), (3,)], geometry(2)),
    "rank_mismatch": ([(1, 3, 8, 8), (4, 3, 3)], geometry(2)),
    "pads_length": ([(1, 3, 8, 8), (4, 3, 3, 3)], geometry(2, pads=[1, 1])),
    "strides_zero": ([(1, 3, 8, 8), (4, 3, 3, 3)], geometry(2, strides=[0, 1])),
    "kernel_too_big": ([(1, 3, 4, 4), (4, 3, 5, 5)], geometry(2)),
    "dilated_too_big": ([(1, 3, 4, 4), (4, 3, 3, 3)], geometry(2, dilations=[2, 2])),
    "rank2": ([(3, 8), (4, 3)], {"strides": [], "pads": [], "dilations": []}),
}


@pytest.mark.parametrize("case", CONV_ERRORS.values(), ids=CONV_ERRORS.keys())
def test_conv_rejects_bad_operands(case):
    shapes, attrs = case
    with pytest.raises(ShapeError):
        infer("Conv", shapes, **attrs)


def test_conv_rejects_ints_and_mixed_dtypes():
    with pytest.raises(ShapeError):
        infer("Conv", [(1, 1, 3, 3), (1, 1, 1, 1)], dtype=DType.I32, **geometry(2))
    with pytest.raises(ShapeError):
        infer_op("Conv", [TensorType(F32, (1, 1, 3, 3)), TensorType(DType.F64, (1, 1, 1, 1))],
                 get_op("Conv").normalize_attrs(geometry(2)))


def test_conv_channel_mismatch_through_run_cuvil(rng):
    with pytest.raises(ShapeError, match="input channels"):
        run_cuvil("Conv", [randn(rng, (1, 3, 5, 5)), randn(rng, (2, 4, 3, 3))], **geometry(2))


# --- pools -----------------------------------------------------------------------------------------
def pool(k, strides=None, pads=None, dilations=None, **extra):
    nd = len(k)
    attrs = {"kernel_shape": k, "strides": strides or [1] * nd, "pads": pads or [0] * (2 * nd), **extra}
    if dilations is not None:
        attrs["dilations"] = dilations
    return attrs


MAXPOOL_CASES = {
    "1d": ((2, 3, 10), pool([3], [2], dilations=[1])),
    "2d_2x2_s2": ((1, 4, 8, 8), pool([2, 2], [2, 2], dilations=[1, 1])),
    "2d_3x3_s2_pad1": ((2, 3, 9, 9), pool([3, 3], [2, 2], [1, 1, 1, 1], [1, 1])),
    "2d_asym_pads": ((1, 2, 7, 6), pool([3, 2], [1, 2], [2, 0, 0, 1], [1, 1])),
    "2d_dilation": ((1, 2, 11, 11), pool([3, 3], [1, 2], [1, 2, 1, 0], [2, 3])),
    "2d_ceil": ((1, 3, 7, 8), pool([2, 3], [2, 2], dilations=[1, 1], ceil_mode=1)),
    "2d_ceil_pads_drop_last": ((1, 1, 5, 5), pool([2, 2], [2, 2], [1, 1, 1, 1], [1, 1], ceil_mode=1)),
    "2d_ceil_dilation": ((1, 2, 10, 9), pool([2, 3], [3, 2], [1, 0, 1, 2], [2, 1], ceil_mode=1)),
    "3d": ((1, 2, 5, 6, 7), pool([2, 2, 3], [2, 1, 2], [0, 1, 1, 1, 0, 1], [1, 1, 1])),
}


@pytest.mark.parametrize("case", MAXPOOL_CASES.values(), ids=MAXPOOL_CASES.keys())
def test_maxpool_matches_onnxruntime(rng, case):
    shape, attrs = case
    x = randn(rng, shape)
    assert_close(run_cuvil("MaxPool", [x], **attrs), run_ort("MaxPool", [x], attrs))


def test_maxpool_padding_never_wins(rng):
    x = -1 - np.abs(randn(rng, (1, 2, 5, 5)))
    attrs = pool([3, 3], [2, 2], [1, 1, 2, 2], [1, 1], ceil_mode=1)
    (y,) = run_cuvil("MaxPool", [x], **attrs)
    assert (y < 0).all()
    assert_close([y], run_ort("MaxPool", [x], attrs))


def test_maxpool_window_of_only_padding_is_minus_inf():
    """Dilation can make a window miss the input entirely; like PyTorch (and ReduceMax over nothing)
    its maximum is -inf, where ONNX Runtime reports the lowest finite float."""
    x = np.ones((1, 1, 1), dtype=np.float32)
    (y,) = run_cuvil("MaxPool", [x], **pool([2], [1], [1, 1], [2]))
    np.testing.assert_array_equal(y, [[[-np.inf]]])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_maxpool_small_ints(rng, dtype):
    x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, (1, 2, 6, 6)).astype(dtype)
    attrs = pool([3, 3], [2, 2], [1, 1, 1, 1], [1, 1])
    (y,) = run_cuvil("MaxPool", [x], **attrs)
    np.testing.assert_array_equal(y, run_ort("MaxPool", [x], attrs)[0])


AVGPOOL_CASES = {
    "1d": ((2, 3, 10), pool([3], [2])),
    "2d_2x2_s2": ((1, 4, 8, 8), pool([2, 2], [2, 2])),
    "2d_pads_exclude": ((1, 3, 7, 7), pool([3, 3], [2, 2], [1, 1, 1, 1])),
    "2d_pads_include": ((1, 3, 7, 7), pool([3, 3], [2, 2], [1, 1, 1, 1], count_include_pad=1)),
    "2d_asym_pads_include": ((1, 2, 6, 7), pool([3, 2], [1, 2], [2, 0, 0, 1], count_include_pad=1)),
    "2d_asym_pads_exclude": ((1, 2, 6, 7), pool([3, 2], [1, 2], [2, 0, 0, 1])),
    "2d_ceil_exclude": ((1, 3, 7, 8), pool([2, 3], [2, 2], ceil_mode=1)),
    "2d_ceil_include": ((1, 3, 7, 8), pool([2, 3], [2, 2], ceil_mode=1, count_include_pad=1)),
    "2d_ceil_pads_include": ((1, 2, 9, 5), pool([3, 2], [2, 2], [1, 0, 1, 1], ceil_mode=1, count_include_pad=1)),
    "2d_ceil_pads_drop_last": ((1, 1, 5, 5), pool([2, 2], [2, 2], [1, 1, 1, 1], ceil_mode=1, count_include_pad=1)),
    "3d_include": ((1, 2, 5, 6, 7), pool([2, 2, 3], [2, 1, 2], [0, 1, 1, 1, 0, 1], count_include_pad=1)),
}


@pytest.mark.parametrize("case", AVGPOOL_CASES.values(), ids=AVGPOOL_CASES.keys())
def test_averagepool_matches_onnxruntime(rng, case):
    shape, attrs = case
    x = randn(rng, shape)
    assert_close(run_cuvil("AveragePool", [x], **attrs), run_ort("AveragePool", [x], attrs))


POOL_ERRORS = {
    "pads_not_below_kernel": ("MaxPool", (1, 1, 6, 6), pool([2, 2], [1, 1], [2, 0, 0, 0], [1, 1])),
    "kernel_too_big": ("MaxPool", (1, 1, 3, 3), pool([4, 4], [1, 1], dilations=[1, 1])),
    "kernel_rank": ("AveragePool", (1, 1, 6, 6), pool([2], [1])),
    "rank2": ("AveragePool", (1, 6), pool([2], [1])),
    "ceil_mode_2": ("AveragePool", (1, 1, 6, 6), pool([2, 2], ceil_mode=2)),
    "count_include_pad_2": ("AveragePool", (1, 1, 6, 6), pool([2, 2], count_include_pad=2)),
}


@pytest.mark.parametrize("case", POOL_ERRORS.values(), ids=POOL_ERRORS.keys())
def test_pools_reject_bad_operands(case):
    op, shape, attrs = case
    with pytest.raises(ShapeError):
        infer(op, [shape], **attrs)


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 6, 7), (2, 2, 3, 4, 5)])
def test_global_average_pool(rng, shape):
    x = randn(rng, shape)
    assert_close(run_cuvil("GlobalAveragePool", [x]), run_ort("GlobalAveragePool", [x]))


@st.composite
def window_cases(draw, pool_op=None):
    """A random geometry (1-D or 2-D) that ONNX Runtime accepts, with a window that fits."""
    nd = draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 4)) for _ in range(nd)]
    dil = [draw(st.integers(1, 3)) for _ in range(nd)] if pool_op != "AveragePool" else [1] * nd
    # pools: pads below the kernel; conv: any small pad
    pads = [draw(st.integers(0, (kernel[i % nd] - 1) if pool_op else 3)) for i in range(2 * nd)]
    spatial = [draw(st.integers(max(1, (k - 1) * d + 1 - pads[i] - pads[nd + i]), 12))
               for i, (k, d) in enumerate(zip(kernel, dil))]
    attrs = {"strides": [draw(st.integers(1, 3)) for _ in range(nd)], "pads": pads}
    if pool_op:
        attrs.update(kernel_shape=kernel, ceil_mode=draw(st.integers(0, 1)))
        if pool_op == "MaxPool":
            attrs["dilations"] = dil
        else:
            attrs["count_include_pad"] = draw(st.integers(0, 1))
        return (draw(st.integers(1, 2)), draw(st.integers(1, 3)), *spatial), None, attrs
    group = draw(st.sampled_from([1, 2, 3]))
    cin, mult = group * draw(st.integers(1, 2)), draw(st.integers(1, 2))
    attrs.update(dilations=dil, group=group)
    return (draw(st.integers(1, 2)), cin, *spatial), (group * mult, cin // group, *kernel), attrs


@settings(max_examples=40, deadline=None)
@given(window_cases(), st.booleans(), st.integers(0, 2**32 - 1))
def test_conv_random_geometry_matches_onnxruntime(case, bias, seed):
    xs, ws, attrs = case
    rng = np.random.default_rng(seed)
    ins = [randn(rng, xs), randn(rng, ws)] + ([randn(rng, (ws[0],))] if bias else [])
    assert_close(run_cuvil("Conv", ins, **attrs), run_ort("Conv", ins, attrs))


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_pools_random_geometry_match_onnxruntime(op, data):
    xs, _, attrs = data.draw(window_cases(op))
    x = randn(np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))), xs)
    (want,) = run_ort(op, [x], attrs)
    # A dilated window may see only padding: Cuvil (as PyTorch) gives -inf, ONNX Runtime its lowest float.
    want[want == np.finfo(np.float32).min] = -np.inf
    assert_close(run_cuvil(op, [x], **attrs), [want])


# --- normalisation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(2, 3), (2, 4, 5), (1, 3, 4, 5)])
def test_batch_normalization(rng, shape):
    c = shape[1]
    x, scale, bias, mean = randn(rng, shape), randn(rng, (c,)), randn(rng, (c,)), randn(rng, (c,))
    var = rng.uniform(0.5, 2.0, c).astype(np.float32)
    assert_close(run_cuvil("BatchNormalization", [x, scale, bias, mean, var], epsilon=1e-3),
                 run_ort("BatchNormalization", [x, scale, bias, mean, var], {"epsilon": 1e-3}))


def test_batch_normalization_rejects_wrong_channel_count():
    with pytest.raises(ShapeError):
        infer("BatchNormalization", [(1, 3, 4, 4), (3,), (3,), (4,), (3,)])


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn(rng, size):
    x = randn(rng, (2, 7, 4, 5))
    attrs = {"size": size, "alpha": 1e-2, "beta": 0.6, "bias": 2.0}
    assert_close(run_cuvil("LRN", [x], **attrs), run_ort("LRN", [x], attrs))


@pytest.mark.parametrize("size", [2, 4])
def test_lrn_even_size_follows_the_onnx_formula(rng, size):
    """ONNX Runtime only takes odd sizes (and onnx.reference loops over the wrong axis), so even
    sizes are checked against the spec's formula, channel by channel: the window is uneven."""
    x = randn(rng, (2, 6, 3, 3))
    attrs = {"size": size, "alpha": 0.5, "beta": 0.75, "bias": 1.0}
    x64, want = x.astype(np.float64), np.empty(x.shape)
    for c in range(x.shape[1]):
        lo, hi = max(0, c - (size - 1) // 2), min(x.shape[1] - 1, c + size // 2)
        square_sum = (x64[:, lo:hi + 1] ** 2).sum(axis=1)
        want[:, c] = x64[:, c] / (1.0 + 0.5 / size * square_sum) ** 0.75
    assert_close(run_cuvil("LRN", [x], **attrs), [want.astype(np.float32)])


@pytest.mark.parametrize("shape,axis", [((2, 3, 8), -1), ((2, 3, 8), -2), ((4, 6), 1), ((2, 3, 4, 5), 1), ((5, 4), 0)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_normalization(rng, shape, axis, with_bias):
    normed = shape[axis:]
    ins = [randn(rng, shape), randn(rng, normed)] + ([randn(rng, normed)] if with_bias else [])
    attrs = {"axis": axis, "epsilon": 1e-4}
    assert_close(run_cuvil("LayerNormalization", ins, **attrs), run_ort("LayerNormalization", ins, attrs))


def test_layer_normalization_broadcasts_scale(rng):
    x, scale, bias = randn(rng, (2, 3, 4)), randn(rng, (4,)), randn(rng, (1, 4))
    full = [np.broadcast_to(v, (3, 4)).copy() for v in (scale, bias)]
    assert_close(run_cuvil("LayerNormalization", [x, scale, bias], axis=-2),
                 run_cuvil("LayerNormalization", [x, *full], axis=-2))


@pytest.mark.parametrize("shapes,axis", [([(2, 3, 4), (3,)], -1), ([(2, 3, 4), (5, 4)], -2), ([(2, 3), (3,)], 2)])
def test_layer_normalization_rejects_bad_operands(shapes, axis):
    with pytest.raises(ShapeError):
        infer("LayerNormalization", shapes, axis=axis)


# --- softmax ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape,axis", [((7,), 0), ((3, 5), -1), ((3, 5), 0), ((2, 3, 4), 1), ((2, 3, 4), -3)])
def test_softmax(rng, op, shape, axis):
    x = randn(rng, shape) * 4
    assert_close(run_cuvil(op, [x], axis=axis), run_ort(op, [x], {"axis": axis}, opset=13))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_is_stable_for_large_inputs(op):
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1e4, -999.0]], dtype=np.float32)
    (y,) = run_cuvil(op, [x])
    assert np.isfinite(y).all()
    assert_close([y], run_ort(op, [x], {"axis": -1}, opset=13))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_rejects_bad_axis_and_ints(op):
    with pytest.raises(ShapeError):
        infer(op, [(2, 3)], axis=2)
    with pytest.raises(ShapeError):
        infer(op, [(2, 3)], dtype=DType.I32)


# --- whole networks: exact against torch per layer, and fast ---------------------------------------
def _layer_calls(model, x):
    """(module, input, output) of every Conv2d and BatchNorm2d, copied before in-place ReLUs run."""
    import torch
    from torch import nn

    calls = []

    def hook(m, inp, out):
        calls.append((m, inp[0].detach().numpy().copy(), out.detach().numpy().copy()))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return calls


def _as_cuvil(m, x):
    from torch import nn

    def arr(t):
        return t.detach().numpy()

    if isinstance(m, nn.Conv2d):
        attrs = {"strides": m.stride, "pads": m.padding * 2, "dilations": m.dilation, "group": m.groups}
        return "Conv", [x, arr(m.weight)] + ([arr(m.bias)] if m.bias is not None else []), attrs
    stats = [arr(v) for v in (m.weight, m.bias, m.running_mean, m.running_var)]
    return "BatchNormalization", [x, *stats], {"epsilon": m.eps}


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_zoo_conv_and_batchnorm_layers_match_torch(name):
    pytest.importorskip("torch")
    from tests.zoo import ZOO

    model, (x,) = ZOO[name]()
    for module, inp, expected in _layer_calls(model, x):
        op, ins, attrs = _as_cuvil(module, inp)
        opdef = get_op(op)
        (y,) = opdef.reference(ins, opdef.normalize_attrs(attrs))
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4, err_msg=f"{name}: {module}")
