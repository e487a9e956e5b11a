"""One federated evaluation run, from its start (or its resumption after a crash) to its end status.

A run is ``running`` while a coordinator drives it, then ``finished``, or ``aborted`` (the coordinator
raised, or a signal stopped it: the reason says which; or it was killed: a coordinator that starts marks
every running run whose owner is gone).
``resume-run = N`` takes run N over: finished rounds are kept, the round in flight asks the devices
that had not answered for the same release-ids, and the remaining rounds run as planned.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from .config import RunConfig, RunConfigError
from .device_text import cut_reason
from .exchange import Transport
from .fine_tuning import fine_tune
from .rollout import rollout
from .rollout_view import nothing_evaluated
from .rounds import BundleRef, Coordinator, Event
from .stop_signals import StopSignals
from .store import ResultsStore, StoreError


def drive_run(transport: Transport, cfg: RunConfig, on_event: Event | None = None) -> int:
    """Inventory, ``num-rounds`` evaluation rounds, ``train-rounds`` fine-tuning rounds (the candidate is
    their signed result, else ``bundle-b``), then for a candidate an A/B round, or with ``rollout`` a
    canary rollout and an evaluation of what each device runs; the run id."""
    emit: Event = on_event or (lambda *a, **k: None)
    if not cfg.resume_run:
        bundle, bundle_b = _bundles(cfg)  # a bad path fails before any run is recorded
    store = ResultsStore(cfg.db_file)
    run_id = None
    stops = StopSignals()  # which signal stopped it: Flower's exit on one is a bare SystemExit(0)
    try:
        if cfg.resume_run:
            row = store.take_over_run(cfg.resume_run)
            run_id, run_key, resumed = row["id"], row["run_key"], row["resumed"] + 1
            if not run_key:
                raise StoreError(f"run {run_id} was recorded before runs could be resumed")
            cfg = cfg.resumed_from(row["config"])
            bundle, bundle_b = _bundles(cfg)
        else:
            run_key, resumed = uuid.uuid4().hex[:16], 0
            run_id = store.start_run(cfg.as_run_config(), run_key)
        aborted = store.mark_aborted()
        if aborted:
            emit("aborted_runs", runs=aborted)
        emit("run_start", run_id=run_id, resumed=resumed, rounds=cfg.num_rounds, model=bundle.label,
             model_b=bundle_b.label if bundle_b else "", db=str(cfg.db_file))
        coord = Coordinator(transport, store, run_id, cfg, on_event, run_key)
        coord.inventory()
        for number in range(1, cfg.num_rounds + 1):
            coord.refresh()
            coord.evaluate_round(bundle, number)
        number = cfg.num_rounds + 1
        if cfg.train_rounds:
            bundle_b = fine_tune(coord, bundle, number, cfg.train_rounds, cfg.dp_sgd, cfg.signing_key,
                                 Path(cfg.bundle).expanduser().parent)
            number += cfg.train_rounds
        if bundle_b is not None and cfg.rollout:
            coord.refresh()
            running = rollout(coord, bundle, bundle_b, number, cfg.canary_fraction, cfg.rule).running()
            for i, version in enumerate((bundle, bundle_b)):  # what each device said it runs, evaluated
                if running.get(version.content_hash):
                    coord.evaluate_round(version, number + 1 + i, "active", running[version.content_hash])
            other = sum(len(d) for h, d in running.items() if h not in (bundle.content_hash, bundle_b.content_hash))
            if other:
                emit("unknown_versions", devices=other)
        elif bundle_b is not None:
            coord.refresh()
            coord.ab_round(bundle, bundle_b, number)
        w = coord.deltas.wire
        emit("wire", full=w.full, delta=w.delta, replaced=w.replaced, deltas=w.deltas, not_smaller=w.not_smaller)
        nothing = nothing_evaluated(store, run_id)  # still finished, but not silently: the end line says why
        store.finish_run(run_id, reason=nothing or "")
        emit("run_end", run_id=run_id, status="finished", reason=nothing)
        return run_id
    except BaseException as e:
        if run_id is not None:
            reason = cut_reason(stops.reason(e))
            store.finish_run(run_id, "aborted", reason)
            emit("run_end", run_id=run_id, status="aborted", reason=reason)
        raise
    finally:
        stops.restore()
        store.close()


def _bundles(cfg: RunConfig) -> tuple[BundleRef, BundleRef | None]:
    if not cfg.bundle:
        raise RunConfigError("run config 'bundle' must name the .cuvil bundle to evaluate")
    return BundleRef.from_file(cfg.bundle), BundleRef.from_file(cfg.bundle_b) if cfg.bundle_b else None
