"""The charts of a run, drawn by matplotlib as inline SVG for the HTML report and the dashboard.

Rounds are integers on the x axis; the A and B versions of an A/B round sit either side of their
round with their own markers; legends stand outside the data; latency axes span the data with a
unit that fits it (µs, ms, s). Predicted latency (a cost model's figure) is drawn in its own panel,
never in the measured distribution. Private estimates whose raw ratio fell outside their range (a
negative loss, an accuracy above 1) come clamped to its edge from the aggregate, and the figure says
how many.

Class names and model labels come from devices and bundles: every one is drawn through
:func:`_label` (``printable``, with ``$`` escaped so matplotlib never parses it as math text) and
figures are built with TeX off, so no such string can break a figure or reach the page raw.
"""

from __future__ import annotations

import io
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from ..compiler.printable import printable
from .aggregate import OVERALL
from .formatting import duration_unit
from .results_view import RoundDetail, classes_of

_LOCK = threading.Lock()  # matplotlib's state (fonts, rc) is shared by the dashboard's threads
_TEXT_RC = {"text.usetex": False}  # an operator's matplotlibrc may turn TeX on: a device's string never reaches it
_OFFSET = {"eval": 0.0, "ab:A": -0.15, "ab:B": 0.15}
_MARKER = {"eval": "o", "ab:A": "s", "ab:B": "^"}
_KIND_LABEL = {"eval": "evaluation", "ab:A": "A/B: version A", "ab:B": "A/B: version B"}


@contextmanager
def _drawing() -> Iterator[None]:
    """One figure at a time, its text under :data:`_TEXT_RC`."""
    import matplotlib

    with _LOCK, matplotlib.rc_context(_TEXT_RC):
        yield


def _label(text: object) -> str:
    """A string from a device or bundle as figure text: printable, and with every ``$`` escaped, which
    matplotlib draws as ``$`` (two unescaped ones would start math text, which can fail to parse)."""
    return printable(text).replace("$", r"\$")


def _legend(ax, artists: list, **options) -> None:
    """A legend of ``artists`` by their labels, all of them: matplotlib leaves out on its own any label that
    starts with '_' (a device class '_rpi5' vanished from the charts)."""
    ax.legend(artists, [a.get_label() for a in artists], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False, **options)


def _colors(classes: Sequence[str]) -> dict[str, str]:
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
    named = [c for c in classes if c != OVERALL]
    out = {c: palette[i % len(palette)] for i, c in enumerate(named)}
    out[OVERALL] = "#000000"
    return out


def _svg(fig) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _figure(width: float, height: float, rows: int = 1, **kw):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, fig.subplots(rows, 1, squeeze=False, **kw)[:, 0]


def estimates_figure(details: Sequence[RoundDetail]) -> str:
    """Accuracy and loss per round and class with ±1 standard error of the noise."""
    with _drawing():
        return _estimates_figure(details)


def _estimates_figure(details: Sequence[RoundDetail]) -> str:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    classes = classes_of(details)
    colors = _colors(classes)
    fig, (acc_ax, loss_ax) = _figure(8.5, 5.2, rows=2, sharex=True)
    clipped = 0
    for metric, ax in (("accuracy", acc_ax), ("loss", loss_ax)):
        for cls in classes:
            for kind in ("eval", "ab:A", "ab:B"):
                aggs = [(d.summary.number, d.classes[cls]) for d in details if d.summary.kind == kind
                        and cls in d.classes and getattr(d.classes[cls], metric) is not None]
                if not aggs:
                    continue
                clipped += sum(metric in a.clamped for _, a in aggs)
                ax.errorbar([n + _OFFSET[kind] for n, _ in aggs], [getattr(a, metric) for _, a in aggs],
                            yerr=[getattr(a, f"{metric}_se") or 0.0 for _, a in aggs],
                            color=colors[cls], marker=_MARKER[kind], capsize=3,
                            linestyle="-" if kind == "eval" else "none", markersize=5,
                            markerfacecolor="white" if kind == "ab:A" else colors[cls])
        ax.set_ylabel(f"{metric} (private estimate)")
        ax.grid(alpha=0.3)
    acc_ax.set_ylim(-0.02, 1.05)
    loss_ax.set_ylim(bottom=0.0)
    loss_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    loss_ax.set_xlabel("round")
    acc_ax.set_title("Accuracy and loss per device class and round (± 1 standard error of the noise)")
    handles = [Line2D([], [], color=colors[c], marker="o", label=_label(c)) for c in classes]
    kinds = {d.summary.kind for d in details}
    handles += [Line2D([], [], color="grey", marker=_MARKER[k], linestyle="none", label=_KIND_LABEL[k],
                       markerfacecolor="white" if k == "ab:A" else "grey") for k in ("eval", "ab:A", "ab:B") if k in kinds]
    acc_ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    if clipped:
        loss_ax.annotate(f"{clipped} estimate(s) fell outside the possible range (noise, or a hostile report) "
                         "and are shown at its edge", xy=(0, -0.32), xycoords="axes fraction", fontsize=8)
    return _svg(fig)


def latency_figure(hists: Mapping[str, Sequence[int]], edges_ms: Sequence[float],
                   predicted_ms: Mapping[str, float], title: str) -> str:
    """Measured latency per class (merged histograms of native devices) above predicted latency per class."""
    with _drawing():
        return _latency_figure(hists, edges_ms, predicted_ms, title)


def _latency_figure(hists, edges_ms, predicted_ms, title) -> str:
    measured = {c: h for c, h in hists.items() if sum(h)}
    used = [i for h in measured.values() for i, n in enumerate(h) if n]
    values = [edges_ms[max(i - 1, 0)] for i in used] + [edges_ms[i] for i in used] + list(predicted_ms.values())
    values = [v for v in values if v > 0 and math.isfinite(v)]
    if not values:
        return ""
    unit, scale = duration_unit(math.sqrt(min(values) * max(values)))
    lo, hi = min(values) / scale / 1.6, max(values) / scale * 1.6
    classes = sorted(set(measured) | set(predicted_ms))
    colors = _colors(classes)
    rows = (1 if measured else 0) + (1 if predicted_ms else 0)
    fig, axes = _figure(8.5, 2.4 * rows + 0.4, rows=rows, sharex=True)
    ax_iter = iter(axes)
    if measured:
        ax = next(ax_iter)
        lines = []
        for cls, hist in sorted(measured.items()):
            lower = [edges_ms[0] / 1.29] + list(edges_ms[:-1])
            xs = [x / scale for pair in zip(lower, edges_ms) for x in pair]
            ys = [n for n in hist for _ in (0, 1)]
            lines += ax.plot(xs, ys, color=colors[cls], label=_label(cls))
        if any(h[0] for h in measured.values()):  # the first bucket also holds every faster run
            ax.axvline(edges_ms[0] / scale, color="#555", linestyle=":", linewidth=1)
            ax.annotate(f"histogram floor: runs ≤ {edges_ms[0] / scale:g} {unit} counted here",
                        (edges_ms[0] / scale, 1.0), xycoords=("data", "axes fraction"), xytext=(4, -12),
                        textcoords="offset points", fontsize=7, color="#555")
        ax.set_ylabel("timed runs")
        ax.set_title(_label(title))
        _legend(ax, lines, title="measured")
        ax.grid(alpha=0.3)
    if predicted_ms:
        ax = next(ax_iter)
        names = sorted(predicted_ms)
        ax.scatter([predicted_ms[c] / scale for c in names], range(len(names)), marker="D",
                   color=[colors[c] for c in names], zorder=3)
        ax.set_yticks(range(len(names)), [_label(c) for c in names], fontsize=8)
        ax.set_ylim(-0.7, len(names) - 0.3)
        ax.set_title("predicted latency per inference (cost model, not a measurement)", fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    from matplotlib.ticker import FormatStrFormatter, FuncFormatter

    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(FuncFormatter(_two_and_five))
    axes[-1].set_xlabel(f"latency per inference ({unit})")
    return _svg(fig)


def _two_and_five(value: float, _pos: int) -> str:
    """Minor tick labels of a log axis at 2 and 5 of each decade (enough to read a value off)."""
    if value <= 0:
        return ""
    lead = round(value / 10 ** math.floor(math.log10(value)), 6)
    return f"{value:g}" if lead in (2.0, 5.0) else ""


def compile_figure(details: Sequence[RoundDetail]) -> str:
    """Median compile time per class and round (log scale: a cache hit is 100x faster than a compile)."""
    with _drawing():
        return _compile_figure(details)


def _compile_figure(details: Sequence[RoundDetail]) -> str:
    classes = [c for c in classes_of(details) if c != OVERALL]
    colors = _colors(classes)
    rounds = [d for d in details if any(c in d.classes and d.classes[c].compile_ms_median for c in classes)]
    if not rounds or not classes:
        return ""
    fig, (ax,) = _figure(8.5, 2.8)
    width, bars = 0.8 / len(classes), []
    for i, cls in enumerate(classes):
        xs = [j + (i - (len(classes) - 1) / 2) * width for j, d in enumerate(rounds) if cls in d.classes
              and d.classes[cls].compile_ms_median]
        ys = [d.classes[cls].compile_ms_median for d in rounds if cls in d.classes and d.classes[cls].compile_ms_median]
        bars.append(ax.bar(xs, ys, width=width, color=colors[cls], label=_label(cls)))
    labels = [f"{d.summary.number}" + {"ab:A": " A", "ab:B": " B"}.get(d.summary.kind, "") for d in rounds]
    ax.set_xticks(range(len(rounds)), labels)
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("median compile (ms)")
    ax.set_title("Compile time on the device (cache hits load in milliseconds)")
    _legend(ax, bars)
    ax.grid(alpha=0.3, axis="y")
    return _svg(fig)
