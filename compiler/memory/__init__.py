"""Static memory planning: every activation lives at a fixed offset in one arena."""

from ..lazy import lazy_names

_FROM = {"PlanError": ".checker", "check_plan": ".checker", "MemoryPlan": ".plan", "plan_memory": ".planner"}

__all__ = sorted(_FROM)
__getattr__, __dir__ = lazy_names(__name__, _FROM)
