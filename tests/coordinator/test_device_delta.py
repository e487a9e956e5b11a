"""A device takes a version as a signed delta from the one it holds, or refuses it: a tampered delta,
one for another parent, a truncated or oversized one, a replay. Each refusal is a typed reply, and
the device holds and runs exactly what it did before."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Context, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from cuvil.compiler.bundle import bundle_bytes, load_private_key, make_delta  # noqa: E402
from cuvil.coordinator import messages  # noqa: E402
from cuvil.coordinator.client_app import make_client_app  # noqa: E402
from cuvil.coordinator.device import DeviceState  # noqa: E402
from cuvil.coordinator.device_versions import read_versions  # noqa: E402
from cuvil.coordinator.fleet import device_data, host_class  # noqa: E402
from cuvil.coordinator.messages import Code  # noqa: E402
from cuvil.coordinator.rounds import BundleRef  # noqa: E402
from cuvil.fleet_example import digits_mlp  # noqa: E402

from .fleet_helpers import make_keys  # noqa: E402

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
NAME = "digits-mlp"


def _version(graph, key, version: str, step: float = 0.0, seed: int = 0) -> BundleRef:
    gen = np.random.default_rng(seed)
    moved = {n: (w + gen.normal(0, step, w.shape)).astype(w.dtype) if step else w for n, w in graph.constants.items()}
    return BundleRef.from_bytes(bundle_bytes(graph.replace(constants=moved), key, name=NAME, version=version))


@pytest.fixture()
def world(tmp_path):
    keys, second = make_keys(tmp_path), make_keys(tmp_path, "second")
    key, other_key = load_private_key(keys.private_path), load_private_key(second.private_path)
    g = digits_mlp(0, epochs=2)
    v1, v2, v3 = _version(g, key, "1"), _version(g, key, "2", 1e-3, 1), _version(g, key, "3", 2e-3, 2)
    v1_other = _version(g, other_key, "1")  # v1's content, signed by the other trusted key: other bytes
    assert v1_other.content_hash == v1.content_hash and v1_other.data != v1.data
    state = DeviceState.provision(tmp_path / "dev", "dev-1", host_class(), [keys.public_path, second.public_path],
                                  data=device_data(0, 4))
    ctx = Context(run_id=1, node_id=7, node_config={"state-dir": str(state.root)}, state=RecordDict(), run_config={})
    app = make_client_app()
    assert not _activate(app, ctx, v1, bundle=v1.data).has_error()
    return app, ctx, state, key, other_key, v1, v2, v3, v1_other


def _activate(app, ctx, target: BundleRef, bundle: bytes | None = None, delta: bytes | None = None) -> Message:
    cfg = {"bundle-hash": target.content_hash, "model": NAME, "action": "activate", "base-hash": ""}
    return app(Message(messages.evaluate_request(cfg, bundle, delta), 7, messages.ACTIVATE), ctx)


def _snapshot(state: DeviceState):
    return read_versions(state), state.held_hashes()


def _refused(reply: Message, code: int, word: str) -> None:
    assert reply.has_error() and reply.error.code == code and reply.error.reason.endswith(word), reply.error.reason


def test_a_delta_from_the_held_version_installs_the_exact_next_bundle_and_activates_it(world):
    app, ctx, state, key, _, v1, v2, *_ = world
    delta = make_delta(v1.data, v2.data, key)
    assert len(delta) < len(v2.data)
    reply = _activate(app, ctx, v2, delta=delta)
    assert not reply.has_error()
    info = messages.reply_payload(reply)
    assert (info["active"], info["previous"], info["bundle_was_cached"]) == (v2.content_hash, v1.content_hash, 0)
    assert state.bundle_path(v2.content_hash).read_bytes() == v2.data


def test_a_tampered_delta_is_refused_and_nothing_changes(world):
    app, ctx, state, key, _, v1, v2, *_ = world
    before = _snapshot(state)
    delta = bytearray(make_delta(v1.data, v2.data, key))
    for at in (len(delta) - 5, 150, 30):
        bad = bytearray(delta)
        bad[at] ^= 0x40
        _refused(_activate(app, ctx, v2, delta=bytes(bad)), Code.DELTA_REJECTED, "delta_rejected")
    assert _snapshot(state) == before


def test_a_delta_for_another_parent_is_refused_or_answered_with_a_request_for_the_bundle(world):
    app, ctx, state, key, other_key, v1, v2, v3, v1_other = world
    before = _snapshot(state)
    # the parent's content, but bytes the device does not hold (another signer): refused
    _refused(_activate(app, ctx, v2, delta=make_delta(v1_other.data, v2.data, other_key)), Code.DELTA_REJECTED,
             "delta_wrong_parent")
    # a parent the device does not hold at all: it asks for the full bundle
    _refused(_activate(app, ctx, v3, delta=make_delta(v2.data, v3.data, key)), Code.DELTA_PARENT_MISSING,
             "delta_parent_missing")
    # a delta that makes another version than the message announces
    _refused(_activate(app, ctx, v3, delta=make_delta(v1.data, v2.data, key)), Code.DELTA_REJECTED, "delta_rejected")
    assert _snapshot(state) == before


def test_truncated_or_oversized_deltas_are_refused(world):
    app, ctx, state, key, _, v1, v2, *_ = world
    before = _snapshot(state)
    delta = make_delta(v1.data, v2.data, key)
    for bad in (delta[:-1], delta[: len(delta) // 2], delta[:50], delta + bytes(64)):
        _refused(_activate(app, ctx, v2, delta=bad), Code.DELTA_REJECTED, "delta_rejected")
    _refused(_activate(app, ctx, v2, bundle=v2.data, delta=delta), Code.DELTA_REJECTED, "delta_rejected")
    assert _snapshot(state) == before


def test_a_replayed_delta_is_refused_and_the_active_version_stays(world):
    app, ctx, state, key, _, v1, v2, *_ = world
    delta = make_delta(v1.data, v2.data, key)
    assert not _activate(app, ctx, v2, delta=delta).has_error()
    cfg = {"bundle-hash": v1.content_hash, "model": NAME, "action": "revert"}
    assert not app(Message(messages.evaluate_request(cfg, None), 7, messages.ACTIVATE), ctx).has_error()
    before = _snapshot(state)
    assert before[0][NAME].active == v1.content_hash
    _refused(_activate(app, ctx, v2, delta=delta), Code.DELTA_REJECTED, "delta_replayed")
    assert _snapshot(state) == before
