"""A run from start to end status, and its resumption after the coordinator dies mid-round."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from cuvil.coordinator.config import RunConfig
from cuvil.coordinator.progress import ProgressLog
from cuvil.coordinator.rounds import BundleRef
from cuvil.coordinator.runs import drive_run
from cuvil.coordinator.store import ResultsStore, StoreError

from .fakes import DyingTransport, FakeTransport, Killed, make_fleet
from .fleet_helpers import make_bundle, make_keys


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
    keys = make_keys(root)
    a, b = make_bundle(root, keys), make_bundle(root, keys, version="2", seed=1, epochs=1)
    return a, b, BundleRef.from_file(a).content_hash


def _cfg(tmp_path, bundles, **kw) -> RunConfig:
    knobs = {"round_timeout": 2.0, "inventory_timeout": 1.0, "poll_interval": 0.01, "node_wait": 0.1, **kw}
    return RunConfig(db_path=str(tmp_path / "r.db"), bundle=str(bundles[0]), **knobs)


def test_a_run_ends_finished_with_its_ab_verdict_stored_and_shown(tmp_path, bundles):
    lines: list[str] = []
    devs = make_fleet()
    cfg = _cfg(tmp_path, bundles, bundle_b=str(bundles[1]), num_rounds=1)
    run_id = drive_run(FakeTransport(devs, bundles[2]), cfg, ProgressLog(lines.append))
    store = ResultsStore(cfg.db_file)
    (run,) = store.runs()
    assert run["id"] == run_id and run["status"] == "finished" and run["finished_at"] and run["run_key"]
    assert [(r["number"], r["kind"], r["sampled"]) for r in store.rounds(run_id)] == [
        (1, "eval", 6), (2, "ab:A", 6), (2, "ab:B", 6)]
    cmp = {c["device_class"]: c for c in store.comparisons(run_id)}
    assert cmp["all"]["devices"] == 6 and cmp["all"]["diff"] < 0  # B is the under-trained one
    text = "\n".join(lines)
    assert "inventory: 6 devices (orin 1, rpi5 2, x86 3), 0 silent" in text
    assert "round 1 [eval] digits-mlp@1: 6 devices sampled, bundle pushed to 6" in text
    assert "  round 1: d3 reported" in text and "(6/6)" in text
    assert "round 2 [ab:B] digits-mlp@2: 6 devices sampled, bundle pushed to 6" in text
    assert "A better" in next(line for line in lines if line.startswith("  all: 6 devices"))
    assert lines[-1] == f"cuvil run {run_id} finished"


def test_a_run_that_no_device_evaluated_ends_finished_saying_why(tmp_path, bundles):
    lines: list[str] = []
    cfg = _cfg(tmp_path, bundles, num_rounds=1)
    devs = make_fleet(**{f"d{i}": "refuse" for i in range(6)})
    run_id = drive_run(FakeTransport(devs, bundles[2]), cfg, ProgressLog(lines.append))
    (run,) = ResultsStore(cfg.db_file).runs()
    why = "no device reported an evaluation: 6 devices refused (4010)"
    assert run["status"] == "finished" and run["reason"] == why
    assert lines[-1] == f"cuvil run {run_id} finished: {why}"


def test_a_rollout_run_evaluates_each_device_on_the_version_it_reported_running(tmp_path, bundles):
    devs = make_fleet(d0="stuck")  # d0 (x86) evaluates but refuses to switch
    b_hash = BundleRef.from_file(bundles[1]).content_hash
    transport = FakeTransport(devs, bundles[2], accuracy_of={bundles[2]: 0.6, b_hash: 0.95})
    cfg = _cfg(tmp_path, bundles, bundle_b=str(bundles[1]), rollout=True, canary_fraction=1.0)
    run_id = drive_run(transport, cfg)
    store = ResultsStore(cfg.db_file)
    assert {r["device_class"]: r["decision"] for r in store.rollouts(run_id)} == {
        "orin": "promote", "rpi5": "promote", "x86": "promote"}
    active = {r["kind"] + r["model"][-2:]: sorted(q["device_id"] for q in store.requests(r["id"]))
              for r in store.rounds(run_id) if r["kind"] == "active"}
    assert active == {"active@1": ["d0"], "active@2": ["d1", "d2", "d3", "d4", "d5"]}
    store.close()


def test_a_killed_run_keeps_every_reply_pulled_and_resumes_without_a_second_charge(tmp_path, bundles):
    devs = make_fleet()
    cfg = _cfg(tmp_path, bundles, num_rounds=2)
    with pytest.raises(Killed):  # dies in round 2 after two replies: four devices have released, unpulled
        drive_run(DyingTransport(devs, replies=6 + 2, good_hash=bundles[2]), cfg)
    store = ResultsStore(cfg.db_file)
    (run,) = store.runs()
    r1, r2 = store.rounds(run["id"])
    assert run["status"] == "aborted" and "Killed" in run["reason"]
    assert r1["finished_at"] and len(store.reports(r1["id"])) == 6
    assert r2["finished_at"] is None and r2["sampled"] == 6 and len(store.reports(r2["id"])) == 2
    assert {r["device_id"] for r in store.requests(r2["id"])} == {d.device_id for d in devs.values()}
    before = {d.device_id: d.calls for d in devs.values()}
    answered = {r["device_id"] for r in store.reports(r2["id"])}

    lines: list[str] = []
    assert drive_run(FakeTransport(devs, bundles[2]), cfg.replace(resume_run=run["id"]), ProgressLog(lines.append)) \
        == run["id"]
    (run,) = store.runs()
    assert run["status"] == "finished" and run["resumed"] == 1
    assert [len(store.reports(r["id"])) for r in store.rounds(run["id"])] == [6, 6]
    for dev in devs.values():
        # asked again in round 2 only if its reply had not been pulled, with the same release-id: charged once
        assert dev.calls - before[dev.device_id] == (0 if dev.device_id in answered else 1) + 1  # + inventory
        assert len(dev.released) == 2 and len(set(dev.release_ids)) == 2
    assert "round 2 [eval] digits-mlp@1: 6 devices sampled, bundle pushed to 0, 2 answered before the restart" in lines


def test_a_finished_run_or_one_still_driven_is_not_taken_over(tmp_path, bundles):
    cfg = _cfg(tmp_path, bundles)
    run_id = drive_run(FakeTransport(make_fleet(), bundles[2]), cfg)
    with pytest.raises(StoreError, match="finished"):
        drive_run(FakeTransport(make_fleet(), bundles[2]), cfg.replace(resume_run=run_id))
    store = ResultsStore(cfg.db_file)
    live = store.start_run({}, "k")  # owned by this (live) process, heartbeat fresh
    with pytest.raises(StoreError, match="still driven"):
        store.take_over_run(live)
    with pytest.raises(StoreError, match="no run 99"):
        store.take_over_run(99)


def test_a_run_whose_coordinator_died_is_marked_aborted_when_the_next_one_starts(tmp_path, bundles):
    cfg = _cfg(tmp_path, bundles)
    code = f"from cuvil.coordinator.store import ResultsStore; ResultsStore({str(cfg.db_file)!r}).start_run({{}}, 'k')"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)  # its owner process is gone now
    store = ResultsStore(cfg.db_file)
    (dead,) = store.runs()
    assert dead["status"] == "running"
    events = []
    drive_run(FakeTransport(make_fleet(), bundles[2]), cfg, lambda e, **kw: events.append((e, kw)))
    assert ("aborted_runs", {"runs": [dead["id"]]}) in events
    status = {r["id"]: (r["status"], r["reason"]) for r in store.runs()}
    assert status[dead["id"]] == ("aborted", "coordinator gone (killed or crashed)")


def test_a_changed_bundle_file_is_refused_on_resume(tmp_path, bundles):
    devs = make_fleet()
    cfg = _cfg(tmp_path, bundles, num_rounds=2)
    with pytest.raises(Killed):
        drive_run(DyingTransport(devs, replies=7, good_hash=bundles[2]), cfg)
    bundles[0].with_name("copy.cuvil").write_bytes(bundles[0].read_bytes())
    bundles[0].write_bytes(bundles[1].read_bytes())  # the file at the stored path now holds another bundle
    try:
        with pytest.raises(StoreError, match="bundle file changed"):
            drive_run(FakeTransport(devs, bundles[2]), cfg.replace(resume_run=1))
    finally:
        bundles[0].write_bytes(bundles[0].with_name("copy.cuvil").read_bytes())


def test_progress_shows_a_line_while_a_stage_waits(tmp_path, bundles):
    from cuvil.coordinator.rounds import Coordinator

    devs = make_fleet()
    store = ResultsStore(tmp_path / "r.db")
    lines: list[str] = []
    coord = Coordinator(FakeTransport(devs, bundles[2]), store, store.start_run({}, "k"),
                        _cfg(tmp_path, bundles, round_timeout=0.3), ProgressLog(lines.append), progress_every_s=0.0)
    coord.inventory()
    next(d for d in devs.values() if d.device_id == "d5").behaviour = "silent"  # answered the inventory, then gone
    coord.evaluate_round(BundleRef.from_file(bundles[0]), 1, devices=["d0", "d5"])
    assert any(line.startswith("  round 1 [eval]: 1/2 answered,") and line.endswith("s left") for line in lines)
    assert any("d5 timeout: no reply within the round's 0.3 s" in line for line in lines)


@pytest.mark.parametrize("signum, reason", [(signal.SIGTERM, "terminated (SIGTERM)"),
                                            (signal.SIGINT, "stopped (SIGINT: Ctrl-C, or Flower stopping the run)")])
def test_a_coordinator_stopped_by_a_signal_says_so(tmp_path, bundles, signum, reason):
    """Flower's handler ends a ServerApp on SIGTERM or SIGINT with SystemExit(0): the run says which signal."""
    def flower_exit(sig, frame):
        raise SystemExit(0)

    class Signalling(FakeTransport):
        def poll(self, handles):
            signal.raise_signal(signum)
            return super().poll(handles)

    before = {s: signal.signal(s, flower_exit) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        cfg = _cfg(tmp_path, bundles)
        with pytest.raises(SystemExit):
            drive_run(Signalling(make_fleet(), bundles[2]), cfg)
        assert signal.getsignal(signum) is flower_exit  # the handler in place is back
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    store = ResultsStore.open_read_only(cfg.db_file)
    assert [(r["status"], r["reason"]) for r in store.runs()] == [("aborted", reason)]
    store.close()
