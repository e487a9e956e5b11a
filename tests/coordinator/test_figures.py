"""The charts: a class name or model label from a device is drawn as its printable text, never parsed
as matplotlib math text (which could fail and take the report down) and never passed on raw."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from cuvil.coordinator import figures  # noqa: E402
from cuvil.coordinator.aggregate import aggregate_round  # noqa: E402
from cuvil.coordinator.results_view import RoundDetail, RoundSummary  # noqa: E402
from cuvil.edge_runtime.latency import BUCKET_EDGES_MS  # noqa: E402

from .helpers import device_report  # noqa: E402

MATH = "x86$\\fakecommand{$"  # once a ParseFatalException: `cuvil report` exited 1, the dashboard's page failed
TWO_FORMULAS = "$a$ or $b$"  # parses, but would be drawn as math, not as the string the device sent
CONTROLS = "x86\x1b[2J\x9b31m\u202eevil"  # once raw ESC, 8-bit CSI and a bidi override in the SVG
RAW = ("\x1b", "\x9b", "\u202e")


def _figures(names: list[str]) -> list[str]:
    reports = [{"device_id": f"d{i}", "profile": name, "emulated": False, "metrics": device_report(i, 0.9)[0]}
               for i, name in enumerate(names)]
    summary = RoundSummary(1, 1, "eval", "m@1", "a" * 64, "digits", 0.0, 1.0, len(names), len(names), {}, 0, 0)
    details = [RoundDetail(summary, aggregate_round(reports, []))]
    hists = {r["profile"]: r["metrics"]["latency_hist"] for r in reports}
    return [figures.estimates_figure(details), figures.compile_figure(details),
            figures.latency_figure(hists, BUCKET_EDGES_MS, {n: 0.5 for n in names}, f"latency of {MATH}")]


def test_device_strings_are_drawn_as_their_printable_text_in_every_figure():
    for svg in _figures([MATH, TWO_FORMULAS, CONTROLS]):
        assert svg.startswith("<svg")
        assert not any(c in svg for c in RAW)
        assert MATH in svg and TWO_FORMULAS in svg  # the strings themselves, not formulas
        assert "x86\\x1b[2J\\x9b31m\\u202eevil" in svg


def test_a_class_whose_name_starts_with_an_underscore_keeps_its_legend_entry():
    """matplotlib's legend leaves out labels that start with '_' unless it is handed them."""
    estimates, compile_svg, latency = _figures(["_hidden-class", "x86-avx2"])
    assert "_hidden-class" in compile_svg and "_hidden-class" in latency and "_hidden-class" in estimates
