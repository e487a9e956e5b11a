"""Views of the results database: runs with durations, failures, A/B verdicts, the fleet, a device's history."""

import pytest

from cuvil.coordinator import results_view as rv
from cuvil.coordinator.store import ResultsStore, StoreError

from .helpers import recorded_run


@pytest.fixture
def store(tmp_path):
    s = ResultsStore.open_read_only(recorded_run(tmp_path / "r.db"))
    yield s
    s.close()


def test_runs_and_rounds_carry_times_and_counts(store):
    (run,) = rv.runs(store)
    assert run.status == "finished" and run.duration_s >= 0 and run.models == ("m@1", "m@2")
    assert [(r.number, r.kind, r.reports, r.failed) for r in run.rounds] == [(1, "eval", 6, 2), (2, "ab:A", 6, 1),
                                                                             (2, "ab:B", 6, 1)]
    assert run.rounds[0].failures == {"timeout": 1, "budget_exhausted": 1} and run.rounds[0].duration_s >= 0
    with pytest.raises(StoreError, match="no run 5"):
        rv.run(store, 5)


def test_failures_name_device_class_and_reason_once(store):
    fails = rv.failures(store, rv.run(store, 1))
    spent = [f for f in fails if f.kind == "budget_exhausted"]
    assert len(fails) == 4 and spent[0].device_class == "rpi5"
    assert spent[0].reason.startswith("DP_BUDGET_EXHAUSTED: dataset")


def test_ab_verdict_per_class_says_whether_the_difference_is_beyond_the_noise(store):
    verdicts = {v.device_class: v for v in rv.ab_verdicts(store, rv.run(store, 1))}
    assert set(verdicts) == {"x86-avx2", "rpi5", "all"}
    overall = verdicts["all"]
    assert overall.devices == 6 and overall.model_a == "m@1" and overall.model_b == "m@2"
    assert overall.diff < 0 and overall.distinguishable and overall.verdict == "B worse"
    close = rv.AbVerdict(2, "c", 3, "a", "b", 0.80, 0.82, 0.02, 0.03)
    assert not close.distinguishable and close.verdict == "not distinguishable from the noise"


def test_inventory_and_device_history(store):
    inv = {r.device_id: r for r in rv.inventory(store)}
    assert inv["d0"].isa == "AVX2" and inv["d0"].bundles_held == ("m@1", "m@2") and inv["d0"].epsilon_spent == 0.77
    assert inv["spent"].budget_exhausted and inv["spent"].bundles_held == ()
    events = rv.device_history(store, "spent")
    assert [e.outcome for e in events] == ["budget_exhausted"] and "ε=3.088" in events[0].reason
    assert [e.outcome for e in rv.device_history(store, "d4")] == ["report"] * 3
    with pytest.raises(StoreError):
        rv.device_history(store, "nobody")


def test_epsilon_budget_is_the_run_request_or_the_device_default():
    assert rv.epsilon_budget({"dp-epsilon": 1.5}) == (1.5, False)
    assert rv.epsilon_budget({"dp-epsilon": 0.0}) == (3.0, True)


def test_the_stored_ab_verdict_is_the_one_shown(tmp_path):
    path = recorded_run(tmp_path / "r.db")
    s = ResultsStore(path)
    s.add_comparison(1, 2, "m@1", "m@2", {"all": {"devices": 6, "a": 0.91, "b": 0.52, "diff": -0.39, "se": 0.011}})
    s.close()
    s = ResultsStore.open_read_only(path)
    (v,) = rv.ab_verdicts(s, rv.run(s, 1))  # what the coordinator decided, not a recomputation
    assert (v.round_number, v.device_class, v.a, v.b, v.diff, v.se) == (2, "all", 0.91, 0.52, -0.39, 0.011)
    s.close()


def test_bundles_held_are_the_ones_a_device_listed_named_by_their_models(tmp_path):
    from cuvil.coordinator.store import DeviceRecord

    path = recorded_run(tmp_path / "r.db")
    s = ResultsStore(path)
    s.upsert_device(DeviceRecord("d0", "x86-avx2", "haswell", "+avx2", "t", False, "x86_64/256-bit", 8,
                                 ("a" * 64, "f" * 64)))
    s.close()
    s = ResultsStore.open_read_only(path)
    row = next(r for r in rv.inventory(s) if r.device_id == "d0")
    assert row.bundles_held == ("m@1", "ffffffffffff") and row.threads == 8
    s.close()
