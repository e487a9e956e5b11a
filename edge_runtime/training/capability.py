"""Whether this device can fine-tune: torch and opacus importable, and memory enough (nothing imported).

Light devices (a Raspberry Pi, a device without the ``dp`` extra) keep evaluating; the coordinator
reads the capability from the inventory and asks only capable devices to train. A device's memory is
the smaller of its profile's budget and what the operating system says is available now.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

TRAINING_MEMORY_MIB = 3072  # torch + opacus + a small model's per-example gradients, with room to spare
TRAINING_MODULES = ("torch", "opacus")


@dataclass(frozen=True)
class TrainingCapability:
    can_train: bool
    reason: str  # why not, in fixed words (empty when it can)


def training_capability(memory_budget_mib: int, available_bytes: int | None) -> TrainingCapability:
    """Capability from the profile's memory budget and the memory available (None: unknown, not limiting)."""
    missing = [m for m in TRAINING_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        return TrainingCapability(False, f"{' and '.join(missing)} not installed (pip install 'cuvil[dp]')")
    memory = memory_budget_mib if available_bytes is None else min(memory_budget_mib, available_bytes >> 20)
    if memory < TRAINING_MEMORY_MIB:
        return TrainingCapability(False, f"{memory} MiB of memory, fine-tuning wants {TRAINING_MEMORY_MIB}")
    return TrainingCapability(True, "")
