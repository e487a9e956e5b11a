"""Target: what lowering needs to know about a device's processor (built from a DeviceProfile)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class TargetKind(enum.Enum):
    CPU = "cpu"
    GPU = "gpu"


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

    def has(self, feature: str) -> bool:
        return f"+{feature.lstrip('+')}" in self.features
