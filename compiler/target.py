"""Target: what lowering needs to know about a device's processor (built from a DeviceProfile)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .tuning import Tuning, default_tuning


class TargetKind(enum.Enum):
    CPU = "cpu"
    GPU = "gpu"


@dataclass(frozen=True)
class ConvChoice:
    """One conv layer's method, register tile and vector lanes (``vl`` below the target's: half-width
    kernels), as the cost model or an on-device tuner picked it."""

    method: str
    mr: int
    nv: int
    vl: int


Geometry = tuple  # (N, C, H, W, OC, KH, KW, strides, pads, dilations, group) of a 2-D conv


@dataclass(frozen=True)
class Target:
    """A code-generation target.

    ``vector_bits`` is the native float vector width (128 NEON, 256 AVX2, 512 AVX-512); ``None``
    means scalable (SVE/SVE2: vector-length agnostic code, never pinned to one length). ``tuning``
    defaults to :func:`~.tuning.default_tuning` of the triple, cpu and width.
    """

    name: str
    triple: str
    cpu: str
    features: tuple[str, ...] = ()
    vector_bits: int | None = 128
    kind: TargetKind = TargetKind.CPU
    gpu_arch: str | None = None
    tuning: Tuning = None  # type: ignore[assignment]  (filled in __post_init__ when not given)

    def __post_init__(self) -> None:
        if self.tuning is None:
            object.__setattr__(self, "tuning", default_tuning(self.triple, self.cpu, self.vector_bits))
    conv_choices: tuple[tuple[Geometry, ConvChoice], ...] = ()  # measured on the device; else the cost model
    threads: int = 1  # threads one inference runs on (the code's split is decided per layer at compile time)
    conv_parts: tuple[tuple[Geometry, int], ...] = ()  # parts per conv measured on the device; else the cost model

    @property
    def feature_string(self) -> str:
        return ",".join(self.features)

    @property
    def scalable(self) -> bool:
        return self.vector_bits is None

    @property
    def vector_floats(self) -> int:
        """f32 lanes per native vector (the SVE minimum, 4, when scalable)."""
        return (self.vector_bits or 128) // 32

    def conv_choice(self, geometry: Geometry) -> ConvChoice | None:
        return next((c for g, c in self.conv_choices if g == geometry), None)

    def split_parts(self, geometry: Geometry) -> int | None:
        return next((k for g, k in self.conv_parts if g == geometry), None)

    def has(self, feature: str) -> bool:
        return f"+{feature.lstrip('+')}" in self.features
