"""Torch layers that map onto ops Cuvil's IR already has: transposed convolution, upsampling (Resize),
group and instance norm, argmax/argmin and max/min along a dim, flip (so bidirectional RNNs), index tensors
(``x[idx]``), roll, var/std, unfold and triu_indices.
Expected values come from the module's own eager output."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import cuvil  # noqa: E402

from .test_torch_frontend import Fn, check, r  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")

X = r(2, 4, 5, 6)
TIES = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, 2.0], [float("nan"), 1.0, float("nan"), 5.0]])

# name -> (forward, inputs, ops the graph must use, layers)
CASES = {
    "conv_transpose_2d": (lambda m, x: m.ct(x), (X,), ("ConvTranspose",),
                          dict(ct=nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2))),
    "conv_transpose_dilated_no_bias": (lambda m, x: m.ct(x), (X,), ("ConvTranspose",),
                                       dict(ct=nn.ConvTranspose2d(4, 3, (2, 3), stride=(1, 3), dilation=2, bias=False))),
    "conv_transpose_1d_3d": (lambda m, x, y: (m.c1(x), m.c3(y)), (r(2, 3, 7), r(1, 2, 3, 4, 5)), ("ConvTranspose",),
                             dict(c1=nn.ConvTranspose1d(3, 2, 4, stride=3, padding=2),
                                  c3=nn.ConvTranspose3d(2, 2, 2, stride=2))),
    "upsample_nearest": (lambda m, x: (F.interpolate(x, scale_factor=2), F.interpolate(x, size=(7, 13)),
                                       F.interpolate(x, scale_factor=(3, 1.5)), m.up(x)), (X,), ("Resize",),
                         dict(up=nn.Upsample(scale_factor=2, mode="nearest"))),
    "upsample_nearest_fractional": (lambda m, x: (F.interpolate(x, scale_factor=(2.8, 2.2)),
                                                  F.interpolate(x, scale_factor=(1.1, 2.11), mode="nearest-exact")),
                                    (r(1, 2, 16, 20),), ("Gather",), {}),  # ATen's f32 index steps, not Resize's
    "upsample_nearest_exact": (lambda m, x: (F.interpolate(x, scale_factor=2, mode="nearest-exact"),
                                             F.interpolate(x, size=(3, 9), mode="nearest-exact")), (X,), ("Resize",), {}),
    "upsample_bilinear": (lambda m, x: (F.interpolate(x, scale_factor=2, mode="bilinear"),
                                        F.interpolate(x, size=(9, 4), mode="bilinear"),
                                        F.interpolate(x, scale_factor=1.5, mode="bilinear"),
                                        F.interpolate(x, size=(1, 1), mode="bilinear")), (X,), ("Resize",), {}),
    "upsample_bilinear_align_corners": (lambda m, x: (F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True),
                                                      F.interpolate(x, size=(1, 7), mode="bilinear", align_corners=True)),
                                        (X,), ("Resize",), {}),
    "upsample_bicubic": (lambda m, x: (F.interpolate(x, scale_factor=2, mode="bicubic"),
                                       F.interpolate(x, size=(3, 11), mode="bicubic", align_corners=True)),
                         (X,), ("Resize",), {}),
    "upsample_linear_trilinear": (lambda m, x, y: (F.interpolate(x, scale_factor=2, mode="linear"),
                                                   F.interpolate(y, size=(4, 5, 3), mode="trilinear"),
                                                   F.interpolate(x, size=11)),
                                  (r(2, 3, 7), r(1, 2, 3, 4, 5)), ("Resize",), {}),
    "group_norm": (lambda m, x: (m.gn(x), F.group_norm(x, 4, eps=1e-3), m.gn1(x)), (X,), ("LayerNormalization",),
                   dict(gn=nn.GroupNorm(2, 4), gn1=nn.GroupNorm(1, 4))),
    "instance_norm": (lambda m, x, y: (m.inn(x), F.instance_norm(x), m.in1(y), m.unbatched(x[0])), (X, r(2, 3, 9)),
                      ("LayerNormalization",),
                      dict(inn=nn.InstanceNorm2d(4, affine=True), in1=nn.InstanceNorm1d(3, eps=0.1),
                           unbatched=nn.InstanceNorm2d(4, affine=True))),
    "instance_norm_running_stats": (lambda m, x: m.inn(x), (X,), ("BatchNormalization",),
                                    dict(inn=nn.InstanceNorm2d(4, affine=True, track_running_stats=True))),
    "argmax_argmin": (lambda m, x: (x.argmax(1), x.argmin(-1, keepdim=True), x.argmax(), x.argmin(keepdim=True),
                                    torch.argmax(x[0, 0], 0), x[0, 0].argmax()), (TIES,), ("ArgMax", "ArgMin"), {}),
    "max_min_along_dim": (lambda m, x: (*x.max(1), *x.min(0, keepdim=True), x.amin(1), x.min(),
                                        torch.min(x, x.flip(0))), (TIES,), ("ReduceMax", "ArgMax", "ReduceMin"), {}),
    "flip": (lambda m, x: (x.flip(1), x.flip((0, -1)), torch.flip(x[:1], (0,)), x.fliplr()), (X,), ("Slice",), {}),
    "index_tensor": (lambda m, x: (x[:, torch.tensor([2, -1, 0])],
                                   x[0, :, torch.tensor([[1, -2]]), torch.tensor([3, 0])],
                                   m.table.weight[torch.tensor([[4, -5], [0, 1]])]), (X,), ("Gather",),
                     dict(table=nn.Linear(6, 5))),
    # torch orders equal values as it likes (ONNX: by index): no ties here
    "topk": (lambda m, x: (*x.topk(3, dim=1), *torch.topk(x, 2, largest=False)), (X,), ("TopKIndices",), {}),
    "roll": (lambda m, x: (torch.roll(x, (-2, 3), (1, 3)), torch.roll(x[0, 0], 5, 0)), (X,), ("Gather",), {}),
    "var_std": (lambda m, x: (x.std(1, keepdim=True), x.var((2, 3)), x.std(correction=0), torch.var(x[0, 0, 0], 0)),
                (X,), ("ReduceSum", "Sqrt"), {}),
    "unfold_triu_indices": (lambda m, x: (x.unfold(-1, 3, 2), x.unfold(1, 2, 1),
                                          x[:, :, torch.triu_indices(4, 5, 1)[0], torch.triu_indices(4, 5, 1)[1]]),
                            (X,), ("Gather", "Transpose"), {}),
    "bidirectional_lstm": (lambda m, x: m.rnn(x)[0], (r(2, 5, 6),), ("Slice",),
                           dict(rnn=nn.LSTM(6, 4, num_layers=2, bidirectional=True, batch_first=True))),
    "bidirectional_gru_rnn": (lambda m, x: (m.gru(x)[0], m.rnn(x)[1]), (r(5, 2, 6),), ("Slice",),
                              dict(gru=nn.GRU(6, 4, bidirectional=True), rnn=nn.RNN(6, 3, bidirectional=True))),
}


def _module(name: str) -> nn.Module:
    torch.manual_seed(0)
    layers = CASES[name][3]
    for layer in layers.values():
        for p in layer.parameters():
            nn.init.uniform_(p, -0.5, 0.5)  # non-trivial affine parameters, not GroupNorm's ones and zeros
        if getattr(layer, "running_mean", None) is not None:
            layer.running_mean.uniform_(-0.5, 0.5)
            layer.running_var.uniform_(0.5, 2.0)
    return Fn(CASES[name][0], **layers)


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_matches_torch(name):
    _, inputs, uses, _ = CASES[name]
    check(_module(name), *inputs, uses=uses)


def test_compiled_layers_match_torch():
    """One native compile of the new layers together (the reference is checked per layer above)."""
    ct, gn = nn.ConvTranspose2d(4, 4, 2, stride=2), nn.GroupNorm(2, 4)

    def forward(m, x):
        y = m.gn(m.ct(x)) + F.interpolate(x, scale_factor=2, mode="bilinear") + F.interpolate(x, scale_factor=2)
        return F.instance_norm(y).flip(-1), y.argmax(1)

    module = Fn(forward, ct=ct, gn=gn).eval()
    graph = cuvil.import_model(module, (X,))
    got = cuvil.compile(graph).run({graph.inputs[0]: X.numpy()})
    with torch.no_grad():
        want = module(X)
    np.testing.assert_allclose(got[graph.outputs[0]], want[0].numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got[graph.outputs[1]], want[1].numpy())
