"""The model zoo shared by tests and benchmarks: the five models of docs' performance table.

Plain torch (torchvision is not usable here), deterministic for a given ``seed``, in eval mode.
BatchNorm running statistics and affine parameters are randomized so a BN layer is never the
identity (a frontend that dropped BN would otherwise still pass). Every builder returns
``(model, example_inputs)``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn


def _finish(model: nn.Module, seed: int) -> nn.Module:
    """Randomize BN statistics (not identity, but still well conditioned) and switch to eval."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                c = m.num_features
                m.running_mean.copy_(0.1 * torch.randn(c, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(c, generator=gen))
                m.weight.copy_(0.75 + 0.5 * torch.rand(c, generator=gen))
                m.bias.copy_(0.1 * torch.randn(c, generator=gen))
    return model.eval()


def _input(seed: int, *shape: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed + 2)),)


# ----------------------------------------------------------------------------------------- MLP ---
def mlp(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """784-256-256-10 with ReLU; input [1, 784]."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    return _finish(model, seed), _input(seed, 1, 784)


# ----------------------------------------------------------------------------------- small CNN ---
class SmallCNN(nn.Module):
    """(conv3x3-BN-ReLU-maxpool2) x 2, then linear: about 2.1 MFLOP on 1x28x28."""

    def __init__(self, c1: int = 16, c2: int = 32, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1, bias=False), nn.BatchNorm2d(c1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1, bias=False), nn.BatchNorm2d(c2), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.fc = nn.Linear(c2 * 7 * 7, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


def small_cnn(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return _finish(SmallCNN(), seed), _input(seed, 1, 1, 28, 28)


# ------------------------------------------------------------------------------------ ResNet-18 ---
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """CIFAR-style ResNet-18: 3x3 stem, no max-pool, stages [2, 2, 2, 2] of 64..512 channels."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        stages, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return _finish(ResNet18(), seed), _input(seed, 1, 3, 32, 32)


# ---------------------------------------------------------------------------------- MobileNetV2 ---
def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU6(inplace=True)) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = [_conv_bn(cin, hidden, 1)] if expand != 1 else []
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden), _conv_bn(hidden, cout, 1, act=False)]
        self.conv = nn.Sequential(*layers)
        self.use_res = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """Width 1.0, the standard (t, c, n, s) table, 1280-wide head, dropout then linear."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, classes: int = 10):
        super().__init__()
        layers, cin = [_conv_bn(3, 32, 3, 2)], 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_conv_bn(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return _finish(MobileNetV2(), seed), _input(seed, 1, 3, 96, 96)


# ------------------------------------------------------------------------------ tiny transformer ---
class TinyTransformer(nn.Module):
    """Encoder (seq 32, d_model 64, 2 heads, FFN 128, 2 layers), mean-pool over the sequence, linear."""

    def __init__(self, d_model: int = 64, heads: int = 2, layers: int = 2, ffn: int = 128, classes: int = 10):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, ffn, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


def tiny_transformer(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return _finish(TinyTransformer(), seed), _input(seed, 1, 32, 64)


ZOO: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "mlp": mlp,
    "small_cnn": small_cnn,
    "resnet18": resnet18,
    "mobilenet_v2": mobilenet_v2,
    "tiny_transformer": tiny_transformer,
}


def export_onnx(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], path: str | Path | None = None,
                opset: int = 17, dynamic_batch: bool = False):
    """Export with the TorchScript exporter (``dynamo=False``): the dynamo exporter of torch 2.13
    cannot bring ResNet-18 and MobileNetV2 down to opset 17 (docs/performance.md).

    The MHA fast path is switched off while exporting: under ``no_grad`` an eval-mode
    TransformerEncoderLayer would otherwise trace into ``aten::_transformer_encoder_layer_fwd``,
    which has no ONNX form.
    """
    import io
    import warnings

    import onnx

    names = [f"input{i}" if len(example_inputs) > 1 else "input" for i in range(len(example_inputs))]
    axes = {n: {0: "N"} for n in names} | {"output": {0: "N"}} if dynamic_batch else None
    buf = io.BytesIO()
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # "legacy TorchScript-based ONNX export"
            warnings.simplefilter("ignore", torch.jit.TracerWarning)  # MHA shape checks, static here
            torch.onnx.export(model.eval(), tuple(example_inputs), buf, input_names=names, output_names=["output"],
                              opset_version=opset, dynamic_axes=axes, do_constant_folding=True, dynamo=False)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    proto = onnx.load_from_string(buf.getvalue())
    if path is not None:
        onnx.save(proto, str(path))
    return proto
