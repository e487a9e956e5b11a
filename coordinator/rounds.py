"""The coordinator's main loop over an abstract transport (Flower's Grid in production; no Flower here).

Inventory (``query.device_info``), per-class sampling with explicit timeouts (a device that is gone
is a ``timeout``, never a wait), the bundle pushed only to devices that do not hold it (by content
hash), evaluation and A/B rounds, every reply classified (report, failure, timeout, refused, budget
exhausted) and written to the results store as it arrives.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .aggregate import OVERALL, ClassAggregate, aggregate_round
from .config import RunConfig
from .messages import Code, classify
from .schema import check_report
from .store import DeviceRecord, ResultsStore


# transport ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    node_id: int
    kind: str  # "info" or "evaluate"
    config: Mapping[str, Any] = field(default_factory=dict)
    bundle: bytes | None = None
    ttl: float = 60.0


@dataclass(frozen=True)
class Reply:
    handle: str
    ok: bool
    payload: Mapping[str, Any] = field(default_factory=dict)
    code: int = 0
    reason: str = ""


class Transport(Protocol):
    def node_ids(self) -> list[int]: ...
    def send(self, requests: Sequence[Request]) -> list[str | None]: ...
    def poll(self, handles: Collection[str]) -> list[Reply]: ...


# results -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BundleRef:
    name: str
    version: str
    content_hash: str
    data: bytes

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"

    @classmethod
    def from_bytes(cls, data: bytes) -> BundleRef:
        """Parse the manifest for its name, version and hash (devices verify the signature themselves)."""
        from ..compiler.bundle.reader import read_bundle

        b = read_bundle(bytes(data), (), require_trust=False)
        return cls(b.manifest.name, b.manifest.version, b.content_hash, bytes(data))

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> BundleRef:
        return cls.from_bytes(Path(path).read_bytes())


@dataclass
class DeviceView:
    node_id: int
    device_id: str
    profile: str
    emulated: bool
    held: set[str]
    info: Mapping[str, Any]


@dataclass
class RoundOutcome:
    round_id: int
    number: int
    kind: str
    bundle: str
    sampled: int
    bundle_bytes_sent: int
    reports: list[dict[str, Any]]
    failures: list[dict[str, Any]]
    seconds: float
    aggregates: dict[str, ClassAggregate]

    def failure_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.failures:
            out[f["kind"]] = out.get(f["kind"], 0) + 1
        return out


Event = Callable[..., None]


class Coordinator:
    def __init__(self, transport: Transport, store: ResultsStore, run_id: int,
                 config: RunConfig = RunConfig(), on_event: Event | None = None,
                 run_tag: str | None = None):
        self.t, self.store, self.run_id, self.cfg = transport, store, run_id, config
        self.emit: Event = on_event or (lambda *a, **k: None)
        self.run_tag = run_tag or uuid.uuid4().hex[:12]
        self.devices: dict[int, DeviceView] = {}

    # inventory -------------------------------------------------------------------------------------
    def wait_for_nodes(self) -> list[int]:
        deadline = time.monotonic() + self.cfg.node_wait
        while True:
            nodes = sorted(self.t.node_ids())
            if len(nodes) >= self.cfg.min_nodes or time.monotonic() >= deadline:
                return nodes
            time.sleep(min(1.0, self.cfg.poll_interval * 5))

    def inventory(self, nodes: Sequence[int] | None = None) -> dict[int, DeviceView]:
        """Ask every (new) node for its device info; nodes that do not answer in time are left out."""
        nodes = [n for n in (self.wait_for_nodes() if nodes is None else nodes) if n not in self.devices]
        reqs = [Request(n, "info", ttl=self.cfg.inventory_timeout) for n in nodes]
        got, missing = self._exchange(reqs, self.cfg.inventory_timeout)
        for req, rep in got:
            if not rep.ok:
                self.emit("inventory_error", node_id=req.node_id, reason=rep.reason)
                continue
            p = rep.payload
            try:
                view = DeviceView(req.node_id, str(p["device_id"]), str(p["profile"]), bool(p["emulated"]),
                                  set(p.get("held_bundles", [])), dict(p))
            except (KeyError, TypeError, ValueError) as e:
                self.emit("inventory_error", node_id=req.node_id, reason=f"bad device info: {e}")
                continue
            self.devices[req.node_id] = view
            self.store.upsert_device(DeviceRecord(view.device_id, view.profile, str(p.get("cpu", "")),
                                                  str(p.get("features", "")), str(p.get("runtime_version", "")),
                                                  view.emulated))
        self.emit("inventory", devices=len(self.devices), silent=len(missing))
        return self.devices

    def refresh(self) -> None:
        """Pick up nodes that joined since the last inventory; forget nodes that left."""
        online = set(self.t.node_ids())
        for gone in set(self.devices) - online:
            del self.devices[gone]
        new = sorted(online - set(self.devices))
        if new:
            self.inventory(new)

    # sampling --------------------------------------------------------------------------------------
    def sample(self, number: int) -> list[int]:
        """Per device class, up to ``sample_per_class`` devices (all when 0), never one whose budget is spent."""
        exhausted = self.store.exhausted_devices(self.cfg.dataset)
        by_class: dict[str, list[int]] = {}
        for node, view in sorted(self.devices.items()):
            if view.device_id not in exhausted:
                by_class.setdefault(view.profile, []).append(node)
        gen = np.random.default_rng([self.cfg.seed, number])
        picked: list[int] = []
        for _, nodes in sorted(by_class.items()):
            k = len(nodes) if self.cfg.sample_per_class <= 0 else min(self.cfg.sample_per_class, len(nodes))
            # Flower node ids are uint64: choose indices, never pass the ids through numpy
            picked += [nodes[int(i)] for i in gen.choice(len(nodes), size=k, replace=False)]
        return sorted(picked)

    # rounds ----------------------------------------------------------------------------------------
    def evaluate_round(self, bundle: BundleRef, number: int, kind: str = "eval",
                       nodes: Sequence[int] | None = None) -> RoundOutcome:
        start = time.monotonic()
        nodes = self.sample(number) if nodes is None else list(nodes)
        round_id = self.store.start_round(self.run_id, number, kind, bundle.label, bundle.content_hash,
                                          self.cfg.dataset)
        config = {"bundle-hash": bundle.content_hash, "dataset": self.cfg.dataset,
                  "release-id": f"{self.run_tag}-r{number}-{kind}-{bundle.content_hash[:16]}",
                  "round": number, "latency-runs": self.cfg.latency_runs, "latency-warmup": self.cfg.latency_warmup,
                  "dp-sigma": self.cfg.dp_sigma, "dp-epsilon": self.cfg.dp_epsilon}
        reports, failures, sent = [], [], 0
        pending = {n: False for n in nodes}  # node -> bundle already force-pushed after BUNDLE_MISSING
        deadline = start + self.cfg.round_timeout
        self.emit("round_start", number=number, round_kind=kind, model=bundle.label, sampled=len(nodes),
                  push=sum(bundle.content_hash not in self.devices[n].held for n in nodes))
        while pending and time.monotonic() < deadline:
            reqs = []
            for node, forced in pending.items():
                push = forced or bundle.content_hash not in self.devices[node].held
                reqs.append(Request(node, "evaluate", config, bundle.data if push else None,
                                    ttl=max(1.0, deadline - time.monotonic())))
                sent += len(bundle.data) if push else 0
            got, missing = self._exchange(reqs, deadline - time.monotonic())
            retry: dict[int, bool] = {}
            for req, rep in got:
                view = self.devices[req.node_id]
                if rep.ok:
                    try:
                        metrics = check_report(rep.payload)
                    except (ValueError, TypeError, KeyError) as e:
                        failures.append(self._fail(round_id, view, "failure", f"bad report: {e}"))
                        continue
                    view.held.add(bundle.content_hash)
                    self.store.add_report(round_id, view.device_id, view.profile, view.emulated, metrics)
                    reports.append({"device_id": view.device_id, "profile": view.profile,
                                    "emulated": view.emulated, "metrics": metrics})
                    self.emit("reply", number=number, device=view.device_id, ok=True, done=len(reports) + len(failures),
                              of=len(nodes))
                elif rep.code == Code.BUNDLE_MISSING and not req.bundle:
                    view.held.discard(bundle.content_hash)
                    retry[req.node_id] = True
                else:
                    failures.append(self._fail(round_id, view, classify(rep.code), rep.reason))
                    self.emit("reply", number=number, device=view.device_id, ok=False, failure=failures[-1]["kind"],
                              done=len(reports) + len(failures), of=len(nodes))
            pending = {n: True for n in retry}
            for req in missing:
                failures.append(self._fail(round_id, self.devices[req.node_id], "timeout",
                                           f"no reply within {self.cfg.round_timeout:.0f} s"))
        for node in pending:
            failures.append(self._fail(round_id, self.devices[node], "timeout", "round deadline passed before a retry"))
        self.store.finish_round(round_id, len(nodes), sent)
        aggs = aggregate_round(reports, failures, {v.device_id: v.profile for v in self.devices.values()})
        out = RoundOutcome(round_id, number, kind, bundle.label, len(nodes), sent, reports, failures,
                           time.monotonic() - start, aggs)
        self.emit("round_end", outcome=out)
        return out

    def ab_round(self, a: BundleRef, b: BundleRef, number: int) -> tuple[RoundOutcome, RoundOutcome, dict[str, dict]]:
        """Both versions on the same sampled devices; the comparison uses devices that reported both."""
        nodes = self.sample(number)
        ra = self.evaluate_round(a, number, "ab:A", nodes)
        rb = self.evaluate_round(b, number, "ab:B", nodes)
        return ra, rb, compare(ra.reports, rb.reports)

    def _fail(self, round_id: int, view: DeviceView, kind: str, reason: str) -> dict[str, Any]:
        self.store.add_failure(round_id, view.device_id, kind, reason)
        return {"device_id": view.device_id, "profile": view.profile, "kind": kind, "reason": reason}

    def _exchange(self, reqs: Sequence[Request], timeout: float) -> tuple[list[tuple[Request, Reply]], list[Request]]:
        """Send, then poll until every request has a reply or ``timeout`` passes (never longer)."""
        if not reqs:
            return [], []
        deadline = time.monotonic() + max(0.0, timeout)
        handles = self.t.send(reqs)
        by_handle = {h: r for h, r in zip(handles, reqs) if h is not None}
        got = [(r, Reply("", False, code=Code.DEVICE_ERROR, reason="the message could not be pushed"))
               for h, r in zip(handles, reqs) if h is None]
        while by_handle and time.monotonic() < deadline:
            for rep in self.t.poll(list(by_handle)):
                req = by_handle.pop(rep.handle, None)
                if req is not None:
                    got.append((req, rep))
            if by_handle:
                time.sleep(min(self.cfg.poll_interval, max(0.0, deadline - time.monotonic())))
        return got, list(by_handle.values())


def compare(reports_a: Sequence[Mapping[str, Any]], reports_b: Sequence[Mapping[str, Any]]) -> dict[str, dict]:
    """Paired A/B per class (and overall): accuracy of each on the devices that reported both, and B - A."""
    b_by = {r["device_id"]: r for r in reports_b}
    pairs = [(r, b_by[r["device_id"]]) for r in reports_a if r["device_id"] in b_by]
    out = {}
    for cls in sorted({p[0]["profile"] for p in pairs}) + [OVERALL]:
        sel = [p for p in pairs if cls == OVERALL or p[0]["profile"] == cls]
        aa = aggregate_round([p[0] for p in sel], []).get(OVERALL)
        ab = aggregate_round([p[1] for p in sel], []).get(OVERALL)
        if not sel or aa is None or ab is None or aa.accuracy is None or ab.accuracy is None:
            continue
        out[cls] = {"devices": len(sel), "a": aa.accuracy, "b": ab.accuracy, "diff": ab.accuracy - aa.accuracy,
                    "se": math.hypot(aa.accuracy_se or 0.0, ab.accuracy_se or 0.0)}
    return out
