import subprocess
import sys
import textwrap

import pytest

from cuvil.coordinator.aggregate import OVERALL, aggregate_round
from cuvil.coordinator.report import history_text, write_html
from cuvil.coordinator.schema import check_report
from cuvil.edge_runtime.report import ReportError
from cuvil.coordinator.store import DeviceRecord, ResultsStore

from .helpers import device_report


def fill(store, accuracies):
    run = store.start_run({"model": "m"})
    rnd = store.start_round(run, 1, "eval", "m:1", "ab" * 32, "digits")
    truth = {}
    for i, (cls, acc, emulated) in enumerate(accuracies):
        dev = f"dev-{i}"
        store.upsert_device(DeviceRecord(dev, cls, "cpu", "+a", "0.1", emulated))
        metrics, true_acc = device_report(i, acc, latency_ms=1.0 if cls == "x86" else 50.0, emulated=emulated)
        truth.setdefault(cls, []).append(true_acc)
        store.add_report(rnd, dev, cls, emulated, metrics)
    store.upsert_device(DeviceRecord("gone", "x86", "cpu", "+a", "0.1", False))
    store.add_failure(rnd, "gone", "timeout", "no reply in 30 s")
    store.finish_round(rnd, sampled=len(accuracies) + 1, bundle_bytes_sent=1234)
    return run, rnd, truth


def test_aggregates_per_class_decode_noisy_accuracy_and_keep_emulated_latency_out(tmp_path):
    store = ResultsStore(tmp_path / "r.db")
    fleet = [("x86", 0.9, False)] * 6 + [("rpi5", 0.6, True)] * 6
    run, rnd, truth = fill(store, fleet)
    aggs = aggregate_round(store.reports(rnd), store.failures(rnd), {d["device_id"]: d["profile"] for d in store.devices()})
    for cls in ("x86", "rpi5"):
        a = aggs[cls]
        true_mean = sum(truth[cls]) / len(truth[cls])
        assert abs(a.accuracy - true_mean) < 5 * a.accuracy_se
    assert aggs["x86"].failures == {"timeout": 1} and aggs[OVERALL].devices == 12
    assert aggs["x86"].latency_devices == 6 and 0.9 < aggs["x86"].latency_p50_ms < 1.3
    assert aggs["rpi5"].latency_p50_ms is None and aggs["rpi5"].emulated_devices == 6
    assert aggs[OVERALL].latency_p99_ms < 2.0  # the 50 ms emulated devices are excluded


def test_report_schema_rejects_mismatched_keys():
    metrics, _ = device_report(0, 0.5)
    with pytest.raises(ReportError, match="missing"):
        check_report({k: v for k, v in metrics.items() if k != "compile_ms"})
    with pytest.raises(ReportError, match="unexpected"):
        check_report({**metrics, "accuracy": 0.9})


def test_history_survives_a_killed_writer_and_a_new_run_continues_beside(tmp_path):
    path = tmp_path / "r.db"
    script = textwrap.dedent(f"""
        import os
        from cuvil.coordinator.store import ResultsStore
        s = ResultsStore({str(path)!r})
        run = s.start_run({{"n": 1}})
        rnd = s.start_round(run, 1, "eval", "m:1", "cd" * 32, "digits")
        s.add_failure(rnd, "dev-1", "refused", "bad signature")
        os._exit(9)   # killed mid-run: nothing after this is written
    """)
    assert subprocess.run([sys.executable, "-c", script], timeout=60).returncode == 9
    store = ResultsStore(path)
    assert [r["status"] for r in store.runs()] == ["running"]
    assert store.failures(store.rounds(1)[0]["id"])[0]["reason"] == "bad signature"
    run2 = store.start_run({"n": 2})
    assert run2 == 2 and len(store.runs()) == 2


def test_history_text_and_html_report(tmp_path):
    store = ResultsStore(tmp_path / "r.db")
    run, _, _ = fill(store, [("x86", 0.9, False)] * 3 + [("rpi5", 0.5, True)] * 3)
    text = history_text(store, run)
    assert "x86" in text and "rpi5" in text and "timeout" in text
    assert "emulated" in text.split("rpi5", 1)[1].splitlines()[0]  # rpi5's latency: emulated, not a number
    page = write_html(store, run, tmp_path / "report.html").read_text()
    assert page.count("<figure class='chart'><svg") >= 2 and "<table" in page and "rpi5" in page


def test_budget_exhausted_devices_are_remembered_per_dataset(tmp_path):
    store = ResultsStore(tmp_path / "r.db")
    run = store.start_run({})
    rnd = store.start_round(run, 1, "eval", "m", "ee" * 32, "digits")
    store.add_failure(rnd, "dev-3", "budget_exhausted", "DP_BUDGET_EXHAUSTED")
    assert store.exhausted_devices("digits") == {"dev-3"} and store.exhausted_devices("other") == set()
    with pytest.raises(ValueError):
        store.add_failure(rnd, "dev-3", "oops", "")


def test_a_store_is_made_in_a_new_or_empty_file_and_never_added_to_another_database(tmp_path):
    import sqlite3

    from cuvil.coordinator.store import StoreError

    made = ResultsStore(tmp_path / "new.db")  # the coordinator's first run
    made.start_run({})
    made.close()
    (tmp_path / "empty.db").write_bytes(b"")
    ResultsStore(tmp_path / "empty.db").close()
    assert [r["id"] for r in ResultsStore(tmp_path / "empty.db", create=False).runs()] == []
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)")  # a 'runs' table, not Cuvil's
    con.commit()
    con.close()
    before = other.read_bytes()
    for opener in (ResultsStore, lambda p: ResultsStore(p, create=False), ResultsStore.open_read_only):
        with pytest.raises(StoreError, match=r"other\.db is not a Cuvil results database$"):
            opener(other)
    assert other.read_bytes() == before
    with pytest.raises(StoreError, match="no results database at"):
        ResultsStore(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()


def test_a_results_file_from_before_a_rollouts_unknown_count_gains_the_column(tmp_path):
    """A store written before rollouts recorded how many devices' versions are unknown opens, its rows read
    0 there, and new decisions record the count."""
    import sqlite3

    path = tmp_path / "old.db"
    ResultsStore(path).close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE rollouts DROP COLUMN unknown")  # the file as an older Cuvil wrote it
    db.commit()
    db.close()
    store = ResultsStore(path)
    run = store.start_run({})
    store.add_rollout(run, "x86", "a", "b", 1, 1, 3, 0.1, 0.05, 0.2, 0.05, 0.0, "rollback", "worse")
    store.set_rollout_applied(run, "x86", 1, 2)
    (row,) = store.rollouts(run)
    assert (row["applied"], row["unknown"]) == (1, 2)
    store.close()
