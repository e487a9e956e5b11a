"""The ClientApp called directly (no runtime): verification mod, typed refusals, cache, privacy."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from flwr.app import Context, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from cuvil.coordinator import messages  # noqa: E402
from cuvil.coordinator.client_app import make_client_app  # noqa: E402
from cuvil.coordinator.device import DeviceState  # noqa: E402
from cuvil.coordinator.fleet import device_data, host_class  # noqa: E402
from cuvil.coordinator.messages import Code  # noqa: E402
from cuvil.coordinator.rounds import BundleRef  # noqa: E402
from cuvil.coordinator.schema import REPORT_KEYS, ReportBounds, check_report  # noqa: E402

from .fleet_helpers import make_bundle, make_keys  # noqa: E402

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("client")
    keys = make_keys(root)
    stranger = make_keys(root, "stranger")
    ref = BundleRef.from_file(make_bundle(root, keys))
    (root / "forged").mkdir()
    forged = BundleRef.from_file(make_bundle(root / "forged", stranger, version="9"))
    state = DeviceState.provision(root / "dev", "dev-1", host_class(), [keys.public_path], data=device_data(0, 4))
    ctx = Context(run_id=1, node_id=7, node_config={"state-dir": str(state.root)}, state=RecordDict(), run_config={})
    return make_client_app(), ctx, state, ref, forged


def _eval(app, ctx, ref, release="rel-1", push=True):
    cfg = {"bundle-hash": ref.content_hash, "dataset": "digits-local", "release-id": release, "round": 1,
           "latency-runs": 10, "latency-warmup": 2}
    msg = Message(messages.evaluate_request(cfg, ref.data if push else None), 7, messages.EVALUATE)
    return app(msg, ctx)


def test_device_info_names_profile_and_held_bundles(setup):
    app, ctx, state, ref, _ = setup
    reply = app(Message(messages.device_info_request(), 7, messages.DEVICE_INFO), ctx)
    info = messages.reply_payload(reply)
    assert info["device_id"] == "dev-1" and info["profile"] == state.profile and info["emulated"] == 0
    assert {"cpu", "features", "runtime_version", "held_bundles", "free_memory_bytes"} <= set(info)


def test_evaluate_reports_the_fixed_schema_then_hits_the_cache(setup):
    app, ctx, state, ref, _ = setup
    first = messages.reply_payload(_eval(app, ctx, ref, "rel-a"))
    assert set(first) == set(REPORT_KEYS) and first["bundle_was_cached"] == 0 and first["latency_emulated"] == 0
    # what the device built, through Flower's MetricRecord, is what the coordinator's check accepts
    assert check_report(first, ReportBounds(latency_runs=10)).as_metrics() == first
    assert ref.content_hash in state.held_hashes()
    second = messages.reply_payload(_eval(app, ctx, ref, "rel-b", push=False))
    assert second["cache_hit"] == 1 and second["bundle_was_cached"] == 1
    assert second["dp_epsilon_spent"] > first["dp_epsilon_spent"]


def test_repeated_request_is_answered_from_the_cached_noisy_reply(setup):
    app, ctx, _, ref, _ = setup
    a = messages.reply_payload(_eval(app, ctx, ref, "rel-same", push=False))
    b = messages.reply_payload(_eval(app, ctx, ref, "rel-same", push=False))
    assert (a["dp_correct"], a["dp_loss"], a["dp_count"]) == (b["dp_correct"], b["dp_loss"], b["dp_count"])
    assert a["dp_epsilon_spent"] == b["dp_epsilon_spent"]


def test_a_bundle_from_an_untrusted_signer_is_refused_before_any_handler(setup):
    app, ctx, state, _, forged = setup
    reply = _eval(app, ctx, forged, "rel-forged")
    assert reply.has_error() and reply.error.code == Code.SIGNATURE_REJECTED
    assert forged.content_hash not in state.held_hashes()


def test_a_bundle_the_device_does_not_hold_is_asked_for(setup):
    app, ctx, _, _, forged = setup
    reply = _eval(app, ctx, forged, "rel-missing", push=False)
    assert reply.has_error() and reply.error.code == Code.BUNDLE_MISSING


def test_spent_budget_is_a_typed_error_without_metrics(setup):
    app, ctx, state, ref, _ = setup
    ledger = state.ledger()
    try:
        i = 0
        while True:  # spend the rest of the budget directly in the ledger
            i += 1
            ledger.charge(state.dataset_name, f"pre-{i}", 10 / 3 ** 0.5, 3.0, 1e-6)
    except Exception:
        pass
    finally:
        ledger.close()
    reply = _eval(app, ctx, ref, "rel-over", push=False)
    assert reply.has_error() and reply.error.code == Code.BUDGET_EXHAUSTED and not reply.has_content()
    assert messages.classify(reply.error.code) == "budget_exhausted"
    # the coordinator cannot reset the budget by calling the same data another name
    renamed = app(Message(messages.evaluate_request({"bundle-hash": ref.content_hash, "dataset": "fresh-name",
                                                     "release-id": "rel-renamed"}, None), 7, messages.EVALUATE), ctx)
    assert renamed.has_error() and renamed.error.code == Code.BUDGET_EXHAUSTED
    # a repeat of an earlier request still gets its cached reply, at no cost
    again = _eval(app, ctx, ref, "rel-same", push=False)
    assert not again.has_error()


def test_missing_ledger_is_a_refusal_not_a_reset(setup, tmp_path):
    app, _, _, ref, _ = setup
    keys_dir = setup[2].root / "trusted"
    state = DeviceState.provision(tmp_path / "dev2", "dev-2", host_class(), list(keys_dir.iterdir()),
                                  data=device_data(1, 4))
    (state.root / "privacy.db").unlink()
    ctx = Context(run_id=1, node_id=8, node_config={"state-dir": str(state.root)}, state=RecordDict(), run_config={})
    reply = _eval(app, ctx, ref, "rel-x")
    assert reply.has_error() and reply.error.code == Code.LEDGER_UNAVAILABLE
    assert messages.classify(reply.error.code) == "refused"


@pytest.mark.parametrize("where", ["weights", "head"])
def test_a_held_bundle_that_no_longer_verifies_is_dropped_and_asked_for_again(setup, tmp_path, where):
    """Bit rot in a held bundle (weights read on a compile-cache miss, or the signed head): the device
    drops it and answers BUNDLE_MISSING, the answer on which the coordinator pushes it again."""
    app, _, first, ref, _ = setup
    state = DeviceState.provision(tmp_path / "dev3", "dev-3", host_class(), list((first.root / "trusted").iterdir()),
                                  data=device_data(2, 4))
    ctx = Context(run_id=1, node_id=9, node_config={"state-dir": str(state.root)}, state=RecordDict(), run_config={})
    assert not _eval(app, ctx, ref, "rel-held").has_error()
    held = state.bundle_path(ref.content_hash)
    data = bytearray(held.read_bytes())
    data[len(data) // 2 if where == "weights" else 200] ^= 0xFF
    held.write_bytes(bytes(data))
    for f in state.cache_dir.iterdir():
        f.unlink()
    reply = _eval(app, ctx, ref, "rel-rot", push=False)
    assert reply.has_error() and reply.error.code == Code.BUNDLE_MISSING
    assert not held.exists() and ref.content_hash not in state.held_hashes()
    again = _eval(app, ctx, ref, "rel-rot")  # the same release-id, pushed: nothing was charged for the failure
    assert not again.has_error() and held.read_bytes() == ref.data
