"""`cuvil dashboard` and the HTML report in a real headless Chromium, over a real simulated run."""

from __future__ import annotations

import shutil

import pytest

from cuvil.coordinator.dashboard import DashboardServer
from cuvil.coordinator.report import write_html
from cuvil.coordinator.store import ResultsStore

from ..browser import Browser, chromium_path

pytestmark = pytest.mark.skipif(chromium_path() is None, reason="needs chromium (scripts/setup.sh installs it)")


@pytest.fixture(scope="module")
def browser():
    with Browser() as b:
        yield b


@pytest.fixture
def dashboard(simulated_results, tmp_path):
    db = tmp_path / "results.db"
    shutil.copy(simulated_results, db)  # the live test writes to its copy
    server = DashboardServer(db, port=0).start()
    yield server, db
    server.close()


def test_a_person_sees_runs_charts_ab_verdict_failures_and_the_fleet(browser, dashboard):
    server, _ = dashboard
    browser.open(server.url)
    runs = browser.evaluate("[...document.querySelectorAll('#runs tbody tr')].map(r => r.innerText)")
    assert len(runs) == 1 and "run 1" in runs[0] and "finished" in runs[0]
    devices = browser.evaluate("[...document.querySelectorAll('#inventory tbody tr')].map(r => r.innerText)")
    assert len(devices) == 5 and any("emulated" in d for d in devices) and any("native" in d for d in devices)
    heads = browser.evaluate("[...document.querySelectorAll('#inventory th')].map(h => h.innerText)")
    cells = browser.evaluate("[...document.querySelectorAll('#inventory tbody tr')]"
                             ".map(r => [...r.cells].map(c => c.innerText))")
    col = {h: i for i, h in enumerate(heads)}
    assert all(int(c[col["threads"]]) >= 1 for c in cells)
    assert sum("digits-mlp@1" in c[col["bundles held"]] for c in cells) >= 3  # named by model, not by hash
    assert sum("of 3" in c[-1] for c in cells) >= 3  # ε spent of the budget, per device that reported
    browser.open(server.url + "run/1")
    charts = browser.evaluate("[...document.querySelectorAll('figure.chart svg')]"
                              ".map(s => [s.getBoundingClientRect().width, s.querySelectorAll('path').length])")
    assert len(charts) >= 3 and all(w > 300 and paths > 10 for w, paths in charts)
    verdict = browser.evaluate("[...document.querySelectorAll('#ab-verdict tbody tr')].map(r => r.innerText)")
    assert any(v.startswith("all") for v in verdict) and all("±" in v for v in verdict)
    assert all(("distinguishable" in v) or ("B worse" in v) or ("B better" in v) for v in verdict)
    failures = browser.evaluate("document.querySelector('#failures').innerText")
    assert "budget exhausted" in failures and "DP_BUDGET_EXHAUSTED: budget_spent" in failures
    assert "DP_BUDGET_EXHAUSTED: DP_BUDGET_EXHAUSTED" not in failures and "DEVICE_ERROR: device_state" in failures
    page = browser.evaluate("document.body.innerText")
    assert "(predicted)" in page and "predicted latency per inference" in page
    native = browser.evaluate("[...document.querySelectorAll('table[id^=round-] tbody tr')].map(r => r.innerText)"
                              ".filter(t => t.startsWith('x86-'))")
    assert native and all("(predicted)" in t and "µs" in t for t in native)  # measured and predicted, side by side
    browser.open(server.url + "device/" + "sim-001-rpi5")
    assert len(browser.evaluate("[...document.querySelectorAll('#history tbody tr')]")) == 3
    assert browser.errors() == []


@pytest.mark.parametrize("path", ["", "/"])  # "//": the script's fetch once read it as another host's URL
def test_the_page_updates_while_a_run_progresses(browser, dashboard, path):
    server, db = dashboard
    browser.open(server.url + path)
    assert browser.evaluate("document.querySelectorAll('#runs tbody tr').length") == 1
    store = ResultsStore(db)  # a coordinator starting the next run
    store.start_run({"bundle": "next.cuvil"})
    store.close()
    browser.wait_for("document.querySelectorAll('#runs tbody tr').length === 2", timeout=15)
    assert "running" in browser.evaluate("document.querySelector('#runs tbody tr').innerText")
    assert browser.evaluate("document.getElementById('live').textContent").startswith("live")
    assert browser.errors() == []


def test_the_static_report_renders_offline(browser, simulated_results, tmp_path):
    store = ResultsStore.open_read_only(simulated_results)
    page = write_html(store, 1, tmp_path / "report.html")
    store.close()
    browser.open(page.resolve().as_uri())
    assert browser.evaluate("document.querySelectorAll('figure.chart svg').length") >= 3
    assert browser.evaluate("document.querySelectorAll('#ab-verdict tbody tr').length") >= 2
    assert browser.evaluate("document.querySelectorAll('script').length") == 0
    assert browser.errors() == []
