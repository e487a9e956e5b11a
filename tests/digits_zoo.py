"""The zoo's image models and MLP trained on scikit-learn's digits: int8 agreement where fp32 is right.

The zoo is randomly initialised, and ResNet-18 and MobileNetV2 give one class for every input there,
so their top-1 agreement says only that a fixed margin survives quantization. Here each model learns
the bundled 8x8 digits, resized (bilinear) to its input shape, repeated over its channels and
standardised: ``TRAIN`` digits train it, 32 of them calibrate the quantization, the other ``TEST``
are drawn like them and evaluate it. Nothing is downloaded (the digits ship with scikit-learn).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from cuvil.coordinator.fleet import digits
from tests.zoo import ZOO

TRAIN, TEST = 797, 1000
EPOCHS = {"mlp": 20, "small_cnn": 12, "resnet18": 4, "mobilenet_v2": 10}
_SPLIT_SEED = 11


@functools.lru_cache(maxsize=None)
def digit_data(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train x, train y, test x, test y), each x as float32 [n, *shape]."""
    x, y = digits("all")
    order = np.random.default_rng(_SPLIT_SEED).permutation(len(x))
    side = shape[-1] if len(shape) == 3 else int(round(np.sqrt(shape[0])))
    big = F.interpolate(torch.from_numpy(x), size=(side, side), mode="bilinear", align_corners=False)
    big = (big - big.mean()) / big.std()
    big = big.expand(-1, shape[0], -1, -1) if len(shape) == 3 else big.reshape(len(x), -1)
    big = np.ascontiguousarray(big.numpy(), dtype=np.float32)
    train, test = order[:TRAIN], order[TRAIN:TRAIN + TEST]
    return big[train], y[train], big[test], y[test]


@functools.lru_cache(maxsize=None)
def trained(name: str, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Zoo model ``name`` trained on the digits (Adam, batch 32, ``EPOCHS[name]`` epochs), in eval mode,
    and its example input."""
    torch.manual_seed(seed)
    model, example = ZOO[name](seed)
    xs, ys, _, _ = digit_data(tuple(example[0].shape[1:]))
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(EPOCHS[name]):
        for idx in torch.randperm(len(xs), generator=gen).split(32):
            opt.zero_grad()
            F.cross_entropy(model(torch.from_numpy(xs[idx.numpy()])), torch.from_numpy(ys[idx.numpy()])).backward()
            opt.step()
    return model.eval(), example
