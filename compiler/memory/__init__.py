"""Static memory planning: every activation lives at a fixed offset in one arena."""

from .checker import PlanError, check_plan
from .plan import MemoryPlan
from .planner import plan_memory

__all__ = ["MemoryPlan", "PlanError", "check_plan", "plan_memory"]
