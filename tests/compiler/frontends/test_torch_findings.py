"""The PyTorch frontend where differential fuzzing against torch eager found it wrong or refusing valid
models: each case against the module's own eager output (exactly, where torch's rounding is the point).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.nn import functional as F  # noqa: E402

from cuvil.compiler.errors import UnsupportedModelError  # noqa: E402
from cuvil.compiler.frontends.torch import import_torch  # noqa: E402

from .test_torch_frontend import Fn, check, r  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]  # a masked row's Softmax

H = torch.tensor([65504.0, 1000.0, 3.0, 1.0, -1.0, 0.0999755859375], dtype=torch.float16)
U8 = torch.tensor([0, 1, 100, 200, 255], dtype=torch.uint8)
I8 = torch.tensor([0, 1, 100, -100, 127], dtype=torch.int8)
I32 = torch.tensor([0, 1, -100, 2**31 - 1], dtype=torch.int32)
INTS = torch.tensor([[-7, -3, 0, 2, 5, 9]])
EXACT = dict(rtol=0, atol=0)

# name -> (forward, inputs, tolerances)
CASES = {
    # f16 times or over a scalar: torch keeps the scalar in f32 and rounds once (65535 is not inf, 1e-8 not 0)
    "f16_div_scalar": (lambda m, x: x / 65535.0, (H,), EXACT),
    "f16_mul_scalar_chain": (lambda m, x: (x * 1e-5) * 1e5 + x * 1e-8 * 1e4, (H,), EXACT),
    "f16_mul_0d_tensor": (lambda m, x: x * m.small * m.big, (H,), EXACT),
    "f16_mul_one_ulp": (lambda m, x: x * 0.1, (torch.arange(1000).half(),), EXACT),
    "f16_sub_scalar_rounds_to_f16": (lambda m, x: x - (1.0 + 2**-11 + 1e-6), (H,), EXACT),
    # addmm with beta=0 ignores the input, NaN and inf included
    "addmm_beta_0": (lambda m, c, a, b: torch.addmm(c, a, b, beta=0.0, alpha=2.0),
                     (torch.tensor([[float("nan"), float("inf")], [1.0, 2.0]]), r(2, 3), r(3, 2, seed=1)), {}),
    "addmm_beta_0_broadcast_input": (lambda m, c, a, b: torch.addmm(c, a, b, beta=0),
                                     (torch.tensor([float("nan"), 1.0]), r(2, 3), r(3, 2, seed=1)), {}),
    # a fully masked attention row is 0, as eager's _safe_softmax makes it
    "sdpa_fully_masked_row": (lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=m.bm)
                              + F.scaled_dot_product_attention(q, k, v, attn_mask=m.fm),
                              (r(1, 2, 3, 4), r(1, 2, 3, 4, seed=1), r(1, 2, 3, 4, seed=2)), {}),
    # an out-of-range int scalar wraps into the tensor's dtype, comparisons too
    "int_scalar_wraps": (lambda m, u, i, j: ((u + 300).int() + (u + (-1)) + (u > -1) + (u == 256)).sum()
                         + (i * 200).sum() + (j < 2**40).sum(), (U8, I8, I32), EXACT),
    # a dim of a 0-d tensor
    "zero_d_dims": (lambda m, x: x.sum(0) + x.sum(-1) + x.mean(0, keepdim=True) + x.amax(0)
                    + torch.index_select(x, 0, m.idx) + F.softmax(x, -1) + F.log_softmax(x, 0),
                    (torch.tensor(2.0),), {}),
    # integers under true division and rsqrt become floats first
    "int_true_division": (lambda m, a, b: a / 2 + a / b + (a > 0).sum(-1) / a.shape[-1]
                          + (a.abs().to(torch.uint8) / b.abs().to(torch.uint8)),
                          (INTS, torch.tensor([[2, -2, 3, -3, 2, 4]])), {}),
    "int_rsqrt": (lambda m, a: torch.rsqrt(a.abs() + 1), (INTS,), {}),
    # zero-size reshapes
    "reshape_zero_size": (lambda m, x: (x.reshape(0, 6) + 1, x.reshape(2, 3, 0) + 1, x.flatten(0, 1) * 2),
                          (torch.randn(2, 0, 3),), {}),
    # pools on unbatched input; a ceil_mode window larger than the input
    "pools_unbatched": (lambda m, x, y: (F.max_pool2d(x, 2), F.avg_pool2d(x, 2), F.adaptive_avg_pool2d(x, 1),
                                         F.adaptive_avg_pool2d(x, (1, 3)), F.max_pool1d(y, 2),
                                         F.max_pool2d(x, 2, return_indices=True)[0]),
                        (r(2, 5, 6), r(2, 7, seed=1)), {}),
    "pools_ceil_window_past_input": (lambda m, x: (F.max_pool2d(x, (2, 3), (3, 2), ceil_mode=True),
                                                   F.avg_pool2d(x, 2, ceil_mode=True),
                                                   F.avg_pool2d(x, 3, ceil_mode=True, padding=1, count_include_pad=False),
                                                   F.max_pool2d(x, 2, (3, 2), dilation=(2, 1), ceil_mode=True)),
                                     (r(1, 2, 1, 6),), {}),
    # torch.cat skips a legacy 1-D empty operand
    "cat_legacy_empty": (lambda m, x: torch.cat([x, x[0, 0, :0], x], 1), (r(2, 3, 4),), {}),
}
PARAMS = {
    "f16_mul_0d_tensor": dict(small=torch.tensor(1e-8), big=torch.tensor(1e8)),
    "sdpa_fully_masked_row": dict(bm=torch.tensor([[True, True, True], [False, False, False], [True, False, False]]),
                                  fm=torch.tensor([[0.0, 0.5, 0.0], [-float("inf")] * 3, [0.0, -1.0, -float("inf")]])),
    "zero_d_dims": dict(idx=torch.tensor([0])),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager(name):
    fn, inputs, tol = CASES[name]
    check(Fn(fn, **PARAMS.get(name, {})), *inputs, **tol)


@pytest.mark.parametrize("fn", [lambda x: x[x > 0].sum(), lambda x: torch.nonzero(x > 0),
                                lambda x: torch.masked_select(x, x > 0), lambda x: x * x.sum().item(),
                                lambda x: x + (x > 0).sum().item()],
                         ids=["mask_index", "nonzero", "masked_select", "item_float", "item_int"])
def test_data_dependent_values_are_refused_by_name(fn):
    """A shape or a number known only at run time: one typed error naming the op that makes it."""
    with pytest.raises(UnsupportedModelError) as info:
        import_torch(Fn(lambda m, x: fn(x)), (r(3, 4),))
    (op,) = info.value.unsupported
    assert op.split(".")[1] in {"index", "nonzero", "masked_select", "_local_scalar_dense"}, str(info.value)


def test_f16_scalar_product_is_computed_in_f32():
    graph = import_torch(Fn(lambda m, x: x * 1e-8), (H,))
    assert [n.op for n in graph.nodes] == ["Cast", "Mul", "Cast"]
    assert np.float32(graph.constants[graph.nodes[1].inputs[1]]) == np.float32(1e-8)
