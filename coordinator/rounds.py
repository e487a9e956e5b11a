"""The coordinator's rounds over an abstract transport (Flower's Grid in production; no Flower here).

Inventory (``query.device_info``), per-class sampling with explicit timeouts (a device that is gone
is a ``timeout``, never a wait), the bundle pushed only to devices that do not hold it (by content
hash), evaluation and A/B rounds. Every reply is classified (report, failure, timeout, refused,
budget exhausted) and committed to the results store the moment it arrives.

Release-ids are deterministic per (run, round, device): a round that a crash interrupted is resumed
by asking the devices that had not answered for the *same* release-ids, and a device answers a
repeated release-id from its stored noisy reply without spending budget again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .aggregate import ClassAggregate, aggregate_round, compare
from .config import RunConfig
from .deltas import DeltaBook
from .device_info import DeviceInfoError, DeviceView, read_info
from .device_text import cut_reason
from .exchange import Reply, Request, Transport, exchange, ttl_until
from .messages import Code, classify
from .schema import ReportBounds, check_report
from ..edge_runtime.report import ReportError
from .update_check import UpdateBounds, check_update
from .store import ResultsStore, StoreError

HEARTBEAT_EVERY_S = 5.0  # the run's heartbeat in the store (how a restarted coordinator knows this one is alive)


@dataclass(frozen=True)
class BundleRef:
    name: str
    version: str
    content_hash: str
    data: bytes

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"

    def graph(self):
        """The bundle's graph (the coordinator's own bundle: parsed without a trust check, as for its name)."""
        from ..compiler.bundle.reader import read_bundle

        return read_bundle(self.data, (), require_trust=False).graph

    @classmethod
    def from_bytes(cls, data: bytes) -> BundleRef:
        """Parse the manifest for its name, version and hash (devices verify the signature themselves)."""
        from ..compiler.bundle.reader import read_bundle

        b = read_bundle(bytes(data), (), require_trust=False)
        return cls(b.manifest.name, b.manifest.version, b.content_hash, bytes(data))

    @classmethod
    def from_file(cls, path: str | Path) -> BundleRef:
        return cls.from_bytes(Path(path).expanduser().read_bytes())


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
    store_s: float = 0.0  # of ``seconds``, the time spent writing the results store

    def failure_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.failures:
            out[f["kind"]] = out.get(f["kind"], 0) + 1
        return out


Event = Callable[..., None]


class Coordinator:
    def __init__(self, transport: Transport, store: ResultsStore, run_id: int,
                 config: RunConfig = RunConfig(), on_event: Event | None = None, run_key: str | None = None,
                 progress_every_s: float = 3.0):
        """``progress_every_s``: a ``progress`` event this often while a stage waits (a line at least
        every 5 s, even when the process gets the CPU late)."""
        self.t, self.store, self.run_id, self.cfg = transport, store, run_id, config
        self.progress_every_s = progress_every_s
        self.emit: Event = on_event or (lambda *a, **k: None)
        self.run_key = run_key or uuid.uuid4().hex[:16]
        self.devices: dict[int, DeviceView] = {}
        self._graphs: dict[str, Any] = {}
        self.deltas = DeltaBook(config.signing_key)  # versions pushed as signed deltas where devices hold a parent
        self._beat = self._shown = time.monotonic()

    @property
    def node_of(self) -> dict[str, int]:
        return {v.device_id: n for n, v in self.devices.items()}

    def release_id(self, number: int, kind: str, device_id: str) -> str:
        """The same (run, round, device) always gets the same release-id (resume asks it again)."""
        return f"{self.run_key}-r{number}-{kind}-{device_id}"

    # inventory -------------------------------------------------------------------------------------
    def wait_for_nodes(self) -> list[int]:
        deadline = time.monotonic() + self.cfg.node_wait
        while True:
            nodes = sorted(self.t.node_ids())
            if len(nodes) >= self.cfg.min_nodes or time.monotonic() >= deadline:
                return nodes
            self._tick(lambda: self.emit("waiting_nodes", connected=len(nodes), wanted=self.cfg.min_nodes))
            time.sleep(min(1.0, self.cfg.poll_interval * 5))

    def inventory(self, nodes: Sequence[int] | None = None) -> dict[int, DeviceView]:
        """Ask every (new) node for its device info; nodes that do not answer in time are left out."""
        nodes = [n for n in (self.wait_for_nodes() if nodes is None else nodes) if n not in self.devices]
        keys = self.t.node_keys() if nodes else None
        answered, expired = [0], [0]  # expired: Flower answered that the message expired (silent, as if missing)
        node_of = self.node_of  # device id -> node id: one look-up per reply, not a pass over the fleet

        def on_reply(req: Request, rep: Reply) -> None:
            answered[0] += 1
            if not rep.ok:
                if classify(rep.code) == "timeout":
                    expired[0] += 1
                else:
                    self.emit("inventory_error", node_id=req.node_id, reason=cut_reason(rep.reason))
                return
            try:
                view, record = read_info(rep.payload, req.node_id, keys)
            except DeviceInfoError as e:
                self.emit("inventory_error", node_id=req.node_id, reason=cut_reason(f"bad device info: {e}"))
                return
            earlier = node_of.get(view.device_id)
            if earlier is not None and earlier != req.node_id:  # a SuperNode that came back under a new node id
                self.devices.pop(earlier, None)
            node_of[view.device_id] = req.node_id
            self.devices[req.node_id] = view
            self.store.upsert_device(record)

        deadline = time.monotonic() + self.cfg.inventory_timeout
        reqs = [Request(n, "info", ttl=ttl_until(deadline)) for n in nodes]
        wait = self._waiter(lambda: self.emit("progress", stage="inventory", done=answered[0], of=len(reqs)))
        missing = exchange(self.t, reqs, deadline, self.cfg.poll_interval, on_reply, wait, self.cfg.max_in_flight)
        classes: dict[str, int] = {}
        for v in self.devices.values():
            classes[v.profile] = classes.get(v.profile, 0) + 1
        self.emit("inventory", devices=len(self.devices), silent=len(missing) + expired[0], classes=classes)
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
    def sample(self, number: int) -> list[str]:
        """Device ids: per class up to ``sample-per-class`` (all when 0), never one whose budget is spent."""
        exhausted = self.store.exhausted_devices(self.cfg.dataset)
        by_class: dict[str, list[str]] = {}
        for view in sorted(self.devices.values(), key=lambda v: v.device_id):
            if view.device_id not in exhausted:
                by_class.setdefault(view.profile, []).append(view.device_id)
        gen = np.random.default_rng([self.cfg.seed, number])
        picked: list[str] = []
        for _, devs in sorted(by_class.items()):
            k = len(devs) if self.cfg.sample_per_class <= 0 else min(self.cfg.sample_per_class, len(devs))
            picked += [devs[int(i)] for i in gen.choice(len(devs), size=k, replace=False)]
        return sorted(picked)

    # rounds ----------------------------------------------------------------------------------------
    def evaluate_round(self, bundle: BundleRef, number: int, kind: str = "eval",
                       devices: Sequence[str] | None = None, message: str = "evaluate",
                       extra: Mapping[str, Any] | None = None) -> RoundOutcome:
        """Run round ``number`` (or finish it, if a crashed coordinator left it in flight, or return it as
        stored, if it finished); ``devices`` are the device ids to ask (default: :meth:`sample`).

        ``message``: ``"evaluate"``, or ``"train"`` (replies are updates, stored by :meth:`_accept_update`);
        ``extra``: config keys added to every request (a training round's DP-SGD parameters)."""
        start, written = time.monotonic(), self.store.write_s
        self.deltas.know(bundle)  # a parent for the versions that follow it
        row = self.store.find_round(self.run_id, number, kind)
        if row is not None and row["bundle_hash"] != bundle.content_hash:
            raise StoreError(f"round {number} [{kind}] of run {self.run_id} evaluated bundle {row['bundle_hash'][:12]}, "
                             f"not {bundle.content_hash[:12]}: the bundle file changed since the run started")
        if row is not None and row["finished_at"] is not None:
            return self._stored_outcome(row, message)
        if row is None:
            asked = sorted(self.sample(number) if devices is None else devices)
            node_of = self.node_of
            round_id = self.store.start_round(self.run_id, number, kind, bundle.label, bundle.content_hash,
                                              self.cfg.dataset, [(d, node_of.get(d, 0), self.release_id(number, kind, d))
                                                                 for d in asked])
        else:
            round_id = row["id"]
            asked = [r["device_id"] for r in self.store.requests(round_id)]
        profiles = {d["device_id"]: d["profile"] for d in self.store.devices()}
        reports = self._stored_replies(round_id, message)
        failures = [_failure_dict(f, profiles) for f in self.store.failures(round_id)]
        resumed = len(reports) + len(failures)
        answered = {r["device_id"] for r in reports} | {f["device_id"] for f in failures}
        node_of = self.node_of

        def shown(device_id: str, failure: str | None = None, reason: str = "") -> None:
            self.emit("reply", number=number, device=device_id, ok=failure is None, failure=failure, reason=reason,
                      done=len(reports) + len(failures), of=len(asked))

        def fail(device_id: str, kind_: str, reason: str) -> None:
            reason = cut_reason(reason)
            self.store.add_failure(round_id, device_id, kind_, reason)
            failures.append({"device_id": device_id, "profile": profiles.get(device_id, "unknown"),
                             "kind": kind_, "reason": reason})
            shown(device_id, kind_, reason)

        targets = [d for d in asked if d not in answered and d in node_of]
        base = {"bundle-hash": bundle.content_hash, "dataset": self.cfg.dataset, "round": number,
                "latency-runs": self.cfg.latency_runs, "latency-warmup": self.cfg.latency_warmup,
                "dp-sigma": self.cfg.dp_sigma, "dp-epsilon": self.cfg.dp_epsilon, **(extra or {})}
        bounds = ReportBounds(latency_runs=self.cfg.latency_runs, sigma=self.cfg.dp_sigma)
        deadline = time.monotonic() + self.cfg.round_timeout
        late = f"no reply within the round's {self.cfg.round_timeout:g} s"
        pushes = [d for d in targets if bundle.content_hash not in self.devices[node_of[d]].held]
        self.emit("round_start", number=number, round_kind=kind, model=bundle.label, sampled=len(asked),
                  push=len(pushes), resumed=resumed)
        for d in asked:
            if d not in answered and d not in node_of:
                fail(d, "timeout", "the device was not connected when the round started")
        device_of = {node_of[d]: d for d in targets}

        def requests(device_ids: Sequence[str], push: Callable[[str], bool], full: bool = False) -> list[Request]:
            """Messages for ``device_ids``, counted in the store (asks, bytes pushed) before they go out; a
            device that lacks the bundle gets it, or a delta from a version it holds (not when ``full``)."""
            out = []
            for d in device_ids:
                data, delta = self.deltas.payload(bundle, self.devices[node_of[d]].held, full) if push(d) else (None, None)
                out.append(Request(node_of[d], message, {**base, "release-id": self.release_id(number, kind, d)},
                                   data, ttl=ttl_until(deadline), delta=delta))
            self.store.add_requests(round_id, [(device_of[r.node_id], r.node_id, r.config["release-id"]) for r in out])
            pushed = sum(r.pushed for r in out)
            if pushed:
                self.store.add_bundle_bytes(round_id, pushed)
            return out

        def on_reply(req: Request, rep: Reply) -> Request | None:
            device_id = device_of[req.node_id]
            view = self.devices[req.node_id]
            failure = None if rep.ok else classify(rep.code)
            reason = late if failure == "timeout" else rep.reason
            if rep.ok and message == "train":
                failure, reason = self._accept_update(round_id, device_id, view, bundle, rep, reports,
                                                      UpdateBounds.of_request(base))
            elif rep.ok:
                try:
                    metrics = check_report(rep.payload, bounds).as_metrics()
                except ReportError as e:
                    failure, reason = "failure", f"bad report: {e}"
                else:
                    view.held.add(bundle.content_hash)
                    if self.store.add_report(round_id, device_id, view.profile, view.emulated, metrics):
                        reports.append({"device_id": device_id, "profile": view.profile, "emulated": view.emulated,
                                        "metrics": metrics})
            elif rep.code == Code.BUNDLE_MISSING and not req.pushed:
                view.held.discard(bundle.content_hash)
                return requests([device_id], lambda _: True)[0]
            elif rep.code in Code.DELTA_FALLBACK and req.delta:  # the device refused the delta: the bundle
                return requests([device_id], lambda _: True, full=True)[0]
            if failure is not None:
                fail(device_id, failure, reason)
            else:
                shown(device_id)
            return None

        wait = self._waiter(lambda: self.emit("progress", stage=f"round {number} [{kind}]",
                                              done=len(reports) + len(failures), of=len(asked),
                                              left_s=max(0.0, deadline - time.monotonic())))
        missing = exchange(self.t, requests(targets, set(pushes).__contains__), deadline, self.cfg.poll_interval,
                           on_reply, wait, self.cfg.max_in_flight)
        for req in missing:
            fail(device_of[req.node_id], "timeout", late)
        self.store.finish_round(round_id, len(asked), self._bytes_sent(round_id))
        self._predict_latency(bundle, {profiles[d] for d in asked if d in profiles})
        out = RoundOutcome(round_id, number, kind, bundle.label, len(asked), self._bytes_sent(round_id), reports,
                           failures, time.monotonic() - start,
                           aggregate_round(reports, failures, profiles) if message == "evaluate" else {},
                           self.store.write_s - written)
        self.emit("round_end", outcome=out)
        return out

    def ab_round(self, a: BundleRef, b: BundleRef, number: int) -> tuple[RoundOutcome, RoundOutcome, dict[str, dict]]:
        """Both versions on the same devices; the comparison (stored) uses devices that reported both."""
        ra = self.evaluate_round(a, number, "ab:A")
        rb = self.evaluate_round(b, number, "ab:B", [r["device_id"] for r in self.store.requests(ra.round_id)])
        comparison = compare(ra.reports, rb.reports)
        if not any(c["number"] == number for c in self.store.comparisons(self.run_id)):
            self.store.add_comparison(self.run_id, number, a.label, b.label, comparison)
        self.emit("ab", a=a.label, b=b.label, comparison=comparison)
        return ra, rb, comparison

    # helpers ---------------------------------------------------------------------------------------
    def _predict_latency(self, bundle: BundleRef, profiles: set[str]) -> None:
        """Store a predicted latency (cost model, never a measurement) per device class, once per bundle."""
        from ..compiler.errors import CuvilError
        from .latency_model import MODEL_VERSION, predict_graph

        done = {p["profile"] for p in self.store.latency_predictions(bundle.content_hash)
                if p["model_version"] == MODEL_VERSION}
        graph = None
        for profile in sorted(profiles - done):
            try:  # a prediction is an extra: whatever stops it never stops the round
                graph = graph or bundle.graph()
                ms, basis = predict_graph(graph, profile)
            except (CuvilError, OSError, RuntimeError, ValueError) as e:
                self.emit("prediction_error", profile=profile, reason=str(e))
                continue
            self.store.add_latency_prediction(bundle.content_hash, profile, MODEL_VERSION, ms, basis)

    def _stored_outcome(self, row: Mapping[str, Any], message: str = "evaluate") -> RoundOutcome:
        profiles = {d["device_id"]: d["profile"] for d in self.store.devices()}
        reports = self._stored_replies(row["id"], message)
        failures = [_failure_dict(f, profiles) for f in self.store.failures(row["id"])]
        return RoundOutcome(row["id"], row["number"], row["kind"], row["model"], row["sampled"],
                            row["bundle_bytes_sent"], reports, failures, row["finished_at"] - row["started_at"],
                            aggregate_round(reports, failures, profiles) if message == "evaluate" else {})

    def _graph(self, bundle: BundleRef):
        """The bundle's graph, parsed once per bundle (a training round checks every update against it)."""
        if self._graphs.get(bundle.content_hash) is None:
            self._graphs = {bundle.content_hash: bundle.graph()}
        return self._graphs[bundle.content_hash]

    def _stored_replies(self, round_id: int, message: str) -> list[dict[str, Any]]:
        if message == "train":
            return [_update_dict(u) for u in self.store.updates(round_id)]
        return [_report_dict(r) for r in self.store.reports(round_id)]

    def _accept_update(self, round_id: int, device_id: str, view: DeviceView, bundle: BundleRef, rep: Reply,
                       updates: list[dict[str, Any]], bounds: UpdateBounds) -> tuple[str | None, str]:
        """Store a training reply (the update, its noisy count and the device's ε); (failure kind, reason).
        Its arrays are decoded here, the one place a reply's update is read, and checked before anything is kept."""
        try:
            arrays = rep.update()
            metrics = check_update(rep.payload, arrays, self._graph(bundle), bounds)
        except (ValueError, TypeError, KeyError) as e:
            return "failure", f"bad update: {e}"
        view.held.add(bundle.content_hash)
        if self.store.add_update(round_id, device_id, view.profile, metrics["dp_count"], metrics["dp_epsilon_spent"],
                                 metrics, arrays):
            updates.append({"device_id": device_id, "profile": view.profile, "metrics": metrics})
        return None, ""

    def _bytes_sent(self, round_id: int) -> int:
        return int(self.store.round(round_id)["bundle_bytes_sent"])

    def _tick(self, show: Callable[[], None]) -> None:
        """Heartbeat the run and show progress, each at most every few seconds; a beat that cannot be written
        now (another process holds the lock) is a line, and the next tries again: a hint, never worth a run."""
        now = time.monotonic()
        if now - self._beat >= HEARTBEAT_EVERY_S:
            self._beat = now
            try:
                self.store.heartbeat(self.run_id)
            except StoreError as e:
                self.emit("heartbeat_skipped", reason=cut_reason(str(e)))
        if now - self._shown >= self.progress_every_s:
            show()
            self._shown = now

    def _waiter(self, show: Callable[[], None]) -> Callable[[], None]:
        return lambda: self._tick(show)


def _report_dict(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"device_id": row["device_id"], "profile": row["profile"], "emulated": bool(row["emulated"]),
            "metrics": row["metrics"]}


def _update_dict(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"device_id": row["device_id"], "profile": row["profile"], "metrics": row["metrics"]}


def _failure_dict(row: Mapping[str, Any], profiles: Mapping[str, str]) -> dict[str, Any]:
    return {"device_id": row["device_id"], "profile": profiles.get(row["device_id"], "unknown"), "kind": row["kind"],
            "reason": row["reason"]}
