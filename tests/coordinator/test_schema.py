"""The coordinator's check of reports: honest ones pass, implausible ones are refused, one device's
pull on a class estimate stays within its own weight."""

from __future__ import annotations

import itertools
import math

import pytest

from cuvil.coordinator.aggregate import OVERALL, aggregate_round
from cuvil.coordinator.schema import (
    MARGIN_SD, MAX_FLOOR_SIGMA, ReportBounds, check_report, device_weight)
from cuvil.edge_runtime.report import ReportError

from .helpers import device_report

Q = 256  # the protocol's quantum


def test_honest_reports_pass():
    for seed in range(40):
        metrics, _ = device_report(seed, accuracy=seed / 40)
        assert check_report(metrics).as_metrics() == metrics


@pytest.mark.parametrize("change, word", [
    ({"dp_correct": 999 * 400 * Q}, "correct"),  # the attack that pushed a fleet's accuracy to 999.999
    ({"dp_count": -5000 * Q}, "count"),
    ({"dp_count": 100_000 * Q}, "count"),
    ({"dp_loss": 10**15}, "loss"),
    ({"dp_quantum": 1}, "protocol"),
    ({"dp_loss_clip": 1e9}, "protocol"),
    ({"dp_sigma": 0.0}, "noise"),
    ({"dp_sigma": 1e6}, "noise"),
    ({"dp_epsilon_spent": -1.0}, "epsilon"),
    ({"latency_p50_ms": 5.0, "latency_p90_ms": 1.0}, "percentiles"),
    ({"latency_p99_ms": 1e12}, "percentiles"),
    ({"compile_ms": -3.0}, "compile"),
    ({"arena_bytes": 1 << 60}, "arena"),
])
def test_implausible_reports_are_refused(change, word):
    metrics, _ = device_report(1, 0.8)
    with pytest.raises(ReportError, match=word):
        check_report({**metrics, **change})


def test_correct_beyond_count_is_refused():
    metrics, _ = device_report(2, 0.8)
    count = 300 * Q
    check_report({**metrics, "dp_count": count, "dp_correct": count + 84 * Q})  # within the noise of a difference
    with pytest.raises(ReportError, match="exceeds the noisy count"):
        check_report({**metrics, "dp_count": count, "dp_correct": count + 90 * Q})


def test_latency_runs_are_bounded_by_the_request():
    metrics, _ = device_report(3, 0.8)  # 50 timed runs
    check_report(metrics, ReportBounds(latency_runs=50))
    with pytest.raises(ReportError, match="runs"):
        check_report(metrics, ReportBounds(latency_runs=10))
    hist = list(metrics["latency_hist"])
    hist[0] = -1
    with pytest.raises(ReportError, match="runs"):
        check_report({**metrics, "latency_hist": hist})


def test_less_noise_than_asked_is_refused():
    metrics, _ = device_report(4, 0.8)  # sigma 10
    with pytest.raises(ReportError, match="noise"):
        check_report(metrics, ReportBounds(sigma=20.0))


def test_one_device_moves_a_class_estimate_at_most_by_its_weight():
    honest = [device_report(seed, 0.5)[0] for seed in range(9)]  # 400 examples each, accuracy 0.5
    # The most extreme report the check admits: 512 examples + 6 sd of noise, every one of them correct.
    count = 572 * Q
    worst = check_report({**honest[0], "dp_count": count, "dp_correct": count, "dp_loss": 0}).as_metrics()
    for more in ({"dp_correct": count + Q}, {"dp_count": count + Q, "dp_correct": count + Q}):
        with pytest.raises(ReportError):
            check_report({**worst, **more})

    def accuracy(reports):
        agg = aggregate_round([{"device_id": f"d{i}", "profile": "x86", "emulated": False, "metrics": m}
                               for i, m in enumerate(reports)], [])
        return agg[OVERALL].accuracy

    before, after = accuracy(honest), accuracy(honest + [worst])
    weight = 572 / (9 * 400 + 572)  # the hostile device's share of the examples, by its own claim
    assert 0.45 < before < 0.55
    assert 0 < after - before < weight < 0.14


def _pooled(reports):
    return aggregate_round([{"device_id": f"d{i}", "profile": "x86", "emulated": False, "metrics": m}
                            for i, m in enumerate(reports)], [])[OVERALL]


def _corners(honest: dict, sigma: float, bounds: ReportBounds) -> list[dict]:
    """The extreme reports the check admits at noise ``sigma``: the count at -6σ, 0, as low as lets the
    other sums reach the top, or at the top; correct and loss at -6σ or as high as the count allows."""
    m = round(MARGIN_SD * sigma * Q)
    top, diff = 512 * Q + m, math.floor(m * math.sqrt(2))
    out = []
    for n in (-m, 0, top - diff, top):
        for c, loss in itertools.product((-m, min(top, n + diff)), repeat=2):
            metrics = {**honest, "dp_sigma": sigma, "dp_count": n, "dp_correct": c, "dp_loss": loss}
            out.append(check_report(metrics, bounds).as_metrics())  # each one is admitted
    return out


POOLS = {  # honest devices of a class: (reports, examples each, accuracy)
    "one small device": (1, 100, 0.9), "three devices (fuzz report)": (3, 400, 0.9),
    "one perfect device": (1, 50, 1.0), "nine devices": (9, 400, 0.5)}


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("sigma, asked", [(10.0, 0.0), (MAX_FLOOR_SIGMA, 0.0), (30.0, 30.0)])
def test_one_report_moves_an_estimate_by_at_most_its_weight_over_the_class_examples(pool, sigma, asked):
    """docs/privacy.md: with w = 512 + 2·6σ examples, one report moves a class's accuracy by at most
    w / n and its loss by at most B·w / n (n: the class's examples with it), takes no weight from the
    others, and leaves every estimate in its range."""
    devices, examples, accuracy = POOLS[pool]
    honest = [device_report(seed, accuracy, n=examples)[0] for seed in range(devices)]
    before = _pooled(honest)
    w = device_weight(sigma)
    for hostile in _corners(honest[0], sigma, ReportBounds(sigma=asked)):
        after = _pooled(honest + [hostile])
        assert after.examples >= before.examples, hostile
        for metric, scale in (("accuracy", 1.0), ("loss", 5.0)):
            moved = abs(getattr(after, metric) - getattr(before, metric))
            assert 0.0 <= getattr(after, metric) <= scale, (metric, hostile)
            assert moved <= scale * w / after.examples + 1e-12, (metric, moved, hostile)


def test_a_report_declaring_more_noise_than_asked_is_refused():
    """Its noise margin is its lever (the fuzzed report declared σ = 100 to an ask of the floor, and
    pushed a class's accuracy to 2.3): exactly the σ asked, or at most twice the default floor."""
    metrics, _ = device_report(5, 0.9)
    s = 100.0  # the fuzzed report: count at -6σ, correct as far above it as the check allowed
    evil = {**metrics, "dp_sigma": s, "dp_count": int(-6 * s * Q), "dp_loss": 0,
            "dp_correct": int((-6 * s + 6 * s * math.sqrt(2)) * Q) - Q}
    for report, bounds in ((evil, ReportBounds()), ({**metrics, "dp_sigma": MAX_FLOOR_SIGMA + 1}, ReportBounds()),
                           ({**metrics, "dp_sigma": 30.0}, ReportBounds(sigma=20.0))):
        with pytest.raises(ReportError, match="noise"):
            check_report(report, bounds)
    check_report({**metrics, "dp_sigma": MAX_FLOOR_SIGMA}, ReportBounds())
    check_report({**metrics, "dp_sigma": 30.0}, ReportBounds(sigma=30.0))
