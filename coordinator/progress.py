"""The coordinator's events as one-line progress messages.

In deployment the ServerApp writes them through Flower's logger, which Flower streams to
``flwr run --stream``: the inventory, each round's start (devices sampled, bundle pushes), each
reply as it arrives (for rounds of up to :data:`EACH_REPLY_UP_TO` devices; larger rounds show a
count), a line at least every few seconds while a stage waits, each round's end, and the A/B verdict.

Device ids, classes and failure reasons are whatever a device sent: every string of an event is made
printable (:func:`printable_event`) before it is formatted, so no escape sequence or line break a
device chose reaches the terminal or the log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from logging import INFO
from typing import Any

from flwr.common import log

from ..compiler.printable import printable

from .aggregate import OVERALL

EACH_REPLY_UP_TO = 100  # larger rounds show periodic counts instead of a line per reply
SIGNIFICANT_SE = 2.0  # an A/B difference beyond this many standard errors names a winner


def verdict(diff: float, se: float) -> str:
    if se > 0 and abs(diff) > SIGNIFICANT_SE * se:
        return "B better" if diff > 0 else "A better"
    return f"no clear difference (within {SIGNIFICANT_SE:g} s.e.)"


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def _run_start(kw: Mapping[str, Any]) -> str:
    ab = f", then A/B against {kw['model_b']}" if kw.get("model_b") else ""
    again = f" (resumed, take-over {kw['resumed']})" if kw.get("resumed") else ""
    return f"cuvil run {kw['run_id']}{again}: {kw['rounds']} evaluation round(s) of {kw['model']}{ab}; results in {kw['db']}"


def _round_start(kw: Mapping[str, Any]) -> str:
    before = f", {kw['resumed']} answered before the restart" if kw.get("resumed") else ""
    return (f"round {kw['number']} [{kw['round_kind']}] {kw['model']}: {kw['sampled']} devices sampled, "
            f"bundle pushed to {kw['push']}{before}")


def _reply(kw: Mapping[str, Any]) -> str | None:
    if kw["of"] > EACH_REPLY_UP_TO:
        return None
    what = "reported" if kw["ok"] else f"{kw['failure']}: {kw['reason']}"
    return f"  round {kw['number']}: {kw['device']} {what} ({kw['done']}/{kw['of']})"


def _progress(kw: Mapping[str, Any]) -> str:
    left = f", {kw['left_s']:.0f} s left" if "left_s" in kw else ""
    return f"  {kw['stage']}: {kw['done']}/{kw['of']} {kw.get('what', 'answered')}{left}"


def _round_end(kw: Mapping[str, Any]) -> str:
    o = kw["outcome"]
    agg = o.aggregates.get(OVERALL)
    acc = (f"; accuracy {agg.accuracy:.3f} ± {agg.accuracy_se:.3f}"
           if agg is not None and agg.accuracy is not None and agg.accuracy_se is not None else "")
    return (f"round {o.number} [{o.kind}] done in {o.seconds:.1f} s: {len(o.reports)} reports, "
            f"failures {_counts(o.failure_counts())}{acc}")


def _ab(kw: Mapping[str, Any]) -> str:
    lines = [f"A/B: A = {kw['a']}, B = {kw['b']} (paired: devices that reported both)"]
    for cls, v in kw["comparison"].items():
        lines.append(f"  {cls}: {v['devices']} devices, A {v['a']:.3f}, B {v['b']:.3f}, "
                     f"B - A {v['diff']:+.3f} ± {v['se']:.3f}: {verdict(v['diff'], v['se'])}")
    if not kw["comparison"]:
        lines.append("  no device reported both versions: no verdict")
    return "\n".join(lines)


def rollout_line(kw: Mapping[str, Any]) -> str:
    """A class's rollout decision, how many devices switched and how many run a version nobody knows."""
    d = kw["decision"]
    unknown = f"; {kw['unknown']} not known (a switch went unanswered)" if kw.get("unknown") else ""
    return (f"rollout {kw['device_class']}: {d.decision} ({printable(d.reason)}); "
            f"{kw['applied']} devices switched{unknown}")


def wire_line(kw: Mapping[str, Any]) -> str | None:
    """Versions pushed: how many went as signed deltas, and their bytes against the full bundles'."""
    if not kw["deltas"] and not kw["full"]:
        return None
    ratio = f" ({kw['delta'] / kw['replaced']:.2f}x)" if kw["replaced"] else ""
    larger = f" ({kw['not_smaller']} to devices holding a parent: the delta was not smaller)" if kw["not_smaller"] else ""
    return (f"pushed versions: {kw['deltas']} as signed deltas, {kw['delta']} bytes in place of {kw['replaced']} "
            f"bytes of full bundles{ratio}; {kw['full']} bytes of bundles sent whole{larger}")


FORMATS: dict[str, Callable[[Mapping[str, Any]], str | None]] = {
    "run_start": _run_start,
    "aborted_runs": lambda kw: f"marked run(s) {', '.join(map(str, kw['runs']))} aborted: their coordinator is gone",
    "simulation_start": lambda kw: (f"starting Flower's simulation engine (Ray): {kw['devices']} devices, "
                                    f"{kw['workers']} workers"),
    "waiting_nodes": lambda kw: f"waiting for SuperNodes: {kw['connected']}/{kw['wanted']} connected",
    "inventory": lambda kw: (f"inventory: {kw['devices']} devices ({_counts(kw['classes'])}), "
                             f"{kw['silent']} silent"),
    "inventory_error": lambda kw: f"inventory: node {kw['node_id']} failed: {kw['reason']}",
    "skipped_update": lambda kw: (f"round {kw['round']} [train]: stored update of {kw['device']} left out of "
                                  f"FedAvg: {kw['reason']}"),
    "round_start": _round_start,
    "reply": _reply,
    "progress": _progress,
    "round_end": _round_end,
    "ab": _ab,
    "rollout": rollout_line,
    "unknown_versions": lambda kw: (f"{kw['devices']} device(s) left out of the evaluation of what runs: their "
                                    "version is unknown (a switch went unanswered) or neither A nor B"),
    "heartbeat_skipped": lambda kw: f"heartbeat not written ({kw['reason']}): retried at the next beat",
    "wire": lambda kw: wire_line(kw),
    "run_end": lambda kw: f"cuvil run {kw['run_id']} {kw['status']}" + (f": {kw['reason']}" if kw.get("reason") else ""),
}


class ProgressLog:
    """An event callback that writes each event's line (Flower's logger unless ``write`` is given)."""

    def __init__(self, write: Callable[[str], None] | None = None):
        self.write = write or _flower_info

    def __call__(self, event: str, **kw: Any) -> None:
        fmt = FORMATS.get(event)
        line = fmt(printable_event(kw)) if fmt else None
        if line:
            for part in line.split("\n"):
                self.write(part)


def printable_event(kw: Mapping[str, Any]) -> dict[str, Any]:
    """An event's fields with every string (keys of mappings included) made printable."""
    return {k: _printable(v) for k, v in kw.items()}


def _printable(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, Mapping):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_printable(v) for v in value]
    return value


def _flower_info(line: str) -> None:
    log(INFO, "%s", line)
