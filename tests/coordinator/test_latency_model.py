"""The latency cost model: features read off compiled code, its formula, and its fit."""

import pytest

from cuvil.coordinator import latency_model as lm
from cuvil.devices import load_profile

from .fleet_helpers import digits_mlp


def test_features_come_from_the_code_each_class_would_run():
    graph = digits_mlp()
    f2 = lm.code_features(graph, load_profile("x86-avx2"))
    f5 = lm.code_features(graph, load_profile("x86-avx512"))
    neon = lm.code_features(graph, load_profile("rpi5"))
    assert (f2.lanes, f5.lanes, neon.lanes) == (8, 16, 4)
    assert f2.flops == f5.flops == neon.flops > 64 * 16 * 2  # two GEMMs at batch 1
    assert all(0 < f.vector_share <= 1 for f in (f2, f5, neon))  # every class's code is vectorized
    assert neon.clock_ghz == 2.4 and f2.kernels >= 3


def test_prediction_follows_the_formula_and_scales_with_clock_and_lanes():
    cal = lm.Calibration(c_flop=1.0, c_byte=0.5, c_kernel=100.0, c_call=50.0)
    f = lm.CodeFeatures("p", flops=8000.0, bytes=1000.0, kernels=2, vector_share=1.0, lanes=8, clock_ghz=2.0)
    # 8000 / 8 + 0.5 * 1000 + 100 * 2 + 50 = 1750 cycles at 2 GHz
    assert lm.predict_ms(f, cal) == pytest.approx(1750 / 2e6)
    half_vector = lm.CodeFeatures("p", 8000.0, 1000.0, 2, vector_share=0.5, lanes=8, clock_ghz=2.0)
    assert half_vector.effective_lanes == pytest.approx(1 / (0.5 + 0.5 / 8))
    assert lm.predict_ms(half_vector, cal) > lm.predict_ms(f, cal)


def test_fit_recovers_known_constants():
    truth = lm.Calibration(c_flop=0.07, c_byte=0.01, c_kernel=180.0, c_call=400.0)
    samples = []
    for i, (flops, nbytes, kernels) in enumerate([(1e4, 2e3, 3), (1e6, 5e5, 8), (1e8, 1e7, 40), (5e5, 1e6, 12),
                                                  (3e7, 2e5, 25), (2e3, 1e3, 2)]):
        f = lm.CodeFeatures(f"m{i}", flops, nbytes, kernels, 0.6, 16 if i % 2 else 8, 2.6)
        samples.append((f, lm.predict_ms(f, truth)))
    fitted = lm.fit(samples)
    for term in lm.COST_TERMS:
        assert getattr(fitted, term) == pytest.approx(getattr(truth, term), rel=1e-3)
    assert max(abs(e) for e in lm.relative_errors(samples, fitted)) < 1e-3


def test_the_shipped_calibration_predicts_microseconds_for_a_tiny_model():
    ms, basis = lm.predict_graph(digits_mlp(), "rpi5")
    assert 1e-4 < ms < 1.0 and basis["features"]["profile"] == "rpi5"


def test_a_profile_without_a_clock_cannot_be_predicted():
    from dataclasses import replace

    with pytest.raises(lm.PredictionError, match="clock_ghz"):
        lm.code_features(digits_mlp(), replace(load_profile("rpi5"), clock_ghz=None))
