"""Read-only views of a run's fine-tuned versions and rollout decisions, shared by text, JSON and HTML."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..compiler.errors import CuvilError
from .store import ResultsStore

ROLLOUT_HEADERS = ("class", "A", "B", "canaries", "reported both", "class devices", "B - A", "upper bound",
                   "decision", "devices switched", "version unknown", "reason")
VERSION_HEADERS = ("version", "content hash", "parent", "rounds", "devices", "largest ε", "δ", "method", "file")


def rollout_rows(store: ResultsStore, run_id: int) -> list[list[str]]:
    return [[r["device_class"], r["model_a"], r["model_b"], str(r["canaries"]), str(r["reported"]),
             str(r["class_devices"]), "-" if r["diff"] is None else f"{r['diff']:+.3f} ± {r['se']:.3f}",
             "-" if r["bound"] is None else f"{r['bound']:+.3f}", r["decision"], str(r["applied"]), str(r["unknown"]),
             r["reason"]]
            for r in store.rollouts(run_id)]


def version_rows(store: ResultsStore, run_id: int) -> list[list[str]]:
    """Versions this run made (intermediate rounds' weights included)."""
    return [[f"{v['name']}@{v['version']}", v["content_hash"][:12], (v["parent"] or "-")[:12], str(v["rounds"]),
             str(v["devices"]), "-" if v["epsilon"] is None else f"{v['epsilon']:.3f}",
             "-" if v["delta"] is None else f"{v['delta']:g}", v["method"], v["path"] or "-"]
            for v in store.versions() if v["run_id"] == run_id]


def as_records(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[dict[str, str]]:
    return [dict(zip(headers, r)) for r in rows]


class NothingEvaluated(CuvilError):
    """No device of a rollout reported an evaluation: its rollbacks rest on nothing, so it did not succeed."""


def nothing_evaluated(store: ResultsStore, run_id: int) -> str | None:
    """Why no device reported an evaluation in any round of the run (its failures by kind, each with its
    commonest reason), or None where one did: a fleet that refused every bundle looked like a rollback,
    and a run with nothing evaluated like any finished run."""
    rounds = store.rounds(run_id)
    if any(store.reports(r["id"]) for r in rounds):
        return None
    devices: dict[str, set[str]] = {}
    reasons: dict[str, Counter[str]] = {}
    for r in rounds:
        for f in store.failures(r["id"]):
            devices.setdefault(f["kind"], set()).add(f["device_id"])
            reasons.setdefault(f["kind"], Counter())[f["reason"]] += 1
    why = "; ".join(f"{len(devices[kind])} device{'s' if len(devices[kind]) != 1 else ''} {kind} "
                    f"({reasons[kind].most_common(1)[0][0]})" for kind in sorted(devices))
    return f"no device reported an evaluation: {why or 'none answered'}"
