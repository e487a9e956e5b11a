"""Target: what lowering needs to know about a device's processor (built from a DeviceProfile)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


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


@dataclass(frozen=True)
class Tuning:
    """Per-CPU-kind tuning data (a profile's ``[tuning]`` table)."""

    autotune: bool = True  # time conv candidates on the device at compile time (cuvil compile --tune)
    autotune_fraction: float = 0.5  # tuning may add at most this fraction of the untuned compile time
    autotune_budget_s: float = 2.0  # and never more than this many seconds
    half_width_depthwise_max_ow: int = 24  # 512-bit targets: depthwise convs up to this output width use ymm


Geometry = tuple  # (N, C, H, W, OC, KH, KW, strides, pads, dilations, group) of a 2-D conv


@dataclass(frozen=True)
class Target:
    """A code-generation target.

    ``vector_bits`` is the native float vector width (128 NEON, 256 AVX2, 512 AVX-512); ``None``
    means scalable (SVE/SVE2: vector-length agnostic code, never pinned to one length).
    """

    name: str
    triple: str
    cpu: str
    features: tuple[str, ...] = ()
    vector_bits: int | None = 128
    kind: TargetKind = TargetKind.CPU
    gpu_arch: str | None = None
    tuning: Tuning = Tuning()
    conv_choices: tuple[tuple[Geometry, ConvChoice], ...] = ()  # measured on the device; else the cost model

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

    def has(self, feature: str) -> bool:
        return f"+{feature.lstrip('+')}" in self.features
