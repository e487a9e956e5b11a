"""Static memory planning: every activation lives at a fixed offset in one arena."""

import importlib

_FROM = {"PlanError": ".checker", "check_plan": ".checker", "MemoryPlan": ".plan", "plan_memory": ".planner"}

__all__ = sorted(_FROM)


def __getattr__(name: str):
    """Loaded on first use (PEP 562): a session needs the plan's type, not the planner or its checker."""
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_FROM[name], __name__), name)
    globals()[name] = value
    return value
