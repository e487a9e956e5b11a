"""Architectures beyond the zoo that an edge deployment plausibly brings: the arch sweep's models.

The zoo (``tests/zoo.py``) is what docs' performance table covers; these are what users bring next
(ImageNet stems, bottlenecks, fire modules, channel shuffles, 1-D audio, token ids, squeeze-excite,
attention, recurrence, encoder-decoders, detection heads), each runs in milliseconds at batch 1. Plain torch, seeded,
eval mode, BatchNorm statistics randomized as in the zoo; builders return ``(model, example_inputs)``.
:data:`UNSUPPORTED`: per architecture the torch frontend cannot import, the ATen op its error must name
(the ONNX frontend imports every one).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import torch
from torch import nn

from tests.zoo import BasicBlock, _finish, _input

Built = tuple[nn.Module, tuple[torch.Tensor, ...]]


def cba(cin: int, cout: int, k: int | tuple[int, int], stride: int = 1, groups: int = 1, act=nn.ReLU,
        dilation: int = 1, padding=None) -> nn.Sequential:
    """Conv (no bias) - BatchNorm - activation (``act``: a module class, or None for none)."""
    pad = tuple(dilation * (x - 1) // 2 for x in k) if isinstance(k, tuple) else dilation * (k - 1) // 2
    layers = [nn.Conv2d(cin, cout, k, stride, pad if padding is None else padding, dilation, groups, bias=False),
              nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)


def head(cin: int, classes: int) -> list[nn.Module]:
    return [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]


def seeded(build: Callable[..., Built]) -> Callable[..., Built]:
    """Seed torch before the builder makes its layers, so the weights depend on ``seed`` alone."""
    @functools.wraps(build)
    def seeded_build(seed: int = 0, *args, **kwargs) -> Built:
        torch.manual_seed(seed)
        return build(seed, *args, **kwargs)
    return seeded_build


def _image(model: nn.Module, seed: int, size: int) -> Built:
    return _finish(model, seed), _input(seed, 1, 3, size, size)


# ----------------------------------------------------------------------------------- CNNs ---
@seeded
def vgg_small(seed: int = 0) -> Built:
    """VGG-style stacks of 3x3 conv-BN-ReLU and 2x2 max-pools on 64x64, classifier with dropout."""
    layers, cin = [], 3
    for v in (32, 32, "M", 64, 64, "M", 128, 128, "M", 256, 256, "M"):
        layers.append(nn.MaxPool2d(2) if v == "M" else cba(cin, v, 3))
        cin = cin if v == "M" else v
    model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(256 * 4 * 4, 256), nn.ReLU(), nn.Dropout(0.5),
                          nn.Linear(256, 10))
    return _image(model, seed, 64)


def imagenet_stem() -> nn.Sequential:
    return nn.Sequential(cba(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))


@seeded
def resnet18_imagenet(seed: int = 0, size: int = 112) -> Built:
    """torchvision's ResNet-18 layout: 7x7/2 stem conv, 3x3/2 max-pool, stages of 64..512."""
    blocks, cin = [], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    return _image(nn.Sequential(imagenet_stem(), *blocks, *head(512, 100)), seed, size)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (grouped for ResNeXt; the stride here, as torchvision v1.5), 1x1 expand."""

    def __init__(self, cin: int, width: int, cout: int, stride: int, groups: int = 1):
        super().__init__()
        self.body = nn.Sequential(cba(cin, width, 1), cba(width, width, 3, stride, groups), cba(width, cout, 1, act=None))
        self.down = cba(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.down(x))


@seeded
def resnet50(seed: int = 0, size: int = 128) -> Built:
    """ResNet-50 ([3, 4, 6, 3] bottlenecks) at 128x128: stage planes are 32x32 down to 4x4."""
    blocks, cin = [], 64
    for width, n, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(n):
            blocks.append(Bottleneck(cin, width, 4 * width, stride if i == 0 else 1))
            cin = 4 * width
    return _image(nn.Sequential(imagenet_stem(), *blocks, *head(cin, 100)), seed, size)


@seeded
def resnext_tiny(seed: int = 0, size: int = 64) -> Built:
    """ResNeXt (cardinality 32) for Tiny-ImageNet's 64x64: 3x3 stem without downsampling, so the
    1x1 convs run on 64x64, 32x32 and 16x16 planes; one block per stage."""
    blocks = [Bottleneck(64, 128, 256, 1, 32), Bottleneck(256, 256, 512, 2, 32), Bottleneck(512, 512, 1024, 2, 32)]
    return _image(nn.Sequential(cba(3, 64, 3), *blocks, *head(1024, 200)), seed, size)


@seeded
def mobilenet_v1(seed: int = 0, size: int = 128) -> Built:
    """Width 0.5 MobileNetV1: 13 pairs of depthwise 3x3 and pointwise 1x1, ReLU."""
    layers, cin = [cba(3, 16, 3, 2)], 16
    for cout, stride in ((32, 1), (64, 2), (64, 1), (128, 2), (128, 1), (256, 2), *[(256, 1)] * 5, (512, 2), (512, 1)):
        layers += [cba(cin, cin, 3, stride, groups=cin), cba(cin, cout, 1)]
        cin = cout
    return _image(nn.Sequential(*layers, *head(cin, 100)), seed, size)


class SEBlock(nn.Module):
    """MobileNetV3's inverted residual: hard-swish, k x k depthwise, squeeze-excite (hard-sigmoid gate)."""

    def __init__(self, cin: int, hidden: int, cout: int, k: int, stride: int):
        super().__init__()
        self.dw = nn.Sequential(cba(cin, hidden, 1, act=nn.Hardswish),
                                cba(hidden, hidden, k, stride, hidden, act=nn.Hardswish))
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(hidden, hidden // 4, 1), nn.ReLU(),
                                nn.Conv2d(hidden // 4, hidden, 1), nn.Hardsigmoid())
        self.project = cba(hidden, cout, 1, act=None)
        self.res = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dw(x)
        y = self.project(h * self.se(h))
        return x + y if self.res else y


@seeded
def mobilenet_v3ish(seed: int = 0, size: int = 96) -> Built:
    cfg = ((16, 64, 24, 3, 2), (24, 72, 24, 3, 1), (24, 96, 40, 5, 2), (40, 240, 40, 5, 1), (40, 240, 48, 5, 1),
           (48, 288, 96, 5, 2), (96, 576, 96, 5, 1))
    model = nn.Sequential(cba(3, 16, 3, 2, act=nn.Hardswish), *(SEBlock(*c) for c in cfg),
                          cba(96, 576, 1, act=nn.Hardswish), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(576, 256), nn.Hardswish(), nn.Linear(256, 10))
    return _image(model, seed, size)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2's unit: split channels (or two strided branches), concat, shuffle 2 groups."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        half, self.stride = cout // 2, stride
        if stride > 1:
            self.left = nn.Sequential(cba(cin, cin, 3, stride, cin, act=None), cba(cin, half, 1))
        self.right = nn.Sequential(cba(cin if stride > 1 else half, half, 1), cba(half, half, 3, stride, half, act=None),
                                   cba(half, half, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            x = torch.cat((a, self.right(b)), 1)
        else:
            x = torch.cat((self.left(x), self.right(x)), 1)
        n, c, h, w = x.shape
        return x.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)


@seeded
def shufflenet_v2(seed: int = 0, size: int = 224) -> Built:
    """ShuffleNetV2 x0.5 (stages of 48, 96, 192 channels) at 224x224."""
    layers, cin = [cba(3, 24, 3, 2), nn.MaxPool2d(3, 2, 1)], 24
    for cout, n in ((48, 4), (96, 8), (192, 4)):
        for i in range(n):
            layers.append(ShuffleUnit(cin, cout, 2 if i == 0 else 1))
            cin = cout
    return _image(nn.Sequential(*layers, cba(cin, 1024, 1), *head(1024, 100)), seed, size)


class Concat(nn.Module):
    """Branches over one input, concatenated along channels (fire modules, ASPP)."""

    def __init__(self, *branches: nn.Module):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([b(x) for b in self.branches], 1)


def fire(cin: int, squeeze: int, expand: int) -> nn.Sequential:
    relu_conv = lambda k: nn.Sequential(nn.Conv2d(squeeze, expand, k, padding=k // 2), nn.ReLU())  # noqa: E731
    return nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU(), Concat(relu_conv(1), relu_conv(3)))


@seeded
def squeezenet(seed: int = 0, size: int = 112) -> Built:
    """SqueezeNet 1.1: fire modules (channel concat), ceil-mode max-pools, conv classifier."""
    pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, 2), nn.ReLU(), pool(), fire(64, 16, 64), fire(128, 16, 64), pool(),
        fire(128, 32, 128), fire(256, 32, 128), pool(), fire(256, 48, 192), fire(384, 48, 192),
        fire(384, 64, 256), fire(512, 64, 256),
        nn.Dropout(0.5), nn.Conv2d(512, 100, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return _image(model, seed, size)


@seeded
def tiny_yolo(seed: int = 0, size: int = 160) -> Built:
    """Tiny-YOLOv3's backbone and one head: LeakyReLU(0.1), ZeroPad2d((0, 1, 0, 1)) + stride-1 max-pool."""
    leaky = lambda: nn.LeakyReLU(0.1)  # noqa: E731
    layers, cin = [], 3
    for cout in (16, 32, 64, 128, 256):
        layers += [cba(cin, cout, 3, act=leaky), nn.MaxPool2d(2)]
        cin = cout
    model = nn.Sequential(*layers, cba(256, 512, 3, act=leaky), nn.ZeroPad2d((0, 1, 0, 1)), nn.MaxPool2d(2, 1),
                          cba(512, 256, 1, act=leaky), cba(256, 512, 3, act=leaky), nn.Conv2d(512, 255, 1))
    return _image(model, seed, size)


@seeded
def aspp(seed: int = 0, size: int = 256) -> Built:
    """DeepLab-style: a stride-8 trunk, then ASPP branches (1x1, 3x3 at dilation 2/4/6), concatenated."""
    trunk = [cba(3, 32, 3, 2), cba(32, 64, 3, 2), cba(64, 64, 3, 2)]
    branches = [cba(64, 64, 1)] + [cba(64, 64, 3, dilation=d) for d in (2, 4, 6)]
    return _image(nn.Sequential(*trunk, Concat(*branches), nn.Conv2d(256, 21, 1)), seed, size)


@seeded
def alexnet_lrn(seed: int = 0) -> Built:
    """AlexNet's front (11x11/4 conv, LocalResponseNorm, overlapping pools) at 227x227, narrowed."""
    model = nn.Sequential(
        nn.Conv2d(3, 48, 11, 4, 2), nn.ReLU(), nn.LocalResponseNorm(5), nn.MaxPool2d(3, 2),
        nn.Conv2d(48, 128, 5, padding=2), nn.ReLU(), nn.LocalResponseNorm(5), nn.MaxPool2d(3, 2),
        nn.Conv2d(128, 192, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2), *head(192, 100))
    return _image(model, seed, 227)


@seeded
def groupnorm_cnn(seed: int = 0) -> Built:
    """Conv-GroupNorm-SiLU (the norm of small-batch detectors and diffusion U-Nets) at 32x32."""
    model = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1), nn.GroupNorm(8, 32), nn.SiLU(), nn.Conv2d(32, 64, 3, 2, 1),
                          nn.GroupNorm(8, 64), nn.SiLU(), *head(64, 10))
    return _image(model, seed, 32)


class UNet(nn.Module):
    """Two-level U-Net (64x64, 16/32/64 channels, skip concats); ``up``: "transpose" or "nearest"."""

    def __init__(self, up: str):
        super().__init__()
        dc = lambda a, b: nn.Sequential(cba(a, b, 3), cba(b, b, 3))  # noqa: E731
        self.e1, self.e2, self.mid, self.d2, self.d1 = dc(3, 16), dc(16, 32), dc(32, 64), dc(64, 32), dc(32, 16)
        if up == "transpose":
            self.u2, self.u1 = nn.ConvTranspose2d(64, 32, 2, 2), nn.ConvTranspose2d(32, 16, 2, 2)
        else:
            self.u2 = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(64, 32, 1))
            self.u1 = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(32, 16, 1))
        self.out = nn.Conv2d(16, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.e1(x)
        b = self.e2(nn.functional.max_pool2d(a, 2))
        d = self.d2(torch.cat([self.u2(self.mid(nn.functional.max_pool2d(b, 2))), b], 1))
        return self.out(self.d1(torch.cat([self.u1(d), a], 1)))


@seeded
def unet(seed: int = 0, up: str = "transpose") -> Built:
    return _image(UNet(up), seed, 64)


@seeded
def seg_bilinear(seed: int = 0, size: int = 128) -> Built:
    """Segmentation as DeepLab ends: a stride-8 trunk, 1x1 class scores, bilinear upsampling back to the input."""
    model = nn.Sequential(cba(3, 32, 3, 2), cba(32, 64, 3, 2), cba(64, 64, 3, 2), nn.Conv2d(64, 21, 1),
                          nn.Upsample(scale_factor=8, mode="bilinear"))
    return _image(model, seed, size)


@seeded
def conv_autoencoder(seed: int = 0, size: int = 64) -> Built:
    """Image autoencoder: stride-2 3x3 convs down to 64 channels at 8x8, then the decoders' 3x3 stride-2
    transposed convs (padding 1, output_padding 1) back up, sigmoid output."""
    up = lambda a, b: [nn.ConvTranspose2d(a, b, 3, 2, 1, 1, bias=False), nn.BatchNorm2d(b), nn.ReLU()]  # noqa: E731
    model = nn.Sequential(cba(3, 16, 3, 2), cba(16, 32, 3, 2), cba(32, 64, 3, 2), *up(64, 32), *up(32, 16),
                          nn.ConvTranspose2d(16, 3, 3, 2, 1, 1), nn.Sigmoid())
    return _image(model, seed, size)


# ------------------------------------------------------------------------ audio, text, tabular ---
@seeded
def audio_cnn1d(seed: int = 0, samples: int = 16000) -> Built:
    """M5-style raw-waveform net: 80-tap stride-4 front conv, then 3-tap convs (one dilated), max-pools."""

    def block(cin: int, cout: int, k: int, stride: int = 1, dilation: int = 1) -> list[nn.Module]:
        pad = dilation * (k - 1) // 2
        return [nn.Conv1d(cin, cout, k, stride, pad, dilation, bias=False), nn.BatchNorm1d(cout), nn.ReLU()]

    model = nn.Sequential(
        *block(1, 32, 80, 4), nn.MaxPool1d(4), *block(32, 32, 3), nn.MaxPool1d(4),
        *block(32, 64, 3), *block(64, 64, 3, dilation=2), nn.MaxPool1d(4), *block(64, 128, 3), nn.MaxPool1d(4),
        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(128, 35))
    return _finish(model, seed), _input(seed, 1, 1, samples)


@seeded
def kws_dscnn(seed: int = 0) -> Built:
    """DS-CNN-S of "Hello Edge": 10x4/2 conv over 49 MFCC frames x 10 coefficients, 4 DS blocks."""
    layers = [cba(1, 64, (10, 4), 2, padding=(5, 1))]
    for _ in range(4):
        layers += [cba(64, 64, 3, groups=64), cba(64, 64, 1)]
    model = nn.Sequential(*layers, nn.AvgPool2d((25, 5)), nn.Flatten(), nn.Linear(64, 12))
    return _finish(model, seed), _input(seed, 1, 1, 49, 10)


class TextCNN(nn.Module):
    """Token ids (int64) -> embedding -> 5-tap Conv1d -> max over time -> 4 classes."""

    def __init__(self, vocab: int = 5000):
        super().__init__()
        self.emb, self.conv, self.fc = nn.Embedding(vocab, 64), nn.Conv1d(64, 128, 5, padding=2), nn.Linear(128, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(self.emb(ids).transpose(1, 2))).amax(-1))


@seeded
def textcnn(seed: int = 0) -> Built:
    return _finish(TextCNN(), seed), (torch.randint(0, 5000, (1, 128), generator=torch.Generator().manual_seed(seed)),)


class Residual(nn.Module):
    """x + f(x): the pre-norm residual of MLP-Mixer-style blocks and ViT."""

    def __init__(self, *layers: nn.Module):
        super().__init__()
        self.f = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.f(x)


def ffn(d: int, ln_eps: float = 1e-5) -> Residual:
    return Residual(nn.LayerNorm(d, eps=ln_eps), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))


@seeded
def wide_mlp(seed: int = 0) -> Built:
    """Pre-norm residual MLP blocks (LayerNorm, 1024 -> 2048 GELU -> 1024), tabular-sized input."""
    model = nn.Sequential(nn.Linear(256, 1024), ffn(1024), ffn(1024), nn.LayerNorm(1024), nn.Linear(1024, 10))
    return _finish(model, seed), _input(seed, 1, 256)


@seeded
def dense_autoencoder(seed: int = 0) -> Built:
    """DCASE machine-sound baseline: 640 -> (128 x 4) -> 8 -> (128 x 4) -> 640, Linear-BN1d-ReLU."""
    dims, layers = (640, 128, 128, 128, 128, 8, 128, 128, 128, 128), []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU()]
    return _finish(nn.Sequential(*layers, nn.Linear(128, 640)), seed), _input(seed, 1, 640)


# ------------------------------------------------------------------- attention and recurrence ---
class Attention(nn.Module):
    """timm's ViT attention written out: one qkv Linear, reshape/permute to heads, softmax(QK^T)V."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class TinyViT(nn.Module):
    """4x4 patch-embed conv on 32x32 (64 patches + class token), learned positions, 4 blocks of 128."""

    def __init__(self, dim: int = 128, depth: int = 4, heads: int = 4, patch: int = 4, size: int = 32):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(0.02 * torch.randn(1, 1, dim))
        self.pos = nn.Parameter(0.02 * torch.randn(1, (size // patch) ** 2 + 1, dim))
        self.blocks = nn.Sequential(*(m for _ in range(depth) for m in (
            Residual(nn.LayerNorm(dim, eps=1e-6), Attention(dim, heads)), ffn(dim, 1e-6))))
        self.norm, self.head = nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


@seeded
def vit_tiny(seed: int = 0) -> Built:
    return _image(TinyViT(), seed, 32)


class RecurrentKWS(nn.Module):
    """A 2-layer LSTM (or GRU) over frames of 40 log-mel features (49: 1 s), last state to 12 classes."""

    def __init__(self, cell: type[nn.RNNBase]):
        super().__init__()
        self.rnn, self.fc = cell(40, 64, num_layers=2, batch_first=True), nn.Linear(64, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.rnn(x)[0][:, -1])


@seeded
def lstm_kws(seed: int = 0, cell: type[nn.RNNBase] = nn.LSTM, frames: int = 49) -> Built:
    return _finish(RecurrentKWS(cell), seed), _input(seed, 1, frames, 40)


# -------------------------------------------------------- detectors and sequence heads ---
class WaveNet(nn.Module):
    """Gated dilated causal Conv1d layers (tanh * sigmoid), residual and skip sums, then a softmax over
    256 classes at every step: a softmax over a middle axis."""

    def __init__(self, res: int = 32, skip: int = 64, layers: int = 8):
        super().__init__()
        self.inp = nn.Conv1d(1, res, 1)
        self.dil = nn.ModuleList(nn.Conv1d(res, 2 * res, 2, dilation=2 ** i) for i in range(layers))
        self.res = nn.ModuleList(nn.Conv1d(res, res, 1) for _ in range(layers))
        self.skip = nn.ModuleList(nn.Conv1d(res, skip, 1) for _ in range(layers))
        self.out = nn.Sequential(nn.ReLU(), nn.Conv1d(skip, skip, 1), nn.ReLU(), nn.Conv1d(skip, 256, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, total = self.inp(x), 0
        for dil, res, skip in zip(self.dil, self.res, self.skip):
            a, b = dil(nn.functional.pad(x, (dil.dilation[0], 0))).chunk(2, 1)
            z = torch.tanh(a) * torch.sigmoid(b)
            total, x = total + skip(z), x + res(z)
        return self.out(total).softmax(1)


@seeded
def wavenet(seed: int = 0, steps: int = 1024) -> Built:
    return _finish(WaveNet(), seed), _input(seed, 1, 1, steps)


class CenterNet(nn.Module):
    """A stride-16 trunk, two 4x4 stride-2 transposed convs back up, then heatmap (sigmoid), size and
    offset heads, concatenated."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(cba(3, 32, 3, 2), cba(32, 64, 3, 2), cba(64, 128, 3, 2), cba(128, 256, 3, 2))
        self.up = nn.Sequential(nn.ConvTranspose2d(256, 128, 4, 2, 1, bias=False), nn.BatchNorm2d(128), nn.ReLU(),
                                nn.ConvTranspose2d(128, 64, 4, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        self.heads = nn.ModuleList(nn.Sequential(cba(64, 64, 3), nn.Conv2d(64, o, 1)) for o in (20, 2, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.up(self.trunk(x))
        return torch.cat([self.heads[0](f).sigmoid(), self.heads[1](f), self.heads[2](f)], 1)


@seeded
def centernet(seed: int = 0, size: int = 128) -> Built:
    return _image(CenterNet(), seed, size)


class SharedHead(nn.Module):
    """FPN-style: one head conv shared by three pyramid levels (one weight, three input sizes), each
    anchor's best class score, the top 100 of all anchors."""

    def __init__(self, width: int = 48, classes: int = 36):
        super().__init__()
        self.levels = nn.ModuleList([cba(3, width, 3, 2), cba(width, width, 3, 2), cba(width, width, 3, 2)])
        self.head = nn.Conv2d(width, classes, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = []
        for level in self.levels:
            x = level(x)
            scores.append(self.head(x).flatten(2))
        return torch.cat(scores, 2).amax(1).topk(100, dim=1).values


@seeded
def shared_head(seed: int = 0, size: int = 64) -> Built:
    return _image(SharedHead(), seed, size)


ARCHS: dict[str, Callable[..., Built]] = {f.__name__: f for f in (
    vgg_small, resnet18_imagenet, resnet50, resnext_tiny, mobilenet_v1, mobilenet_v3ish, shufflenet_v2, squeezenet,
    tiny_yolo, aspp, audio_cnn1d, kws_dscnn, textcnn, wide_mlp, dense_autoencoder, vit_tiny, lstm_kws, wavenet,
    centernet, shared_head)} | {
    "gru_kws": functools.partial(lstm_kws, cell=nn.GRU), "unet": unet,
    "unet_nearest": functools.partial(unet, up="nearest"), "alexnet_lrn": alexnet_lrn, "groupnorm_cnn": groupnorm_cnn,
    "conv_autoencoder": conv_autoencoder, "seg_bilinear": seg_bilinear}

# name -> the ATen op the torch frontend's import error names
UNSUPPORTED: dict[str, str] = {
    "alexnet_lrn": "avg_pool3d",  # torch exports LocalResponseNorm as If (on static shapes) + 3-D pooling
}
