"""Flower's FedAvg over stored updates (weighted by noisy counts), and the signed next version with lineage."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from cuvil.compiler.bundle import Lineage, generate_keypair, read_bundle  # noqa: E402
from cuvil.compiler.bundle.signing import load_public_key  # noqa: E402
from cuvil.coordinator.fedavg import FineTuningError, apply_update, fedavg, mint_version, next_version  # noqa: E402
from cuvil.coordinator.store import ResultsStore  # noqa: E402

from ..compiler.bundle.helpers import small_graph  # noqa: E402


@pytest.fixture(autouse=True)
def task_identity():
    """Flower builds a Message only inside a task; a ServerApp has one, a unit test sets one."""
    from flwr.supercore.task_identity import TaskIdentity

    old = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = old


def test_updates_are_averaged_by_noisy_counts_through_the_store(tmp_path):
    store = ResultsStore(tmp_path / "r.db")
    run = store.start_run({})
    rid = store.start_round(run, 1, "train", "m@1", "h" * 64, "d")
    ups = {"a": (np.array([1.0, 2.0], np.float32), 30), "b": (np.array([3.0, -2.0], np.float32), 10),
           "c": (np.array([100.0, 100.0], np.float32), -4)}  # a negative noisy count weighs 1, never negative
    for dev, (w, n) in ups.items():
        assert store.add_update(rid, dev, "x86", n, 0.5, {"dp_count": n}, {"b": w})
    assert not store.add_update(rid, "a", "x86", 1, 0.5, {}, {"b": np.zeros(2, np.float32)})  # once per device
    stored = store.updates(rid, with_arrays=True)
    assert [u["device_id"] for u in stored] == ["a", "b", "c"]
    got = fedavg(1, stored)
    expected = (30 * ups["a"][0] + 10 * ups["b"][0] + 1 * ups["c"][0]) / 41
    np.testing.assert_allclose(got["b"], expected, rtol=1e-6)
    with pytest.raises(FineTuningError, match="no update"):
        fedavg(2, [])
    store.close()


def test_the_next_version_is_signed_with_its_lineage_and_moved_weights(tmp_path):
    keys = generate_keypair(tmp_path, "coordinator")
    graph = small_graph()
    moved = apply_update(graph, {"b": np.full(8, 0.25, np.float32)})
    np.testing.assert_allclose(moved.constants["b"], graph.constants["b"] + 0.25)
    np.testing.assert_array_equal(moved.constants["w"], graph.constants["w"])
    lineage = Lineage.of("cd" * 32, "1", rounds=3, devices=9, epsilon=2.5, delta=1e-6)
    ref = mint_version(moved, "small", next_version("1"), lineage, keys.private_path)
    bundle = read_bundle(ref.data, [load_public_key(keys.public_path)])
    assert (ref.name, ref.version) == ("small", "2") and bundle.manifest.lineage == lineage
    assert mint_version(moved, "small", "2", lineage, keys.private_path).data == ref.data  # deterministic
    with pytest.raises(FineTuningError, match="'w'"):
        apply_update(graph, {"w": np.zeros(3, np.float32)})


@pytest.mark.parametrize("old,new", [("1", "2"), ("v1.9", "v1.10"), ("beta", "beta.1"), ("2024-05", "2024-06")])
def test_next_version(old, new):
    assert next_version(old) == new
