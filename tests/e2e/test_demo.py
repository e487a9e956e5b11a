"""`cuvil demo` end to end: v1 evaluated, DP fine-tuning rounds, v2 signed, canary rollout, fleet-wide evaluation."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")
pytest.importorskip("torch")
pytest.importorskip("opacus")
pytest.importorskip("sklearn")

pytestmark = pytest.mark.slow


def test_demo_runs_the_loop_and_the_fine_tuned_version_is_better(tmp_path):
    from cuvil.compiler.bundle import read_bundle
    from cuvil.coordinator.device import DeviceState
    from cuvil.coordinator.store import ResultsStore
    from cuvil.demo_loop import run_loop_demo

    lines: list[str] = []
    result = run_loop_demo(tmp_path, echo=lines.append)
    text = "\n".join(lines)
    assert result.bundle.exists() and result.bundle_b.exists() and result.report.exists()
    assert abs(result.estimate - result.accuracy) < 0.05  # the private estimate tracks the truth
    assert result.accuracy_b - result.accuracy > result.estimate_se  # the goal: better beyond the noise
    assert "canary rollout, per class" in text and "fleet-wide evaluation of what is active" in text
    store = ResultsStore(result.db)
    rounds = store.rounds(result.run_id)
    assert [r["kind"] for r in rounds][:6] == ["eval", "train", "train", "train", "ab:A", "ab:B"]
    assert {r["kind"] for r in rounds[6:]} == {"active"}
    train = [r for r in rounds if r["kind"] == "train"]
    assert all(len(store.updates(r["id"])) == 9 for r in train)  # the rpi5 class cannot train
    lineage = read_bundle(result.bundle_b.read_bytes(), (), require_trust=False).manifest.lineage
    assert lineage.parent == read_bundle(result.bundle.read_bytes(), (), require_trust=False).content_hash
    assert lineage.rounds == 3 and lineage.devices == 9
    assert len(store.rollouts(result.run_id)) == 4  # a decision per class
    trainer = next(u["device_id"] for u in store.updates(train[0]["id"]))
    ledger = DeviceState.open(result.workdir / "fleet" / trainer).ledger()
    assert ledger.releases("local") >= 5 and ledger.spent("local") <= 3.0  # training charged with evaluation
    ledger.close()
    store.close()


def test_demo_int8_ab_shows_accuracy_cost_latency_and_bundle_gain_per_class(tmp_path):
    from cuvil.demo import run_demo

    lines: list[str] = []
    result = run_demo(tmp_path, echo=lines.append, devices=4, rounds=1, int8=True)
    text = "\n".join(lines)
    assert result.bundle_b.name == "digits-cnn-v1-int8.cuvil"
    assert result.bundle_b.stat().st_size < result.bundle.stat().st_size
    table = text.split("int8 (B) against fp32 (A) per device class:")[1]
    assert "accuracy B - A" in table and "latency A -> B" in table and "bundle B/A" in table
    assert "measured" in table and "predicted" in table  # the host class natively, the ARM classes emulated
