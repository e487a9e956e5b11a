"""`cuvil results`, `cuvil report` and `cuvil device-provision` over a small recorded run."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cuvil.cli import main
from cuvil.coordinator.store import DeviceRecord, ResultsStore

from ..coordinator.helpers import device_report


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "r.db"
    store = ResultsStore(path)
    run = store.start_run({"bundle": "m.cuvil"})
    rnd = store.start_round(run, 1, "eval", "m@1", "a" * 64, "digits-local")
    for i, prof in enumerate(["x86-avx2", "rpi5"]):
        store.upsert_device(DeviceRecord(f"d{i}", prof, "cpu", "", "t", prof != "x86-avx2"))
        store.add_report(rnd, f"d{i}", prof, prof != "x86-avx2", device_report(i, 0.9, emulated=prof != "x86-avx2")[0])
    store.add_failure(rnd, "d2", "budget_exhausted", "DP_BUDGET_EXHAUSTED: spent")
    store.finish_round(rnd, 3, 1000)
    store.finish_run(run)
    store.close()
    return path


def test_results_prints_history_and_epsilon_per_device(db):
    out = CliRunner().invoke(main, ["results", "--db", str(db)])
    assert out.exit_code == 0 and "run 1" in out.output and "bundle bytes sent 1000" in out.output
    detail = CliRunner().invoke(main, ["results", "--db", str(db), "--run", "1"])
    assert detail.exit_code == 0 and "x86-avx2" in detail.output and "ε spent per device" in detail.output
    assert "0.770" in detail.output and "budget spent" in detail.output  # d2 refused: no ε sent, still listed


def test_report_writes_self_contained_html(db, tmp_path):
    out = CliRunner().invoke(main, ["report", "--db", str(db), "--run", "1", "-o", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    page = (tmp_path / "r.html").read_text()
    assert "data:image/png;base64," in page and "ε spent per device" in page and "<script" not in page


def test_missing_database_is_one_line_error(tmp_path):
    out = CliRunner().invoke(main, ["results", "--db", str(tmp_path / "none.db")])
    assert out.exit_code == 1 and out.output.startswith("error:") and "none.db" in out.output


def test_device_provision(tmp_path):
    from cuvil import api

    keys = api.keygen(tmp_path / "keys", "author")
    out = CliRunner().invoke(main, ["device-provision", "--state-dir", str(tmp_path / "dev"), "--device-id", "j1",
                                    "--profile", "rpi5", "--trust", str(keys.public_path)])
    assert out.exit_code == 0 and "state-dir=" in out.output
    again = CliRunner().invoke(main, ["device-provision", "--state-dir", str(tmp_path / "dev"), "--device-id", "j1",
                                      "--profile", "rpi5", "--trust", str(keys.public_path)])
    assert again.exit_code == 1 and "already provisioned" in again.output


def test_mark_aborted_marks_runs_whose_coordinator_is_gone(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "r.db"
    code = f"from cuvil.coordinator.store import ResultsStore; ResultsStore({str(path)!r}).start_run({{}}, 'k')"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)  # that coordinator process is gone
    out = CliRunner().invoke(main, ["results", "--db", str(path), "--mark-aborted"])
    assert out.exit_code == 0 and "marked aborted: run 1" in out.output
    (run,) = ResultsStore(path).runs()
    assert run["status"] == "aborted" and run["reason"].startswith("coordinator gone")


def test_fleet_certs_node_key_and_example(tmp_path):
    from cuvil import api

    out = CliRunner().invoke(main, ["fleet", "certs", "--out", str(tmp_path / "tls"), "--san", "127.0.0.1",
                                    "--san", "localhost"])
    assert out.exit_code == 0 and "SANs: 127.0.0.1, localhost" in out.output
    assert sorted(p.name for p in (tmp_path / "tls").iterdir()) == ["ca.crt", "ca.key", "superlink.key",
                                                                   "superlink.pem"]
    bad = CliRunner().invoke(main, ["fleet", "certs", "--out", str(tmp_path / "x"), "--san", "no such host"])
    assert bad.exit_code == 1 and bad.output.startswith("error: SAN 'no such host'")
    out = CliRunner().invoke(main, ["fleet", "node-key", "--out", str(tmp_path / "keys" / "device-1")])
    assert out.exit_code == 0 and (tmp_path / "keys" / "device-1.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    keys = api.keygen(tmp_path / "author", "author")
    out = CliRunner().invoke(main, ["fleet", "example", "--key", str(keys.private_path), "--out",
                                    str(tmp_path / "ex"), "--devices", "2"])
    assert out.exit_code == 0, out.output
    for name in ("digits-v1.cuvil", "digits-v2.cuvil", "data/device-1.npz", "data/device-2.npz"):
        assert (tmp_path / "ex" / name).is_file()
    model = api.load(tmp_path / "ex" / "digits-v1.cuvil", [keys.public_path])
    assert model.graph.inputs == ("pixels",)
