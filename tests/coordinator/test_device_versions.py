"""A device's active and previous versions: a rollback restores the previous version's outputs exactly."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.coordinator import fleet
from cuvil.coordinator.device import DeviceError, DeviceState
from cuvil.coordinator.device_versions import activate, read_versions, revert
from cuvil.coordinator.rounds import BundleRef

from .fleet_helpers import make_bundle, make_keys


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("versions")
    keys = make_keys(root)
    v1 = BundleRef.from_file(make_bundle(root, keys, "1", seed=0))
    v2 = BundleRef.from_file(make_bundle(root, keys, "2", seed=1, epochs=2))
    return root, keys, v1, v2


def _outputs(dev: DeviceState, name: str, x: np.ndarray) -> np.ndarray:
    model, held = dev.accept_bundle(None, read_versions(dev)[name].active)  # the active version, from disk
    assert held
    return next(iter(model.run({model.graph.inputs[0]: x}).values()))


def test_rollback_restores_the_previous_versions_outputs_exactly_without_a_download(world):
    root, keys, v1, v2 = world
    dev = DeviceState.provision(root / "d", "d", fleet.host_class(), [keys.public_path], data=fleet.device_data(0, 4))
    x = np.random.default_rng(5).random((7, 1, 8, 8), dtype=np.float32)
    for ref in (v1, v2):
        dev.accept_bundle(ref.data, ref.content_hash)  # pushed once, verified, held
    name = v1.name
    activate(dev, name, v1.content_hash)
    before = _outputs(dev, name, x)
    assert activate(dev, name, v2.content_hash).previous == v1.content_hash
    after = _outputs(dev, name, x)
    assert not np.array_equal(before, after)
    assert revert(dev, name, v1.content_hash).active == v1.content_hash
    np.testing.assert_array_equal(_outputs(dev, name, x), before)  # bit for bit
    assert revert(dev, name, v1.content_hash).previous == v2.content_hash  # repeated: nothing changes
    with pytest.raises(DeviceError, match="previous version"):
        revert(dev, name, "f" * 64)


def test_a_version_is_activated_only_once_held_and_a_first_one_has_nothing_to_revert_to(world):
    root, keys, v1, v2 = world
    dev = DeviceState.provision(root / "e", "e", fleet.host_class(), [keys.public_path], data=fleet.device_data(1, 4))
    with pytest.raises(DeviceError, match="not held"):
        activate(dev, v1.name, v1.content_hash)
    dev.accept_bundle(v1.data, v1.content_hash)
    activate(dev, v1.name, v1.content_hash)
    with pytest.raises(DeviceError, match="no previous version"):
        revert(dev, v1.name)
    (dev.root / "versions.json").write_text("{not json")
    with pytest.raises(DeviceError, match="unreadable"):
        read_versions(dev)
