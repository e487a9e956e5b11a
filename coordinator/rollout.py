"""Canary rollout with rollback, per device class (the decision rule is :mod:`.rollout_rule`).

1. A ``canary-fraction`` of each class (at least one device, seeded choice) activates the candidate B;
   each keeps A, the version it replaces, as its previous version.
2. An A/B evaluation on those canaries (both versions, the same devices, paired).
3. Per class, the rule promotes or rolls back: promotion activates B on the rest of the class (the
   bundle pushed only where it is not held), rollback reverts the canaries to A, which they still hold
   (no download). The decision, its numbers and the devices switched go to the results store.

Activation is idempotent on a device and a repeated revert changes nothing, so a resumed run can send
them again, and a rollback reverts every canary that may run B: one whose activation went unanswered
may still apply it late (a device works through its messages in order, so the revert comes after it).
A device whose last switch went unanswered runs a version nobody knows (:data:`UNKNOWN`): it is
neither counted as switched nor evaluated as running A.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..compiler.bundle.format import is_sha256_hex
from .aggregate import compare
from .device_text import cut_reason
from .exchange import Reply, Request, exchange, ttl_until
from .messages import Code
from .rollout_rule import PROMOTE, Decision, DecisionRule, RolloutError, decide
from .rounds import BundleRef, Coordinator


def canaries(coord: Coordinator, number: int, fraction: float) -> dict[str, list[str]]:
    """Per class, the canary device ids: ceil(fraction x class size), at least one, seeded by run and round."""
    if not 0 < fraction <= 1:
        raise RolloutError(f"the canary fraction must be in (0, 1], got {fraction!r}")
    exhausted = coord.store.exhausted_devices(coord.cfg.dataset)
    by_class: dict[str, list[str]] = {}
    for v in sorted(coord.devices.values(), key=lambda v: v.device_id):
        if v.device_id not in exhausted:
            by_class.setdefault(v.profile, []).append(v.device_id)
    gen = np.random.default_rng([coord.cfg.seed, number, 7])
    return {cls: sorted(devs[int(i)] for i in gen.choice(len(devs), max(1, math.ceil(fraction * len(devs))),
                                                           replace=False))
            for cls, devs in sorted(by_class.items())}


UNKNOWN = "unknown"  # the version of a device whose switch went unanswered: it may have applied it, or not


def switch(coord: Coordinator, device_ids: Sequence[str], bundle: BundleRef, action: str,
           base: BundleRef | None = None) -> dict[str, str]:
    """Send ``activate`` (``base`` becomes previous) or ``revert`` (to ``bundle``); the bundle is pushed where
    not held, or where the device says it lacks it. The version each device runs after it: the active
    version it answered, or :data:`UNKNOWN` where its answer did not come by the deadline or Flower answered
    for it (an expired message, a node gone: the message may still reach the device and apply). A device
    that refused is absent: it runs what it ran before."""
    node_of = coord.node_of
    active: dict[str, str] = {}
    config = {"bundle-hash": bundle.content_hash, "model": bundle.name, "action": action,
              "base-hash": base.content_hash if base else ""}
    deadline = time.monotonic() + coord.cfg.round_timeout

    def request(device_id: str, push: bool, full: bool = False) -> Request:
        data, delta = coord.deltas.payload(bundle, coord.devices[node_of[device_id]].held, full) if push else (None, None)
        return Request(node_of[device_id], "activate", config, data, ttl=ttl_until(deadline), delta=delta)

    device_of = {node_of[d]: d for d in device_ids if d in node_of}
    reqs = [request(d, action == "activate" and bundle.content_hash not in coord.devices[node_of[d]].held)
            for d in device_of.values()]

    def on_reply(req: Request, rep: Reply) -> Request | None:
        device_id = device_of[req.node_id]
        if rep.ok and is_sha256_hex(rep.payload.get("active")):
            active[device_id] = rep.payload["active"]
            if active[device_id] == bundle.content_hash:
                coord.devices[req.node_id].held.add(bundle.content_hash)
                return None
        elif not rep.ok and rep.code == Code.BUNDLE_MISSING and not req.pushed:
            return request(device_id, True)
        elif not rep.ok and rep.code not in Code.NAMES:
            active[device_id] = UNKNOWN
        elif not rep.ok and rep.code in Code.DELTA_FALLBACK and req.delta:  # refused the delta: the bundle
            return request(device_id, True, full=True)
        coord.emit("switch_error", device=device_id, action=action,
                   reason=cut_reason(rep.reason or "unexpected reply"))
        return None

    missing = exchange(coord.t, reqs, deadline, coord.cfg.poll_interval, on_reply, lambda: None,
                       coord.cfg.max_in_flight)
    active.update((device_of[req.node_id], UNKNOWN) for req in missing)
    return active


@dataclass(frozen=True)
class RolloutOutcome:
    decisions: dict[str, Decision]  # device class -> its decision
    active: dict[str, str]  # device id -> the version it reported running last (A where it never switched,
    # UNKNOWN where its last switch went unanswered)

    def running(self) -> dict[str, list[str]]:
        """Content hash -> the device ids that run it."""
        out: dict[str, list[str]] = {}
        for device_id, version in sorted(self.active.items()):
            out.setdefault(version, []).append(device_id)
        return out


def rollout(coord: Coordinator, a: BundleRef, b: BundleRef, number: int, fraction: float,
            rule: DecisionRule) -> RolloutOutcome:
    """Canary B on each class, A/B on the canaries (rounds ``number`` ab:A / ab:B), then promote or roll back;
    what each device runs after it is what its last reply said (a device that refused to switch keeps its
    version; one whose switch went unanswered is :data:`UNKNOWN`). A rollback reverts every canary not known
    to run A: a revert is idempotent, and one that activated late must not keep the rejected B."""
    groups = canaries(coord, number, fraction)
    active = {v.device_id: a.content_hash for v in coord.devices.values()}
    active.update(switch(coord, [d for devs in groups.values() for d in devs], b, "activate", base=a))
    switched = sorted(d for d, h in active.items() if h == b.content_hash)
    ra = coord.evaluate_round(a, number, "ab:A", switched)
    rb = coord.evaluate_round(b, number, "ab:B", [r["device_id"] for r in coord.store.requests(ra.round_id)])
    comparison = compare(ra.reports, rb.reports)
    if not any(c["number"] == number for c in coord.store.comparisons(coord.run_id)):
        coord.store.add_comparison(coord.run_id, number, a.label, b.label, comparison)
    coord.emit("ab", a=a.label, b=b.label, comparison=comparison)
    sizes: dict[str, list[str]] = {}
    for v in coord.devices.values():
        sizes.setdefault(v.profile, []).append(v.device_id)
    decisions = {}
    for cls, canary in groups.items():
        c: Mapping = comparison.get(cls, {})
        d = decide(cls, int(c.get("devices", 0)), c.get("diff"), c.get("se"), rule)
        coord.store.add_rollout(coord.run_id, cls, a.label, b.label, len(canary), d.devices, len(sizes.get(cls, [])),
                                d.diff, d.se, d.bound, rule.alpha, rule.margin, d.decision, d.reason)
        if d.decision == PROMOTE:
            rest = [x for x in sorted(sizes.get(cls, [])) if x not in set(canary)]
            active.update(switch(coord, rest, b, "activate", base=a))
            moved, target = sizes.get(cls, []), b.content_hash
        else:
            moved, target = [x for x in canary if active.get(x) != a.content_hash], a.content_hash
            active.update(switch(coord, moved, a, "revert"))
        applied = sum(active.get(x) == target for x in moved)
        unknown = sum(active.get(x) == UNKNOWN for x in sizes.get(cls, []))
        coord.store.set_rollout_applied(coord.run_id, cls, applied, unknown)
        coord.emit("rollout", device_class=cls, decision=d, applied=applied, unknown=unknown)
        decisions[cls] = d
    return RolloutOutcome(decisions, active)
