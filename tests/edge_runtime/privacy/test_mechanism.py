"""Sensitivity by construction (property-based), decoding, and a black-box audit of the mechanism."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import beta

from cuvil.edge_runtime.privacy.accounting import epsilon_spent
from cuvil.edge_runtime.privacy.mechanism import (
    BASE_FAMILIES, NoisyReport, PrivacyParams, add_noise, decode_reports, encode_sums)
from cuvil.edge_runtime.privacy.rng import ChaChaRandom

P = PrivacyParams()
losses = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e9, 1e9))
examples = st.lists(st.tuples(st.booleans(), losses, st.integers(0, 7)), min_size=1, max_size=64)


def l2_change(encoder, data, drop):
    def sums(rows):
        c = [r[0] for r in rows]
        loss = [r[1] for r in rows]
        s, h = encoder(c, loss, P, [r[2] for r in rows], 8)
        return np.array([s[k] for k in BASE_FAMILIES] + list(h), dtype=float)

    rest = data[:drop] + data[drop + 1:]
    return np.linalg.norm(sums(data) - sums(rest)) if rest else np.linalg.norm(sums(data))


@settings(max_examples=300, deadline=None)
@given(examples, st.data())
def test_true_sensitivity_never_exceeds_the_declared_one(data, draw):
    drop = draw.draw(st.integers(0, len(data) - 1))
    declared = P.quantum * math.sqrt(len(BASE_FAMILIES) + 1)
    assert l2_change(encode_sums, data, drop) <= declared + 1e-9


def test_the_property_catches_an_encoder_without_loss_clipping():
    def unclipped(c, loss, params, lb, buckets):
        s, h = encode_sums(c, [0.0] * len(c), params, lb, buckets)
        s["loss"] = int(sum(min(abs(x), 1e6) for x in loss if x == x) / params.loss_clip * params.quantum)
        return s, h

    data = [(True, 50.0, 0), (False, 0.1, 1)]
    assert l2_change(unclipped, data, 0) > P.quantum * math.sqrt(4)


def test_decode_recovers_accuracy_and_reports_stderr():
    rng = ChaChaRandom(b"\x03" * 32)
    reports, n_correct, n = [], 0, 0
    gen = np.random.default_rng(1)
    for _ in range(100):
        correct = gen.random(200) < 0.8
        loss = gen.random(200)
        n_correct, n = n_correct + correct.sum(), n + 200
        reports.append(add_noise(*encode_sums(correct, loss, P), P, rng))
    est = decode_reports(reports)
    truth = n_correct / n
    assert abs(est["accuracy"].value - truth) < 5 * est["accuracy"].stderr
    assert 0 < est["accuracy"].stderr < 0.01
    assert abs(est["examples"].value - n) < 5 * est["examples"].stderr


def test_decode_gives_a_negative_count_no_weight_and_keeps_ratios_in_their_range():
    """One report with its count below 0 once took weight from the others (accuracy 2.3, or 583 with one
    honest device); it weighs 0 now, and a ratio outside its range is shown at the edge, flagged."""
    q = P.quantum
    honest = NoisyReport({"correct": 90 * q, "loss": 40 * q, "count": 100 * q}, (), P)
    hostile = NoisyReport({"correct": 25 * q, "loss": -60 * q, "count": -60 * q}, (), P)
    both = decode_reports([honest, hostile])
    assert both["examples"].value == 100.0  # not 40
    assert (both["accuracy"].value, both["loss"].value) == (1.0, 0.0)  # raw 115/100 and -20/100
    assert both["accuracy"].clamped and both["loss"].clamped
    alone = decode_reports([honest])
    assert (alone["accuracy"].value, alone["loss"].value) == (0.9, 0.4 * P.loss_clip)
    assert not alone["accuracy"].clamped and not alone["loss"].clamped


def clopper_pearson(k: int, n: int, conf: float) -> tuple[float, float]:
    a = (1 - conf) / 2
    lo = beta.ppf(a, k, n - k + 1) if k else 0.0
    hi = beta.ppf(1 - a, k + 1, n - k) if k < n else 1.0
    return lo, hi


def audit_epsilon_lower_bound(params: PrivacyParams, runs: int = 12000) -> float:
    """Lower-bound ε from runs on neighbours D, D' (D' has one more correct example)."""
    q = params.quantum
    c, loss = [True] * 40 + [False] * 10, [0.5] * 50
    d = encode_sums(c, loss, params)[0]
    d2 = encode_sums(c + [True], loss + [params.loss_clip], params)[0]
    threshold = d2["correct"] + params.sigma * q * 0.5
    rng = ChaChaRandom(b"\x05" * 32)
    hits = [sum(add_noise(s, (), params, rng).sums["correct"] >= threshold for _ in range(runs)) for s in (d2, d)]
    p_lo, _ = clopper_pearson(hits[0], runs, 0.999)
    _, p2_hi = clopper_pearson(hits[1], runs, 0.999)
    return math.log(max(p_lo - params.delta, 1e-12) / p2_hi)


def test_audit_passes_the_real_mechanism_and_flags_one_with_8x_less_noise():
    claimed = epsilon_spent([P.noise_multiplier(3)], P.delta)
    assert audit_epsilon_lower_bound(P) <= claimed
    weak = PrivacyParams(sigma=P.sigma / 8)
    assert audit_epsilon_lower_bound(weak) > claimed
