"""One device's DP-SGD fine-tuning with Opacus: per-example clipping, Gaussian noise, Poisson sampling.

Opacus' own pieces do the private part: ``GradSampleModule`` (per-example gradients),
``DPOptimizer`` (clip each example's gradient to ``max_grad_norm``, add N(0, (z·C)²) to the sum,
divide by the batch size) and ``DPDataLoader`` (each example in each batch independently with
probability ``sample_rate``). Two things differ from ``PrivacyEngine.make_private`` on purpose:

- the sampling rate and the averaging batch size come from the request, never from the number of
  local examples, so the privacy cost (and the ε the device reports) says nothing about that number;
- the noise and the sampling draw from torch generators seeded with fresh OS randomness per round
  (torch's default generator starts from the same fixed seed in every fresh process; Opacus'
  ``secure_mode`` needs ``torchcsprng``, which is not installable here).

With equal inputs and seeds, the update equals what ``make_private`` produces (a test checks it).

Nothing the coordinator sees may depend on the examples beyond the noised release, so: the model and
the records' shape are checked (:func:`prepare`) before the round is charged; the examples are padded
with rows that take part in the sampling but whose gradients are zeroed, up to ``max_examples``, so a
step's work does not tell how many there are (beyond ``max_examples`` every example takes part, none
is dropped: dropping would make a neighbouring dataset differ by a replaced example, which the
add-or-remove accounting does not cover); and an example whose gradient is not finite contributes a
zero gradient, as a padding row does, instead of turning the whole update into an error reply.
The returned update (new weights minus the sent ones) is then clipped to ``update_clip`` in L2 norm:
post-processing, so it costs no privacy, and it bounds what one device can move the average.

A round runs on one torch thread: per-example gradients of a small model are many tiny ops, which
several threads only slow down (the demo's CNN: 1.2 CPU-s a round on two threads of a loaded 2-core
host, 0.1 CPU-s on one), and the device's other work keeps its cores.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ...compiler.ir.graph import Graph
from .config import DpSgdConfig
from .errors import TrainingError


@dataclass(frozen=True)
class LocalUpdate:
    """What one device's round produced: the clipped update (graph layout) and how it was clipped."""

    update: Mapping[str, np.ndarray]  # new weights - sent weights, after the update clip
    norm: float  # L2 norm of the update before the clip (stays on the device)
    examples: int  # examples the sampler drew from (stays on the device: only a noisy count leaves)


def fresh_generators() -> tuple:
    """Sampling and noise generators, each seeded from the OS's randomness (never a fixed seed)."""
    import torch

    return tuple(torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little")) for _ in range(2))


@contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one intra-op thread for the block (the process's setting restored after)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def warm_up() -> None:
    """Import torch and Opacus and take one DP-SGD step on a toy model (no data): a long-lived process
    that will train (a simulation's worker) pays the first round's imports and lazy set-up up front."""
    import torch
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    with one_thread():
        model = GradSampleModule(torch.nn.Linear(4, 2))
        opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0,
                          expected_batch_size=2)
        with torch.enable_grad():
            torch.nn.functional.cross_entropy(model(torch.zeros(2, 4)), torch.zeros(2, dtype=torch.long)).backward()
        opt.step()
        model.remove_hooks()


def prepare(graph: Graph, record_shape: Sequence[int]):
    """The round's trainable module, or TrainingError: checks that depend on the model and on the shape of
    the device's records only, never on their number or values, so they run before the round is charged."""
    from .torch_graph import TorchGraph

    module = TorchGraph(graph)
    if math.prod(int(d) for d in record_shape) != math.prod(module.example_shape):
        raise TrainingError("the local dataset does not match the model's input")
    return module


def fine_tune(graph: Graph, x: np.ndarray, y: np.ndarray, cfg: DpSgdConfig,
              generators: Sequence | None = None, module=None) -> LocalUpdate:
    """Run ``cfg.steps`` DP-SGD steps from ``graph``'s weights on (x, y); return the clipped update.

    ``generators``: (sampling, noise) torch generators; only tests pass seeded ones. ``module``: what
    :func:`prepare` returned for this graph and these records (prepared here when not given).
    """
    module = module if module is not None else prepare(graph, x.shape[1:])
    with one_thread():
        return _fine_tune(module, x, y, cfg, generators)


def _fine_tune(module, x: np.ndarray, y: np.ndarray, cfg: DpSgdConfig, generators: Sequence | None) -> LocalUpdate:
    import torch
    from opacus import GradSampleModule
    from opacus.data_loader import DPDataLoader
    from opacus.optimizers import DPOptimizer

    module.train()
    module.train_only_last(cfg.train_layers)
    sampling, noise = generators if generators is not None else fresh_generators()
    n, shape = len(x), module.example_shape
    rows = max(n, cfg.max_examples)
    xt, yt = torch.zeros((rows, *shape)), torch.zeros(rows, dtype=torch.int64)
    xt[:n] = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32).reshape(n, *shape))
    yt[:n] = torch.from_numpy(np.asarray(y, dtype=np.int64))
    real = torch.arange(rows) < n
    before = module.weights(trained_only=True)
    model = GradSampleModule(module)
    trained = [p for p in module.parameters() if p.requires_grad]
    optimizer = DPOptimizer(torch.optim.SGD(trained, lr=cfg.learning_rate),
                            noise_multiplier=cfg.noise_multiplier, max_grad_norm=cfg.max_grad_norm,
                            expected_batch_size=cfg.batch_size, generator=noise)
    loader = DPDataLoader(torch.utils.data.TensorDataset(xt, yt, real), sample_rate=cfg.sample_rate,
                          generator=sampling)
    done = 0
    with torch.enable_grad():
        while done < cfg.steps:
            for xb, yb, rb in loader:
                optimizer.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                _zero_unusable(trained, rb)
                optimizer.step()
                done += 1
                if done == cfg.steps:
                    break
    model.remove_hooks()
    after = module.weights(trained_only=True)
    delta = {k: after[k] - before[k] for k in before}
    return clip_update(delta, cfg.update_clip, n)


def _zero_unusable(params: Sequence, real) -> None:
    """Zero the per-example gradients of padding rows and of examples whose gradient is not finite, before
    Opacus clips and sums them: either contributes nothing, and one example's overflow stays its own."""
    import torch

    keep = real.clone()
    for p in params:
        keep &= torch.isfinite(p.grad_sample).reshape(len(keep), -1).all(dim=1)
    for p in params:
        p.grad_sample[~keep] = 0.0


def clip_update(delta: Mapping[str, np.ndarray], bound: float, examples: int) -> LocalUpdate:
    """Scale the whole update down to L2 norm ``bound`` when it is longer (a non-finite one is refused)."""
    norm = math.sqrt(math.fsum(float(np.sum(np.square(v, dtype=np.float64))) for v in delta.values()))
    if not math.isfinite(norm):
        raise TrainingError("the local update is not finite")
    scale = min(1.0, bound / norm) if norm > 0 else 1.0
    return LocalUpdate({k: (v * np.float32(scale)).astype(np.float32) for k, v in delta.items()}, norm, examples)


def dp_sgd_rdp(cfg: DpSgdConfig, orders: Sequence[float]) -> tuple[float, ...]:
    """Rényi DP of the round at ``orders``: Poisson-subsampled Gaussian, composed over the steps.

    Opacus' RDP analysis (Mironov, Talwar, Zhang 2019), the same orders as the ledger's accountant.
    """
    from opacus.accountants.analysis.rdp import compute_rdp

    rdp = compute_rdp(q=cfg.sample_rate, noise_multiplier=cfg.noise_multiplier, steps=cfg.steps, orders=list(orders))
    return tuple(float(r) for r in np.atleast_1d(rdp))
