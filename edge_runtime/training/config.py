"""The DP-SGD parameters of one training round: exactly what the device is charged for.

Every value comes from the coordinator, so every value is checked (finite, of its type, in its range)
before anything runs; :data:`RANGES` is the one table of limits. The sampling rate and the averaging
batch size are public parameters, never derived from the number of local examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from .errors import TrainingError

# field -> (integer?, lowest, highest, lowest excluded?)
RANGES: dict[str, tuple[bool, float, float, bool]] = {
    "sample_rate": (False, 1e-6, 1.0, False),  # Opacus' sampler draws f32: a rate under 2**-24 is 2**-24
    "noise_multiplier": (False, 0.3, 100.0, False),
    "steps": (True, 1, 10_000, False),
    "max_grad_norm": (False, 0.0, 1e3, True),
    "learning_rate": (False, 0.0, 100.0, True),
    "batch_size": (True, 1, 65_536, False),
    "update_clip": (False, 0.0, 1e6, True),
    "max_examples": (True, 1, 100_000, False),
    "train_layers": (True, 0, 10_000, False),
}


@dataclass(frozen=True)
class DpSgdConfig:
    sample_rate: float = 0.05  # Poisson sampling: each example joins each batch with this probability
    noise_multiplier: float = 1.5  # z: noise std is z * max_grad_norm on the sum of clipped gradients
    steps: int = 30  # optimizer steps (batches) per round
    max_grad_norm: float = 1.0  # C: per-example gradient clip (L2, over all trained weights)
    learning_rate: float = 0.5  # plain SGD
    batch_size: int = 16  # the averaging denominator (public; about sample_rate x the examples of a device)
    update_clip: float = 5.0  # L2 bound on the update a device returns (post-processing)
    max_examples: int = 512  # a round works as if on this many examples (padding); every local example takes part
    train_layers: int = 0  # train only the last this-many weight layers (0: all of them)

    def __post_init__(self) -> None:
        for f in fields(self):
            integer, low, high, open_low = RANGES[f.name]
            value = getattr(self, f.name)
            ok = not isinstance(value, bool) and isinstance(value, (int, float)) and _finite(value) \
                and (value == int(value) if integer else True) and (low < value if open_low else low <= value) \
                and value <= high
            if not ok:
                raise TrainingError(f"training parameter {f.name} must be {'an integer' if integer else 'a number'} "
                                    f"in {'(' if open_low else '['}{low:g}, {high:g}]")
            object.__setattr__(self, f.name, int(value) if integer else float(value))


def _finite(value: int | float) -> bool:
    """math.isfinite, with an int too large for a float (10**400) as not finite rather than OverflowError."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
