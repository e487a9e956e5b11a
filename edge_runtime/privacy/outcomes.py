"""Per-example outcomes (correct, loss) of a classifier, each decided from its own output row alone.

Sensitivity holds per example only if no record can change another record's contribution: so
whether a row holds probabilities or logits is decided per row (never once per batch), a row that
is not finite, has the wrong length for the label, or is missing (the model failed on that example)
counts as incorrect with loss = +inf (clipped to the loss bound by the encoder).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def row_outcome(row: np.ndarray | None, label: int) -> tuple[bool, float]:
    """(correct, loss in nats) of one example; (False, inf) for anything that is not a usable row."""
    if row is None:
        return False, float("inf")
    r = np.asarray(row, dtype=np.float64).reshape(-1)
    if not 0 <= label < r.size or not np.all(np.isfinite(r)):
        return False, float("inf")
    if np.all(r >= 0) and abs(r.sum() - 1.0) <= 1e-3:
        p = r
    else:
        e = np.exp(r - r.max())
        p = e / e.sum()
    return bool(r.argmax() == label), float(-np.log(np.clip(p[label], 1e-12, 1.0)))


def outcomes(rows: Sequence[np.ndarray | None], labels: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Row-by-row :func:`row_outcome`: (correct bools, losses) of equal length."""
    if len(rows) != len(labels):
        raise ValueError("one output row per label")
    pairs = [row_outcome(r, int(y)) for r, y in zip(rows, labels)]
    return np.array([c for c, _ in pairs], dtype=bool), np.array([l for _, l in pairs], dtype=np.float64)
