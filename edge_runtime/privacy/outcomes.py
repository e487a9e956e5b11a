"""Per-example outcomes (correct, loss) of a classifier, each decided from its own output row alone.

Sensitivity holds per example only if no record can change another record's contribution: so
whether a row holds probabilities or logits is decided per row (never once per batch), a row that
is not finite, has the wrong length for the label, or is missing (the model failed on that example)
counts as incorrect with loss = +inf (clipped to the loss bound by the encoder).

:func:`outcomes` decides a table of equal-length rows with array operations along each row (a device
evaluates hundreds of examples per release, padding included); every decision and reduction stays
within its row, so the result per row is :func:`row_outcome`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PROBABILITY_TOLERANCE = 1e-3  # a non-negative row summing to 1 within this is taken as probabilities
LOSS_FLOOR_P = 1e-12  # the probability a loss is computed from is at least this (loss at most ~27.6 nats)


def row_outcome(row: np.ndarray | None, label: int) -> tuple[bool, float]:
    """(correct, loss in nats) of one example; (False, inf) for anything that is not a usable row."""
    if row is None:
        return False, float("inf")
    r = np.asarray(row, dtype=np.float64).reshape(-1)
    if not 0 <= label < r.size or not np.all(np.isfinite(r)):
        return False, float("inf")
    if np.all(r >= 0) and abs(r.sum() - 1.0) <= PROBABILITY_TOLERANCE:
        p = r
    else:
        e = np.exp(r - r.max())
        p = e / e.sum()
    return bool(r.argmax() == label), float(-np.log(np.clip(p[label], LOSS_FLOOR_P, 1.0)))


def outcomes(rows: Sequence[np.ndarray | None] | np.ndarray, labels: Sequence[int] | np.ndarray,
             ran: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(correct bools, losses) of equal length, each row decided as :func:`row_outcome` decides it.

    ``rows``: a sequence of rows (None for an example the model failed on), or a 2-D table of
    rows with ``ran`` marking the examples the model ran on.
    """
    if len(rows) != len(labels):
        raise ValueError("one output row per label")
    if not isinstance(rows, np.ndarray):
        sizes = {np.size(r) for r in rows if r is not None}
        if len(sizes) != 1:  # ragged rows, or none usable: row by row
            pairs = [row_outcome(r, int(y)) for r, y in zip(rows, labels)]
            return np.array([c for c, _ in pairs], dtype=bool), np.array([l for _, l in pairs], dtype=np.float64)
        ran = np.array([r is not None for r in rows], dtype=bool)
        (width,) = sizes
        rows = np.stack([np.asarray(r, np.float64).reshape(-1) if r is not None else np.zeros(width) for r in rows])
    return _table_outcomes(np.asarray(rows, np.float64).reshape(len(rows), -1),
                           np.asarray(labels, np.int64).reshape(-1),
                           np.ones(len(rows), bool) if ran is None else np.asarray(ran, bool))


def _table_outcomes(t: np.ndarray, labels: np.ndarray, ran: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n, width = t.shape
    if n == 0 or width == 0:  # no example, or no usable row at all
        return np.zeros(n, bool), np.full(n, np.inf)
    usable = ran & (labels >= 0) & (labels < width) & np.isfinite(t).all(axis=1)
    t = np.where(usable[:, None], t, 0.0)  # an unusable row's values never reach arithmetic below
    with np.errstate(over="ignore", invalid="ignore"):
        probs = (t >= 0).all(axis=1) & (np.abs(t.sum(axis=1) - 1.0) <= PROBABILITY_TOLERANCE)
        e = np.exp(t - t.max(axis=1, keepdims=True))
        p = np.where(probs[:, None], t, e / e.sum(axis=1, keepdims=True))
    at = np.arange(n), np.where(usable, labels, 0)
    loss = np.where(usable, -np.log(np.clip(p[at], LOSS_FLOOR_P, 1.0)), np.inf)
    return usable & (t.argmax(axis=1) == labels), loss
