"""Static memory planning: every activation lives at a fixed offset in one arena."""

from .plan import MemoryPlan

__all__ = ["MemoryPlan"]
