"""MemoryPlan: the planner's result, shared by the lowering and the runtime."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType


@dataclass(frozen=True)
class MemoryPlan:
    """Byte offsets of every non-constant value (graph inputs, intermediates, outputs) in one arena.

    ``lower_bound`` is the most bytes live at any one step of the schedule; ``naive_bytes`` the sum
    of all buffers, as if nothing were reused. Values that share storage in place have equal offsets;
    a joined operand (``joined``) lies at its offset inside its Concat's output.
    """

    batch: int
    offsets: Mapping[str, int]
    sizes: Mapping[str, int]
    arena_bytes: int
    lower_bound: int
    naive_bytes: int
    alignment: int = 64
    aliases: Mapping[str, str] = field(default_factory=dict)  # value -> value whose storage it reuses
    joined: Mapping[str, tuple[str, int]] = field(default_factory=dict)  # operand's storage root -> (joined output, byte offset)

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", MappingProxyType(dict(self.offsets)))
        object.__setattr__(self, "sizes", MappingProxyType(dict(self.sizes)))
        object.__setattr__(self, "aliases", MappingProxyType(dict(self.aliases)))
        object.__setattr__(self, "joined", MappingProxyType(dict(self.joined)))

    @cached_property
    def joined_outputs(self) -> frozenset[str]:
        """Outputs of joining nodes (Concat) whose operands were computed in place: no code runs them."""
        return frozenset(out for out, _ in self.joined.values())

    def summary(self) -> str:
        mb = 1 / (1024 * 1024)
        return (f"arena {self.arena_bytes * mb:.2f} MiB, lower bound {self.lower_bound * mb:.2f} MiB "
                f"({self.arena_bytes / max(self.lower_bound, 1):.3f}x), naive {self.naive_bytes * mb:.2f} MiB")
