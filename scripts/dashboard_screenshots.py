"""Screenshots of `cuvil dashboard` and of the HTML report for docs/dashboard.md, taken in headless Chromium.

Runs the small simulated fleet the tests use (an evaluation round, an A/B round, a device whose
budget is spent, a device that fails), serves its database and photographs what a person sees.
Usage: ``python scripts/dashboard_screenshots.py [OUT_DIR]`` (default ``docs/images``); about a minute.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cuvil.coordinator.dashboard import DashboardServer  # noqa: E402
from cuvil.coordinator.report import write_html  # noqa: E402
from cuvil.coordinator.store import ResultsStore  # noqa: E402
from tests.browser import Browser  # noqa: E402
from tests.coordinator.fleet_helpers import simulate_results  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "images"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cuvil-shots-") as tmp:
        db = simulate_results(Path(tmp))
        store = ResultsStore.open_read_only(db)
        report = write_html(store, 1, Path(tmp) / "report.html")
        store.close()
        server = DashboardServer(db, port=0).start()
        try:
            with Browser(width=1280, height=800) as b:
                for name, url in (("dashboard-fleet.png", server.url), ("dashboard-run.png", server.url + "run/1"),
                                  ("report.png", report.resolve().as_uri())):
                    b.open(url)
                    print(b.screenshot(out / name), b.errors() or "no console errors")
        finally:
            server.close()


if __name__ == "__main__":
    main()
