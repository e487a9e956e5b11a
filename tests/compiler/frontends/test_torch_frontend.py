"""The PyTorch frontend: each mapped op family against the module's own eager output.

Expected values always come from torch; Cuvil's reference interpreter must reproduce them.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from cuvil.compiler import print_graph, parse_graph, run_reference, verify  # noqa: E402
from cuvil.compiler.errors import UnsupportedModelError  # noqa: E402
from cuvil.compiler.frontends.torch import import_torch  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")  # torch.export's own


class Fn(nn.Module):
    """A module around a function, so every case is one line."""

    def __init__(self, fn, **params):
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            self.register_buffer(k, v) if not isinstance(v, nn.Module) else setattr(self, k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


def r(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def check(module: nn.Module, *inputs: torch.Tensor, uses: tuple[str, ...] = (), rtol=1e-4, atol=1e-5):
    module = module.eval()
    graph = import_torch(module, inputs)
    with torch.no_grad():
        expected = module(*inputs)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    got = run_reference(graph, {n: x.numpy() for n, x in zip(graph.inputs, inputs)})
    assert len(graph.outputs) == len(expected)
    for name, want in zip(graph.outputs, expected):
        want = want.numpy()
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, (name, got[name].dtype, want.dtype)
        np.testing.assert_allclose(got[name], want, rtol=rtol, atol=atol)
    ops = {n.op for n in graph.nodes}
    assert set(uses) <= ops, f"expected {uses} among {sorted(ops)}"
    return graph


X = r(2, 3, 8, 8)
V = r(3, 16)
CASES = {
    # activations
    "relu": (lambda m, x: F.relu(x), (X,), ("Relu",)),
    "sigmoid_tanh": (lambda m, x: torch.sigmoid(x) + torch.tanh(x), (X,), ("Sigmoid", "Tanh")),
    "gelu": (lambda m, x: F.gelu(x), (X,), ("Gelu",)),
    "gelu_tanh": (lambda m, x: F.gelu(x, approximate="tanh"), (X,), ("Gelu",)),
    "silu": (lambda m, x: F.silu(x), (X,), ("SiLU",)),
    "hardsigmoid": (lambda m, x: F.hardsigmoid(x * 4), (X,), ("HardSigmoid",)),
    "hardswish": (lambda m, x: F.hardswish(x * 4), (X,), ("HardSwish",)),
    "leaky_relu": (lambda m, x: F.leaky_relu(x, 0.2), (X,), ("LeakyRelu",)),
    "hardtanh_relu6": (lambda m, x: F.hardtanh(x, -0.5, 0.7) + F.relu6(x * 8), (X,), ("Clip",)),
    "erf": (lambda m, x: torch.erf(x), (X,), ("Erf",)),
    # arithmetic, scalars, alpha
    "add_sub_alpha": (lambda m, x, y: torch.add(x, y, alpha=2.5) - torch.sub(y, x, alpha=0.5) + 3,
                      (V, r(16, seed=1)), ()),
    "mul_div_scalar": (lambda m, x, y: x * 0.5 / (y.abs() + 1) + 2 / (x.abs() + 1), (V, r(3, 1, seed=1)), ("Div",)),
    "rsub": (lambda m, x: 1 - x, (V,), ("Sub",)),
    "pow": (lambda m, x, y: x.abs() ** 1.5 + torch.pow(x, 2) + torch.pow(x.abs() + 1, y), (V, r(16, seed=1)), ("Pow",)),
    "sqrt_rsqrt": (lambda m, x: torch.sqrt(x.abs()) + torch.rsqrt(x.abs() + 0.1), (V,), ("Sqrt", "Reciprocal")),
    "exp_log_neg": (lambda m, x: torch.exp(x) + torch.log(x.abs() + 0.1) - torch.neg(x), (V,), ("Exp", "Log", "Neg")),
    "reciprocal": (lambda m, x: torch.reciprocal(x.abs() + 0.5), (V,), ("Reciprocal",)),
    "max_min": (lambda m, x, y: torch.maximum(x, y) * torch.minimum(x, y), (V, r(3, 16, seed=1)), ("Max", "Min")),
    "clamp": (lambda m, x: x.clamp(-0.3, 0.4) + x.clamp(min=0.1) + x.clamp(max=0.2), (V,), ("Clip",)),
    "clamp_tensor": (lambda m, x, y: torch.clamp(x, min=y), (V, r(16, seed=1)), ("Max",)),
    "compare_where": (lambda m, x, y: (torch.where(x > y, x, y) + torch.where(x < 0, 1.0, x) + (x == y).float()
                                       + (x != 0).float() + (x <= y).float() + (x >= 0.5).float()),
                      (V, r(3, 16, seed=1)), ("Where", "Greater", "Less", "Equal", "Cast")),
    "masked_fill": (lambda m, x: x.masked_fill(x < 0, -2.0), (V,), ("Where",)),
    "cast": (lambda m, x: (x * 4).to(torch.int32).to(torch.float64), (V,), ("Cast",)),
    "weak_0d_promotion": (lambda m, x: x * torch.tensor(2.0, dtype=torch.float64) + m.s, (V,), ("Mul",)),
    "int_math": (lambda m, x: x * 3 - x.sum() + (x > 4), (torch.arange(12).reshape(3, 4),), ()),
    "creation": (lambda m, x: x + torch.ones(16) + torch.arange(16).float() * torch.full((3, 1), 0.5), (V,), ()),
    # linear algebra
    "linear_2d": (lambda m, x: m.fc(x), (V,), ("Gemm",)),
    "linear_3d": (lambda m, x: m.fc(x), (r(2, 5, 16),), ("MatMul",)),
    "addmm": (lambda m, x: torch.addmm(m.b, x, m.w, beta=0.5, alpha=2.0), (V,), ("Gemm",)),
    "mm_bmm_matmul": (lambda m, x, y: torch.mm(x[0], y[0]).sum() + torch.bmm(x, y) + torch.matmul(x, y[0]),
                      (r(2, 3, 4), r(2, 4, 3, seed=1)), ("MatMul",)),
    "sdpa": (lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v),
             (r(1, 2, 5, 8), r(1, 2, 6, 8, seed=1), r(1, 2, 6, 8, seed=2)), ("Softmax",)),
    "sdpa_causal_scale": (lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
                          (r(1, 2, 6, 8), r(1, 2, 6, 8, seed=1), r(1, 2, 6, 8, seed=2)), ("Where",)),
    "sdpa_masks": (lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=m.bm)
                   + F.scaled_dot_product_attention(q, k, v, attn_mask=m.fm),
                   (r(1, 2, 6, 8), r(1, 2, 6, 8, seed=1), r(1, 2, 6, 8, seed=2)), ("Add", "Where")),
    # nn
    "conv": (lambda m, x: m.conv(x), (X,), ("Conv",)),
    "conv_depthwise": (lambda m, x: m.dw(x), (r(1, 6, 9, 9),), ("Conv",)),
    "conv1d": (lambda m, x: m.c1(x), (r(2, 3, 20),), ("Conv",)),
    "batch_norm": (lambda m, x: m.bn(x), (X,), ("BatchNormalization",)),
    "batch_norm_1d_no_affine": (lambda m, x: m.bn1(x), (V,), ("BatchNormalization",)),
    "layer_norm": (lambda m, x: m.ln(x) + F.layer_norm(x, (8, 8)), (X,), ("LayerNormalization",)),
    "max_pool": (lambda m, x: F.max_pool2d(x, 3, 2, 1).sum() + F.max_pool2d(x, 2), (X,), ("MaxPool",)),
    "max_pool_ceil": (lambda m, x: F.max_pool2d(x, 3, 2, ceil_mode=True), (r(1, 2, 8, 8),), ("MaxPool",)),
    "avg_pool": (lambda m, x: F.avg_pool2d(x, 3, 2, 1).sum() + F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
                 (X,), ("AveragePool",)),
    "adaptive_pool": (lambda m, x: F.adaptive_avg_pool2d(x, 1).sum() + F.adaptive_avg_pool2d(x, 2).sum((2, 3)),
                      (X,), ("GlobalAveragePool", "AveragePool")),
    "softmax": (lambda m, x: F.softmax(x, 1) + F.log_softmax(x, -1), (V,), ("Softmax", "LogSoftmax")),
    "dropout_eval": (lambda m, x: m.drop(x) * 2, (V,), ()),
    "embedding": (lambda m, i: m.emb(i), (torch.tensor([[1, 0, 4], [3, 3, 2]]),), ("Gather",)),
    # reductions
    "mean_sum": (lambda m, x: x.mean((1, 2), keepdim=True).sum() + x.sum(-1) + x.mean(), (X,),
                 ("ReduceMean", "ReduceSum")),
    "amax_max": (lambda m, x: x.amax(1) + x.max(), (X,), ("ReduceMax",)),
    # shapes
    "reshape_flatten": (lambda m, x: x.view(2, -1).sum() + torch.flatten(x, 1).reshape(2, 3, 64)
                        + torch.flatten(x, 0, 1).reshape(2, 3, -1), (X,), ("Reshape",)),
    "permute_transpose": (lambda m, x: x.permute(0, 2, 3, 1).transpose(1, 2).sum() + x[0, 0].t(), (X,), ("Transpose",)),
    "cat_split_chunk": (lambda m, x: torch.cat(list(torch.split(x, 3, dim=-1)[::-1]), -1)
                        + torch.cat(torch.split(x, [5, 3], dim=-1), 3)
                        + torch.cat(torch.chunk(x, 2, dim=2)[::-1], 2), (X,), ("Concat", "Split")),
    "unbind": (lambda m, x: sum(torch.unbind(x, 1)), (X,), ("Squeeze",)),
    "slice_select": (lambda m, x: x[:, 1:3, ::2, -4:] * x[:, 0:1, 1::2, 2:6] + x[:, 1, None, :4, :4], (X,), ("Slice",)),
    "squeeze_unsqueeze": (lambda m, x: x[:, :1].squeeze(1).unsqueeze(-1).squeeze(), (X,), ("Squeeze", "Unsqueeze")),
    "pad": (lambda m, x: F.pad(x, (1, 2, 0, 3), value=0.25), (X,), ("Pad",)),
    "index_select": (lambda m, x: torch.index_select(x, 2, m.idx), (X,), ("Gather",)),
    "expand": (lambda m, x: x[:, :1].expand(2, 3, 8, 8) + x[0, 0].expand(4, 8, 8).sum(0), (X,), ("Expand",)),
}

PARAMS = {
    "linear_2d": dict(fc=nn.Linear(16, 7)), "linear_3d": dict(fc=nn.Linear(16, 7)),
    "addmm": dict(b=r(5, seed=3), w=r(16, 5, seed=4)), "weak_0d_promotion": dict(s=torch.tensor(3, dtype=torch.int64)),
    "sdpa_masks": dict(bm=torch.rand(6, 6, generator=torch.Generator().manual_seed(5)) > 0.3, fm=r(6, 6, seed=6)),
    "conv": dict(conv=nn.Conv2d(3, 4, 3, stride=2, padding=2, dilation=2)),
    "conv_depthwise": dict(dw=nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False)),
    "conv1d": dict(c1=nn.Conv1d(3, 5, 4, stride=2, padding=1)),
    "batch_norm": dict(bn=nn.BatchNorm2d(3)), "batch_norm_1d_no_affine": dict(bn1=nn.BatchNorm1d(16, affine=False)),
    "layer_norm": dict(ln=nn.LayerNorm(8)), "dropout_eval": dict(drop=nn.Dropout(0.5)),
    "embedding": dict(emb=nn.Embedding(5, 4)), "index_select": dict(idx=torch.tensor([7, 0, 0, 3])),
}


def _module(name: str) -> nn.Module:
    torch.manual_seed(0)
    params = PARAMS.get(name, {})
    for p in params.values():
        if isinstance(p, (nn.BatchNorm1d, nn.BatchNorm2d)):
            p.running_mean.uniform_(-0.5, 0.5)
            p.running_var.uniform_(0.5, 2.0)
    return Fn(CASES[name][0], **params)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_family_matches_torch(name):
    _, inputs, uses = CASES[name]
    check(_module(name), *inputs, uses=uses)


def test_multi_output_and_output_names():
    graph = check(Fn(lambda m, x: (x.relu(), x * 2, x)), V)
    assert graph.outputs[:2] == ("output_0", "output_1")


def test_parameters_are_constants_named_by_state_dict():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    graph = check(model, X)
    for key, value in model.state_dict().items():
        if key.endswith("num_batches_tracked"):
            continue
        assert key in graph.constants, key
        np.testing.assert_array_equal(graph.constants[key], value.numpy())


def test_reshape_does_not_bake_the_batch():
    graph = check(Fn(lambda m, x: x.view(x.shape[0], -1) + 1), X)
    (reshape,) = [n for n in graph.nodes if n.op == "Reshape"]
    assert reshape.attr["shape"] == (0, 192)


def test_multi_head_attention_module():
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    check(Fn(lambda m, x: m.mha(x, x, x, need_weights=False)[0], mha=mha), r(2, 5, 16))


def test_text_round_trip():
    graph = check(_module("conv"), X)
    assert parse_graph(print_graph(graph)) == graph
    verify(parse_graph(print_graph(graph)))


def test_every_unsupported_op_is_named_at_once():
    def forward(m, x):
        a = torch.cumsum(x, 1)
        b = torch.cumsum(x.relu(), 0)
        s, _ = torch.sort(x, dim=-1)
        return a + b + s

    with pytest.raises(UnsupportedModelError) as info:
        import_torch(Fn(forward), (V,))
    message = str(info.value)
    assert set(info.value.unsupported) == {"aten.cumsum.default", "aten.sort.default"}, message
    assert sorted(info.value.unsupported["aten.cumsum.default"]) == ["cumsum", "cumsum_1"]
    assert info.value.unsupported["aten.sort.default"] == ("sort",)
    for word in ("aten.cumsum.default", "aten.sort.default", "cumsum", "cumsum_1", "sort"):
        assert word in message


def test_unsupported_configuration_is_reported_with_its_reason():
    model = nn.Sequential(nn.AvgPool2d(2, divisor_override=3), nn.ReLU())
    with pytest.raises(UnsupportedModelError, match="divisor_override"):
        import_torch(model, (X,))


def test_compiler_import_does_not_import_torch():
    code = "import sys, cuvil.compiler, cuvil.compiler.frontends.builder; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
