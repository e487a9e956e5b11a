"""`cuvil results`, `cuvil report` and `cuvil dashboard --help` over a recorded run (read-only)."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from cuvil.cli import main

from ..coordinator.helpers import recorded_run

_CONTROLS = ("\x1b", "\x9b", "\x07", "\u202e")


@pytest.fixture
def db(tmp_path):
    return recorded_run(tmp_path / "r.db")


def test_results_lists_runs_with_timestamps_and_round_durations(db):
    out = CliRunner().invoke(main, ["results", "--db", str(db)])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].startswith("run 1  status finished  started 20") and "rounds" in lines[0]
    assert "bundle bytes sent 1000" in out.output and " took " in lines[1] and "failures budget exhausted 1" in lines[1]


def test_results_of_a_run_show_failure_reasons_ab_verdict_and_epsilon(db):
    out = CliRunner().invoke(main, ["results", "--db", str(db), "--run", "1"])
    assert out.exit_code == 0, out.output
    text = out.output
    assert "x86-avx2" in text and "ε spent per device" in text and "0.770" in text and "budget spent" in text
    assert "no reply within 30 s" in text and "DP_BUDGET_EXHAUSTED: dataset 'local'" in text
    assert "DP_BUDGET_EXHAUSTED: DP_BUDGET_EXHAUSTED" not in text  # the code is said once
    assert "1.20 µs" in text or "1.29 µs" in text  # 1.2 µs is not "0.001" ms
    ab = text.split("A/B:", 1)[1]
    assert "B worse" in ab.split("\n  failures")[0]  # 0.9 -> 0.5 on 6 devices is far beyond the noise


def test_results_json_is_for_scripts(db):
    out = CliRunner().invoke(main, ["results", "--db", str(db), "--run", "1", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["run"]["status"] == "finished" and data["run"]["started_at_utc"].endswith("Z")
    assert [r["kind"] for r in data["rounds"]] == ["eval", "ab:A", "ab:B"]
    assert data["run"]["rounds"][0]["duration_s"] >= 0
    assert {f["kind"] for f in data["failures"]} == {"timeout", "budget_exhausted"}
    overall = [v for v in data["ab"] if v["device_class"] == "all"][0]
    assert overall["devices"] == 6 and overall["diff"] < 0 and overall["distinguishable"] is True
    assert data["latency_predicted_ms"] == {"m@1": {"rpi5": 0.0071}}
    listing = json.loads(CliRunner().invoke(main, ["results", "--db", str(db), "--json"]).output)
    assert [r["run_id"] for r in listing["runs"]] == [1]


def test_missing_run_and_missing_database_exit_non_zero(db, tmp_path):
    out = CliRunner().invoke(main, ["results", "--db", str(db), "--run", "7"])
    assert out.exit_code == 1 and out.output.strip() == f"error: no run 7 in {db}"
    out = CliRunner().invoke(main, ["results", "--db", str(tmp_path / "none.db")])
    assert out.exit_code == 1 and out.output.startswith("error:") and "none.db" in out.output
    out = CliRunner().invoke(main, ["report", "--db", str(db), "--run", "7", "-o", str(tmp_path / "x.html")])
    assert out.exit_code == 1 and not (tmp_path / "x.html").exists()


def test_device_strings_never_reach_the_terminal_as_escape_sequences(tmp_path):
    db = recorded_run(tmp_path / "h.db", hostile=True)
    for args in (["results", "--db", str(db)], ["results", "--db", str(db), "--run", "1"],
                 ["results", "--db", str(db), "--run", "1", "--json"]):
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 0, out.output
        assert not any(c in out.output for c in _CONTROLS), args
    detail = CliRunner().invoke(main, ["results", "--db", str(db), "--run", "1"]).output
    assert "x" + "evil\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u202e" in detail  # shown, escaped, not obeyed


def test_report_writes_self_contained_html_and_leaves_the_database_alone(db, tmp_path):
    before = db.read_bytes()
    out = CliRunner().invoke(main, ["report", "--db", str(db), "--run", "1", "-o", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    page = (tmp_path / "r.html").read_text()
    assert "<svg" in page and "ε spent per device" in page and "<script" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)  # nothing fetched from anywhere
    assert db.read_bytes() == before


def test_dashboard_help_names_the_defaults():
    out = CliRunner().invoke(main, ["dashboard", "--help"])
    assert out.exit_code == 0 and "127.0.0.1" in out.output and "--port" in out.output


def test_mark_aborted_refuses_a_database_that_is_not_a_results_store_and_leaves_it_alone(tmp_path):
    import sqlite3

    other, empty = tmp_path / "other.db", tmp_path / "empty.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    empty.write_bytes(b"")
    for path in (other, empty):
        before = path.read_bytes()
        out = CliRunner().invoke(main, ["results", "--db", str(path), "--mark-aborted"])
        assert out.exit_code == 1 and out.output == f"error: {path} is not a Cuvil results database\n", out.output
        assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["empty.db", "other.db"]


def test_report_refuses_a_fifo_as_output_without_blocking(db, tmp_path):
    import os
    import threading

    fifo = tmp_path / "r.html"
    os.mkfifo(fifo)
    result = []
    worker = threading.Thread(target=lambda: result.append(
        CliRunner().invoke(main, ["report", "--db", str(db), "--run", "1", "-o", str(fifo)])), daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():  # the old in-place write blocked in open(): drain it as a reader would, then fail
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        while worker.is_alive():
            try:
                os.read(fd, 1 << 16)
            except BlockingIOError:
                worker.join(0.1)
        os.close(fd)
    assert result and result[0].exit_code == 1 and "not a regular file" in result[0].output, result[0].output


def test_report_that_cannot_be_written_whole_leaves_the_old_file_as_it_was(db, tmp_path):
    """A file-size limit stands in for a full disk: the old report was truncated and a partial page left."""
    import resource
    import signal

    from cuvil.coordinator.report import write_html
    from cuvil.coordinator.store import ResultsStore

    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "r.html"
    out.write_text("the previous report")
    store = ResultsStore.open_read_only(db)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limits[1]))
    try:
        with pytest.raises(OSError):
            write_html(store, 1, out)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
        store.close()
    assert out.read_text() == "the previous report" and [p.name for p in out.parent.iterdir()] == ["r.html"]
