"""The coordinator's check of a training reply: what an honest device sends passes, anything else is refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cuvil.coordinator.update_check import UpdateBounds, check_update
from cuvil.fleet_example import digits_mlp

BOUNDS = UpdateBounds(clip=2.0, max_examples=100)


@pytest.fixture(scope="module")
def graph():
    return digits_mlp(0, epochs=1)


def _honest(graph, norm: float = 1.0):
    """An update of L2 norm ``norm`` over every float32 weight, and the metrics of a device with σ = 10."""
    weights = {k: v for k, v in graph.constants.items() if v.dtype == np.float32}
    raw = {k: np.ones_like(v) for k, v in weights.items()}
    total = math.sqrt(sum(v.size for v in raw.values()))
    arrays = {k: (v * np.float32(norm / total)).astype(np.float32) for k, v in raw.items()}
    metrics = {"dp_count": 95, "dp_count_sigma": 10.0, "dp_epsilon_spent": 1.5, "dp_delta": 1e-6,
               "bundle_was_cached": 1}
    return metrics, arrays


def test_an_honest_reply_passes_with_its_metrics_typed(graph):
    metrics, arrays = _honest(graph, norm=2.0)  # exactly at the clip
    got = check_update({**metrics, "dp_count": -59}, arrays, graph, BOUNDS)  # 6σ below zero: still honest
    assert got == {**metrics, "dp_count": -59} and isinstance(got["dp_count"], int)
    assert check_update({**metrics, "dp_count": 160}, arrays, graph, BOUNDS)["dp_count"] == 160  # 100 + 6σ


@pytest.mark.parametrize("change, word", [
    ({"dp_count": 161}, "noisy count"), ({"dp_count": -61}, "noisy count"), ({"dp_count": 10**12}, "noisy count"),
    ({"dp_count_sigma": 0.0}, "count noise"), ({"dp_count_sigma": 1e6}, "count noise"),
    ({"dp_count_sigma": 21.0}, "count noise"),  # past a device floor's bound: 100 weighed a device as 1,112 examples
    ({"dp_count_sigma": math.nan}, "finite"), ({"dp_count": math.inf}, "finite"), ({"dp_epsilon_spent": -1.0}, "ε"),
    ({"dp_delta": 1.0}, "δ"), ({"bundle_was_cached": 7}, "bundle_was_cached"), ({"dp_count": "many"}, "finite"),
])
def test_implausible_metrics_are_refused(graph, change, word):
    metrics, arrays = _honest(graph)
    with pytest.raises(ValueError, match=word):
        check_update({**metrics, **change}, arrays, graph, BOUNDS)


def test_missing_or_extra_keys_are_refused(graph):
    metrics, arrays = _honest(graph)
    with pytest.raises(ValueError, match="schema"):
        check_update({**metrics, "accuracy": 1.0}, arrays, graph, BOUNDS)
    with pytest.raises(ValueError, match="schema"):
        check_update({k: v for k, v in metrics.items() if k != "dp_delta"}, arrays, graph, BOUNDS)


def test_updates_that_do_not_fit_the_model_or_the_clip_are_refused(graph):
    metrics, arrays = _honest(graph)
    name = next(iter(arrays))
    bad = {
        "longer than the clip": {**_honest(graph, norm=2.01)[1]},
        "non-finite": {**arrays, name: np.full_like(arrays[name], np.nan)},
        "infinite": {**arrays, name: np.full_like(arrays[name], np.inf)},
        "wrong shape": {**arrays, name: arrays[name].reshape(-1)[:-1]},
        "wrong dtype": {**arrays, name: arrays[name].astype(np.float64)},
        "unknown weight": {**arrays, "not-a-weight": np.zeros(3, np.float32)},
        "empty": {},
    }
    for what, update in bad.items():
        with pytest.raises(ValueError):
            check_update(metrics, update, graph, BOUNDS)
            pytest.fail(what)


def test_the_bounds_are_the_requests():
    assert UpdateBounds.of_request({"dp-sgd-update-clip": 3.0, "dp-sgd-max-examples": 40}) == UpdateBounds(3.0, 40)


def test_an_update_must_name_exactly_the_weights_the_round_trains(graph):
    """Some of the weights (each valid) once passed and made Flower's FedAvg raise for the whole run."""
    metrics, arrays = _honest(graph)
    with pytest.raises(ValueError, match="1 missing, 0 not trained"):
        check_update(metrics, {k: v for k, v in arrays.items() if k != "w1"}, graph, BOUNDS)
    last = UpdateBounds(clip=2.0, max_examples=100, train_layers=1)  # the round trains only w2 and b2
    with pytest.raises(ValueError, match="0 missing, 2 not trained"):
        check_update(metrics, arrays, graph, last)
    assert check_update(metrics, {k: arrays[k] for k in ("w2", "b2")}, graph, last) == metrics


@pytest.mark.parametrize("change, bounds", [
    ({"dp_epsilon_spent": 1e300}, BOUNDS),  # finite, yet no lineage can carry it
    ({"dp_epsilon_spent": 2.01}, UpdateBounds.of_request({"dp-epsilon": 2.0})),  # past what the round asked
    ({"dp_delta": 0.9999}, BOUNDS), ({"dp_delta": 2e-6}, BOUNDS),  # looser than the protocol's δ
])
def test_privacy_past_the_rounds_budget_or_the_protocols_delta_is_refused(graph, change, bounds):
    metrics, arrays = _honest(graph)
    with pytest.raises(ValueError, match="ε spent|δ must"):
        check_update({**metrics, **change}, arrays, graph, bounds)


def test_the_epsilon_bound_is_the_budget_asked_else_the_protocols_maximum(graph):
    from cuvil.edge_runtime.privacy.request import MAX_EPSILON

    metrics, arrays = _honest(graph)
    assert check_update({**metrics, "dp_epsilon_spent": 2.0}, arrays, graph,
                        UpdateBounds.of_request({"dp-epsilon": 2.0}))["dp_epsilon_spent"] == 2.0
    assert UpdateBounds.of_request({"dp-epsilon": 0.0}).epsilon == MAX_EPSILON  # 0: the device's own budget
    assert UpdateBounds.of_request({"dp-epsilon": 1e12}).epsilon == MAX_EPSILON
    assert UpdateBounds.of_request({"dp-sgd-train-layers": 2}).train_layers == 2


@pytest.mark.parametrize("train_layers", [0, 1, 2, 5])
def test_the_weights_required_are_the_ones_a_device_trains(graph, train_layers):
    """The coordinator's rule (no torch) and what Opacus' module trains on the device are the same."""
    pytest.importorskip("torch")
    from cuvil.edge_runtime.training.layers import trained_weights
    from cuvil.edge_runtime.training.torch_graph import TorchGraph

    from ..edge_runtime.training.helpers import cnn_graph

    for g in (graph, cnn_graph()):
        module = TorchGraph(g)
        module.train_only_last(train_layers)
        assert set(module.weights(trained_only=True)) == trained_weights(g, train_layers)
