"""Outcomes decided as a table are each row's own: the same as :func:`row_outcome` row by row."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.edge_runtime.privacy.outcomes import outcomes, row_outcome


def _rows() -> list[np.ndarray]:
    gen = np.random.default_rng(0)
    probs = gen.random((20, 10)) ** 3
    probs /= probs.sum(axis=1, keepdims=True)
    logits = gen.standard_normal((20, 10)) * 4
    odd = [np.full(10, v) for v in (np.nan, np.inf, -np.inf, 3e38, -3e38, 0.0, 0.1)]
    half_nan = probs[0].copy()
    half_nan[3] = np.nan
    negative_sum_one = np.array([1.5, -0.5] + [0.0] * 8)
    return [*probs, *logits, *odd, half_nan, negative_sum_one]


def test_a_table_is_decided_row_by_row():
    rows = _rows()
    labels = [i % 12 - 1 for i in range(len(rows))]  # -1 and 10 are no class of these rows
    correct, loss = outcomes(np.stack(rows).astype(np.float32), labels)
    for i, (row, label) in enumerate(zip(rows, labels)):
        want_c, want_l = row_outcome(np.float32(row), label)
        assert correct[i] == want_c, i
        assert loss[i] == pytest.approx(want_l, rel=1e-12, abs=0.0) or loss[i] == want_l == np.inf, i


def test_rows_that_did_not_run_count_as_incorrect_with_infinite_loss():
    table = np.eye(3, dtype=np.float32)
    correct, loss = outcomes(table, [0, 1, 2], ran=np.array([True, False, True]))
    assert correct.tolist() == [True, False, True]
    assert loss[1] == np.inf and loss[0] == loss[2] == 0.0


def test_a_list_with_missing_and_ragged_rows_matches_row_outcome():
    rows = [np.array([0.2, 0.8]), None, np.array([3.0, 1.0, 0.0]), np.array([0.0, 1.0])]
    labels = [1, 0, 2, 1]
    correct, loss = outcomes(rows, labels)
    assert correct.tolist() == [row_outcome(r, y)[0] for r, y in zip(rows, labels)]
    assert loss.tolist() == [row_outcome(r, y)[1] for r, y in zip(rows, labels)]
    same_size = [np.array([0.2, 0.8]), None, np.array([5.0, 1.0])]
    correct, loss = outcomes(same_size, [1, 1, 0])
    assert correct.tolist() == [True, False, True] and loss[1] == np.inf


def test_no_usable_column_at_all():
    correct, loss = outcomes(np.zeros((4, 0), np.float32), [0, 1, 2, 3], ran=np.zeros(4, bool))
    assert not correct.any() and np.all(loss == np.inf)


def test_rows_and_labels_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="one output row per label"):
        outcomes(np.zeros((3, 10)), [1, 2])
