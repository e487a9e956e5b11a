"""The ClientApp's train and activate handlers called directly, under hostile requests: typed refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("opacus")

from flwr.app import Context, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from cuvil import api  # noqa: E402
from cuvil.coordinator import messages  # noqa: E402
from cuvil.coordinator.client_app import make_client_app  # noqa: E402
from cuvil.coordinator.device import DeviceState  # noqa: E402
from cuvil.coordinator.device_train import config_keys  # noqa: E402
from cuvil.coordinator.fleet import device_data, host_class  # noqa: E402
from cuvil.coordinator.messages import Code  # noqa: E402
from cuvil.coordinator.rounds import BundleRef  # noqa: E402
from cuvil.coordinator.update_check import UpdateBounds, check_update  # noqa: E402
from cuvil.edge_runtime.training import DpSgdConfig  # noqa: E402
from cuvil.fleet_example import digits_mlp  # noqa: E402

from .fleet_helpers import make_bundle, make_keys  # noqa: E402

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
DP = DpSgdConfig(sample_rate=0.1, noise_multiplier=2.0, steps=3, batch_size=8, update_clip=2.0)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-client")
    keys, stranger = make_keys(root), make_keys(root, "stranger")
    v1 = BundleRef.from_file(make_bundle(root, keys))
    v2 = BundleRef.from_file(make_bundle(root, keys, version="2", seed=1, epochs=1))
    (root / "forged").mkdir()
    forged = BundleRef.from_file(make_bundle(root / "forged", stranger, version="9"))
    graph = digits_mlp(0, epochs=1)
    graph = graph.replace(constants={k: np.full_like(v, np.nan) if v.dtype == np.float32 else v
                                     for k, v in graph.constants.items()})
    nan = BundleRef.from_file(api.export(graph, root / "nan.cuvil", keys.private_path, name="digits-mlp",
                                         version="nan").path)
    return root, keys, v1, v2, forged, nan


@pytest.fixture
def device(world, tmp_path):
    root, keys = world[0], world[1]
    state = DeviceState.provision(tmp_path / "dev", "dev-1", host_class(), [keys.public_path], data=device_data(0, 4))
    ctx = Context(run_id=1, node_id=7, node_config={"state-dir": str(state.root)}, state=RecordDict(), run_config={})
    return make_client_app(), ctx, state


def _train(device, ref, release="t-1", push=True, **overrides):
    app, ctx, _ = device
    cfg = {"bundle-hash": ref.content_hash, "release-id": release, "round": 2, "dataset": "digits-local",
           **config_keys(DP), **overrides}
    return app(Message(messages.train_request(cfg, ref.data if push else None), 7, messages.TRAIN), ctx)


def _switch(device, ref, action="activate", push=False, **overrides):
    app, ctx, _ = device
    cfg = {"bundle-hash": ref.content_hash, "model": ref.name, "action": action, "base-hash": "", **overrides}
    return app(Message(messages.evaluate_request(cfg, ref.data if push else None), 7, messages.ACTIVATE), ctx)


def _refusal(reply) -> tuple[int, str]:
    assert reply.has_error()
    return reply.error.code, reply.error.reason


def test_a_round_returns_an_update_the_coordinator_accepts(world, device):
    v1 = world[2]
    reply = _train(device, v1)
    assert not reply.has_error()
    metrics = check_update(messages.reply_payload(reply), messages.reply_arrays(reply), v1.graph(),
                           UpdateBounds(DP.update_clip, DP.max_examples))
    assert metrics["dp_epsilon_spent"] > 0 and metrics["bundle_was_cached"] == 0


@pytest.mark.parametrize("key, value", [("dp-sgd-learning-rate", math.nan), ("dp-sgd-noise-multiplier", 0.01),
                                        ("dp-sgd-sample-rate", 2.0), ("dp-sgd-steps", 1e9), ("dp-sgd-steps", 1.5)])
def test_hostile_dp_sgd_parameters_are_refused_before_anything_is_charged(world, device, key, value):
    code, word = _refusal(_train(device, world[2], **{key: value}))
    assert (code, word) == (Code.PARAMS_REJECTED, "DP_PARAMS_REJECTED: out_of_range")
    assert device[2].ledger().releases(device[2].dataset_name) == 0


def test_a_malformed_train_request_is_a_typed_refusal_not_an_internal_error(world, device):
    app, ctx, state = device
    v1 = world[2]
    for cfg, reason in (({"bundle-hash": v1.content_hash, **config_keys(DP)}, "missing"),  # no release-id
                        ({"bundle-hash": v1.content_hash, "release-id": "t-e", "dp-epsilon": "lots", **config_keys(DP)},
                         "wrong_type"),
                        ({"bundle-hash": v1.content_hash, "release-id": "t-e", "dp-epsilon": "1e400", **config_keys(DP)},
                         "wrong_type")):
        reply = app(Message(messages.train_request(cfg, v1.data), 7, messages.TRAIN), ctx)
        assert _refusal(reply) == (Code.PARAMS_REJECTED, f"DP_PARAMS_REJECTED: {reason}")
    assert state.ledger().releases(state.dataset_name) == 0


def test_a_bundle_from_an_untrusted_signer_or_under_another_hash_is_refused(world, device):
    v1, v2, forged = world[2], world[3], world[4]
    assert _refusal(_train(device, forged))[0] == Code.SIGNATURE_REJECTED
    app, ctx, state = device
    cfg = {"bundle-hash": v2.content_hash, "release-id": "t-x", **config_keys(DP)}  # v1's bytes under v2's hash
    assert _refusal(app(Message(messages.train_request(cfg, v1.data), 7, messages.TRAIN), ctx))[0] == \
        Code.SIGNATURE_REJECTED
    assert state.held_hashes() == [] and state.ledger().releases(state.dataset_name) == 0


def test_nan_weights_give_no_update(world, device):
    code, word = _refusal(_train(device, world[5]))
    assert (code, word) == (Code.CANNOT_TRAIN, "CANNOT_TRAIN: cannot_train")


def test_a_round_past_the_budget_is_refused(world, device):
    code, _ = _refusal(_train(device, world[2], **{"dp-sgd-noise-multiplier": 0.3, "dp-sgd-steps": 10_000,
                                                   "dp-sgd-sample-rate": 1.0}))
    assert code == Code.BUDGET_EXHAUSTED


def test_activate_and_revert_switch_held_versions_and_refuse_unknown_ones(world, device):
    v1, v2 = world[2], world[3]
    assert _refusal(_switch(device, v1))[0] == Code.BUNDLE_MISSING  # not held, not pushed
    assert _refusal(_switch(device, v2, push=True, **{"base-hash": "ab" * 32}))[0] == Code.DEVICE_ERROR  # base unknown
    assert _refusal(_switch(device, v2, push=True, action="explode"))[0] == Code.DEVICE_ERROR
    assert messages.reply_payload(_switch(device, v1, push=True))["active"] == v1.content_hash
    assert _refusal(_switch(device, v1, action="revert"))[0] == Code.DEVICE_ERROR  # nothing to revert to
    got = messages.reply_payload(_switch(device, v2, push=True))
    assert (got["active"], got["previous"]) == (v2.content_hash, v1.content_hash)
    other = world[5]  # held, but not the previous version: a revert to it is refused
    assert _refusal(_switch(device, other, push=True, action="revert"))[0] == Code.DEVICE_ERROR
    got = messages.reply_payload(_switch(device, v1, action="revert"))
    assert (got["active"], got["previous"], got["bundle_was_cached"]) == (v1.content_hash, v2.content_hash, 1)
