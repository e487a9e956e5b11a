"""Which of a tuned compile's plans the model keeps: each plan built in turn and the model checked whole.

A tuned compile at more than one thread has up to three plans (:func:`.split_check.plans`): the split at
the handoff the probe read, the split at the cheapest handoff, every layer whole. The first is built;
:func:`search` checks it (:func:`.split_check.check`) and builds the next where it does not pay, keeps a
long run's split build with its workers off where the "whole" is unsettled (:func:`.split_check.keeps_built`),
and checks a paying split made at a dear handoff against the split at the cheapest (:func:`.split_check.
cheaper_wins`). One build lives at a time (:class:`Builds`): each plan is a whole model's packed weights and
code, and a rebuild beside the one before peaked higher (ResNet-18 at 2 threads, the check forced to
"whole": 262 against 205 MiB). A plan taken back after another was built keeps its first build's code and
packs only its weights again (:func:`repacked`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import numpy as np

from ..compiler.codegen.lowered import LoweredModel
from ..compiler.digest import sha256
from ..compiler.ir.graph import Graph
from ..compiler.target import Target
from . import split_check
from .session import Session

log = logging.getLogger(__name__)

Before = tuple[LoweredModel, list[bytes], bytes]
"""A plan as this compile built it: its lowered model without weights, its objects, :func:`weights_digest`."""


class Builds:
    """The model as the last plan built it (``lowered``, ``objs``, a ``session`` on them), and what the builds
    cost: seconds lowering and in LLVM, and how many. ``build(plan)``: (lowered, objects, lowering seconds) of
    a fresh build; ``repack(plan, before)``: ``before`` with its weights packed again, or None; ``load``: a
    session on a build."""

    def __init__(self, lowered: LoweredModel, objs: list[bytes], lower_s: float, llvm_s: float,
                 build: Callable[[Target], tuple[LoweredModel, list[bytes], float]],
                 repack: Callable[[Target, Before], LoweredModel | None],
                 load: Callable[[LoweredModel, list[bytes]], Session]) -> None:
        self.lowered, self.objs, self.lower_s, self.llvm_s, self.count = lowered, objs, lower_s, llvm_s, 1
        self._build, self._repack, self._load = build, repack, load
        self.session = load(lowered, objs)

    def before(self) -> Before:
        """This build, to be taken back without building it again (:meth:`rebuild`)."""
        return dataclasses.replace(self.lowered, weights=b""), self.objs, weights_digest(self.lowered.weights)

    def rebuild(self, plan: Target, before: Before | None = None) -> None:
        """The session let go, then the model built as ``plan``; ``before``: this plan as built already,
        whose weights alone are packed again."""
        self.count += 1
        self.session.close()
        self.session = self.lowered = self.objs = None
        started = time.perf_counter()
        if before is not None and (repacked := self._repack(plan, before)) is not None:
            self.lowered, self.objs, more_s = repacked, before[1], time.perf_counter() - started
        else:
            self.lowered, self.objs, more_s = self._build(plan)
        self.lower_s, self.llvm_s = self.lower_s + more_s, self.llvm_s + time.perf_counter() - started - more_s
        self.session = self._load(self.lowered, self.objs)


def search(builds: Builds, plans: tuple[Target, ...], confirm: bool, cheaper_differs: bool,
           threads: int) -> tuple[split_check.Verdict | None, int, bool]:
    """(the verdict, the index in ``plans`` of the plan kept, whether its workers are off) once ``builds``
    holds the plan kept; ``confirm``: this compile re-takes a whole entry's decision (a second "whole"
    settles it); ``cheaper_differs``: the split at the cheapest handoff would make other jobs."""
    verdict, index = None, 0
    while index < len(plans) - 1:
        verdict = split_check.check(builds.session, confirm=confirm)
        if verdict.split:
            break
        following = index + 1 if verdict.measured else len(plans) - 1  # no free cores: straight to whole
        if following == len(plans) - 1 and split_check.keeps_built(verdict):
            builds.session.set_workers(False)
            return dataclasses.replace(verdict, reason=f"{verdict.reason}; the split build kept, its parts run on "
                                                       "the caller until its workers pay"), index, True
        index = following
        builds.rebuild(plans[index])  # measured: this split does not pay here
        if not builds.lowered.split_nodes:
            break
    if verdict is not None and index == 0 and len(plans) == 3 and cheaper_differs and \
            split_check.cheaper_worth_trying(verdict, threads):
        tuned, first = verdict, builds.before()  # it paid, at the probe's handoff; the cheapest may pay more
        builds.rebuild(plans[1])
        verdict = split_check.check(builds.session)
        if split_check.cheaper_wins(tuned, verdict):
            return dataclasses.replace(verdict, reason=f"{verdict.reason} (at the cheapest handoff, {verdict.speedup:.2f}x; "
                                                       f"the tuned split {tuned.speedup:.2f}x)"), 1, False
        builds.rebuild(plans[0], first)
        verdict = dataclasses.replace(tuned, reason=f"{tuned.reason} (the split at the cheapest handoff: "
                                                    f"{verdict.speedup:.2f}x against {tuned.speedup:.2f}x)")
    return verdict, index, False


def repacked(before: Before, graph: Graph, tgt: Target, plan: Target, batch: int, optimize: bool,
             profile: bool) -> LoweredModel | None:
    """``before`` with its weights packed again (``lower(emit=False)``: no kernel IR, no LLVM; ResNet-18's
    0.12-0.14 s against a build's ~1 s on the Xeon), or None where they do not come out as that build's were."""
    from ..compiler.codegen.lower import lower

    stripped, _, digest = before
    again = lower(graph, tgt, batch, optimize=optimize, profile=profile, emit=False, retarget=lambda g, t: plan)
    if again.plan != stripped.plan or weights_digest(again.weights) != digest:
        log.warning("the weights packed again differ from the build before's: the model is built again")
        return None
    return dataclasses.replace(stripped, weights=again.weights)


def weights_digest(weights: np.ndarray) -> bytes:
    """Length and every 251st byte of a packed weights block, hashed: tells a block packed again from the
    one packed before in well under a millisecond (ResNet-18: 228 KB of its 57 MB)."""
    block = np.asarray(weights).reshape(-1).view(np.uint8)
    return sha256(np.ascontiguousarray(block[::251]).tobytes() + len(block).to_bytes(8, "little")).digest()
