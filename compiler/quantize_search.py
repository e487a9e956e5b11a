"""Mixed precision from an accuracy target: the fewest leading layers kept in float.

Why leading layers, not the ones that cost most alone: on MobileNetV2 trained on digits
(docs/quantization.md), the int8 error starts at the stem and grows through the blocks. Keeping the
first 3 layers in float lifted top-1 agreement from 98.4% to 99.3% on held-out digits; keeping the 1,
2 or 4 layers whose error alone was largest gave 98.6-98.9%. A layer's error feeds every layer
after it, so the first layers are where float buys most.

The search asks ``agreement(k)`` (the first ``k`` layers in float) for k = 0, 1, 2, 4, ... until one
meets the target, then halves the gap between the last miss and that hit: about 2 log2(k) runs
over the check inputs. Agreement on a few hundred inputs is not strictly monotone in k (a few
inputs move either way), so the k found is one that meets the target with k - 1 missing it on the
way, not a proof that no smaller k does. Every step is kept for the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SearchStep:
    float_count: int  # leading layers kept in float
    agreement: float  # top-1 agreement with the float graph on the check inputs


@dataclass(frozen=True)
class FloatSearch:
    target: float
    inputs: int  # check inputs the agreement was measured on
    steps: tuple[SearchStep, ...]
    chosen: int  # leading layers kept in float

    def format(self) -> str:
        tried = ", ".join(f"{s.float_count}: {s.agreement:.1%}" for s in self.steps)
        verdict = f"the first {self.chosen} layers in float" if self.chosen else "every layer in int8"
        return (f"target top-1 agreement {self.target:.1%} on {self.inputs} check inputs: {verdict} "
                f"(leading layers in float: agreement {tried})")


def fewest_float(limit: int, agreement: Callable[[int], float],
                 target: float) -> tuple[int | None, tuple[SearchStep, ...]]:
    """The smallest k in [0, limit] found to give ``agreement(k) >= target`` (see the module's note), or
    None when not even ``limit`` does; and every step measured."""
    steps: list[SearchStep] = []

    def meets(k: int) -> bool:
        steps.append(SearchStep(k, agreement(k)))
        return steps[-1].agreement >= target

    if meets(0):
        return 0, tuple(steps)
    if limit < 1:
        return None, tuple(steps)
    miss, hit = 0, 1
    while not meets(hit):
        if hit == limit:
            return None, tuple(steps)
        miss, hit = hit, min(2 * hit, limit)
    while hit - miss > 1:
        mid = (miss + hit) // 2
        if meets(mid):
            hit = mid
        else:
            miss = mid
    return hit, tuple(steps)
