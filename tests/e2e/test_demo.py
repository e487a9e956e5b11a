"""`cuvil demo` end to end: trains, signs, simulates 12 devices over 4 classes, A/B, report (a few minutes)."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")
pytest.importorskip("torch")
pytest.importorskip("sklearn")

pytestmark = pytest.mark.slow


def test_demo_runs_the_federated_evaluation_and_writes_results(tmp_path):
    from cuvil.coordinator.store import ResultsStore
    from cuvil.demo import run_demo

    lines: list[str] = []
    result = run_demo(tmp_path, echo=lines.append)
    text = "\n".join(lines)
    assert result.bundle.exists() and result.bundle_b.exists() and result.report.exists()
    assert abs(result.estimate - result.accuracy) < 0.05  # the private estimate tracks the truth
    assert "true accuracy beside the private estimate" in text and "A/B on the same devices" in text
    store = ResultsStore(result.db)
    rounds = store.rounds(result.run_id)
    assert [r["kind"] for r in rounds] == ["eval", "eval", "ab:A", "ab:B"]
    assert rounds[1]["bundle_bytes_sent"] == 0
    assert all(r["metrics"]["cache_hit"] == 1 for r in store.reports(rounds[1]["id"]))
    assert len(store.devices()) == 12 and len({d["profile"] for d in store.devices()}) >= 4
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
