"""Sensitivity per example through the real device path, with adversarial records and models.

Each drawn case evaluates a dataset D and its neighbour D minus one record on a provisioned device
(real bundle, compiled model, ``evaluate``), with the noise switched off so the reply is the true
sums; every sum must move by at most the quantum Q, and the report by at most Q·sqrt(3) in L2,
whatever the other records and the model are.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuvil.coordinator.device import DeviceState, EvalRequest, evaluate
from cuvil.coordinator.fleet import device_data, host_class
from cuvil.coordinator.rounds import BundleRef
from cuvil.edge_runtime.privacy import release as release_mod
from cuvil.edge_runtime.privacy.ledger import PrivacyFloors
from cuvil.edge_runtime.privacy.mechanism import NoisyReport, PrivacyParams, encode_sums
from cuvil.edge_runtime.privacy.outcomes import outcomes

from .adversary_helpers import export, linear, trigger
from .fleet_helpers import make_bundle, make_keys

Q = PrivacyParams().quantum
X, Y = device_data(0, 4)
TARGET = X[5]


def _pool() -> np.ndarray:
    """Ordinary records, then adversarial ones: NaN, ±inf, huge, and the trigger model's target."""
    odd = np.stack([np.full((1, 8, 8), v, np.float32) for v in (np.nan, np.inf, -np.inf, 3e38, -3e38, 0.0)])
    half_nan = X[0].copy()
    half_nan[0, 0, :4] = np.nan
    return np.concatenate([X[:8], odd, half_nan[None], TARGET[None]])


POOL = _pool()
LABELS = [0, 1, 3, 9, 10, 1000, -1]  # a label the model has no class for counts as incorrect, never an error
_IDS = itertools.count()


@pytest.fixture(scope="module")
def devices(tmp_path_factory):
    root = tmp_path_factory.mktemp("sensitivity")
    keys = make_keys(root)
    refs = {"softmax": BundleRef.from_file(make_bundle(root, keys)),
            "logits": BundleRef.from_file(export(linear(10, softmax=False), root / "logits.cuvil", keys)),
            "three": BundleRef.from_file(export(linear(3, softmax=True), root / "three.cuvil", keys)),
            "trigger": BundleRef.from_file(export(trigger(TARGET), root / "trigger.cuvil", keys))}
    out = {}
    for name, ref in refs.items():
        state = DeviceState.provision(root / name, name, host_class(), [keys.public_path], data=(X[:2], Y[:2]),
                                      floors=PrivacyFloors(epsilon=1e5))
        model, _ = state.accept_bundle(ref.data, ref.content_hash)
        out[name] = (state, model)
    return out


def true_sums(state: DeviceState, model, rows: list[tuple[int, int]]) -> np.ndarray:
    """The device's report on ``rows`` (pool index, label) with the noise off: its true sums."""
    x = POOL[[i for i, _ in rows]] if rows else np.zeros((0, 1, 8, 8), np.float32)
    y = np.array([label for _, label in rows], np.int64)
    np.savez(state.root / "data.npz", x=x, y=y)
    req = EvalRequest(model.content_hash, "ds", f"s{next(_IDS)}", latency_runs=1, latency_warmup=0)
    report = evaluate(state, model, req, bundle_was_cached=True)
    return np.array([report.dp_correct, report.dp_loss, report.dp_count], dtype=float)


def _no_noise(sums, hist, params, rng):
    return NoisyReport(dict(sums), tuple(hist), params, 3 + (1 if hist else 0))


records = st.lists(st.tuples(st.integers(0, len(POOL) - 1), st.sampled_from(LABELS)), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["softmax", "logits", "three", "trigger"]), records, st.data())
def test_removing_any_record_moves_each_sum_by_at_most_its_sensitivity(devices, model_name, rows, data):
    drop = data.draw(st.integers(0, len(rows) - 1))
    state, model = devices[model_name]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(release_mod, "add_noise", _no_noise)
        full = true_sums(state, model, rows)
        neighbour = true_sums(state, model, rows[:drop] + rows[drop + 1:])
    change = np.abs(full - neighbour)
    assert np.all(change <= Q), (model_name, rows, drop, change)
    assert np.linalg.norm(change) <= Q * math.sqrt(3) + 1e-9


def test_the_trigger_model_singles_out_its_target(devices):
    """The adversarial model is what it claims: non-finite output on the target record only."""
    state, model = devices["trigger"]
    from cuvil.edge_runtime.compile import compile_graph

    session = compile_graph(model.graph, target="host", batch=1)
    out = [next(iter(session.run({"pixels": POOL[i:i + 1]}).values())) for i in (0, 1, len(POOL) - 1)]
    assert np.all(np.isfinite(out[0])) and np.all(np.isfinite(out[1])) and not np.all(np.isfinite(out[2]))


def _batch_outcomes(rows, labels):
    """The old rule: one probabilities-or-logits decision for the whole batch."""
    out = np.concatenate([np.asarray(r, np.float64).reshape(1, -1) for r in rows])
    if not (np.all(out >= 0) and np.allclose(out.sum(axis=1), 1.0, atol=1e-3)):
        e = np.exp(out - out.max(axis=1, keepdims=True))
        out = e / e.sum(axis=1, keepdims=True)
    labels = np.asarray(labels)
    return out.argmax(axis=1) == labels, -np.log(np.clip(out[np.arange(len(labels)), labels], 1e-12, 1.0))


@pytest.mark.parametrize("rule, within", [(outcomes, True), (_batch_outcomes, False)])
def test_the_check_catches_a_batch_level_probability_decision(rule, within):
    """One non-finite row (a NaN record, or the trigger's target) once re-softmaxed every other row."""
    gen = np.random.default_rng(0)
    probs = [p / p.sum() for p in gen.random((30, 10)) ** 4]
    labels = list(gen.integers(0, 10, 30))
    params = PrivacyParams()
    with_nan = encode_sums(*rule(probs + [np.full(10, np.nan)], labels + [1]), params)[0]
    without = encode_sums(*rule(probs, labels), params)[0]
    moved = max(abs(with_nan[k] - without[k]) for k in with_nan)
    assert (moved <= Q) is within
