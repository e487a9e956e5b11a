"""Device state (provisioning, trust, held bundles, ledger), evaluation, and the simulated fleet plan."""

from __future__ import annotations

import os

import numpy as np
import pytest

from cuvil.compiler.errors import BundleError
from cuvil.coordinator import fleet
from cuvil.coordinator.device import BundleMissing, DeviceError, DeviceState, EvalRequest, evaluate
from cuvil.coordinator.rounds import BundleRef
from cuvil.coordinator.schema import ReportBounds, check_report
from cuvil.edge_runtime.report import EvalReport
from cuvil.edge_runtime.privacy.errors import PrivacyRefusal, RefusalCode

from .fleet_helpers import make_bundle, make_keys


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("device")
    keys = make_keys(root)
    ref = BundleRef.from_file(make_bundle(root, keys))
    return root, keys, ref


def _device(world, name, profile=None, **kw):
    root, keys, _ = world
    return DeviceState.provision(root / name, name, profile or fleet.host_class(), [keys.public_path],
                                 data=fleet.device_data(0, 4), **kw)


def test_provisioning_happens_once_and_open_finds_it(world):
    dev = _device(world, "once")
    assert DeviceState.open(dev.root).device_id == "once" and (dev.root / "privacy.db").is_file()
    with pytest.raises(DeviceError, match="already provisioned"):
        _device(world, "once")
    with pytest.raises(DeviceError, match="no provisioned device"):
        DeviceState.open(world[0] / "nothing-here")


@pytest.mark.parametrize("name", ["device.json", "data.npz"])
def test_a_fifo_or_directory_in_the_state_dir_is_an_error_not_a_hang(world, name):
    dev = _device(world, f"odd-{name}")
    path = dev.root / name
    for make_odd in (os.mkfifo, os.mkdir):
        path.rmdir() if path.is_dir() else path.unlink()
        make_odd(path)
        with pytest.raises(DeviceError):
            DeviceState.open(dev.root).dataset()


def test_unknown_profile_fails_at_provisioning(world):
    with pytest.raises(Exception, match="unknown device profile"):
        _device(world, "bad", profile="no-such-board")


def test_provisioning_trusts_only_public_keys_read_as_the_device_reads_them(world, tmp_path):
    """The keys were copied by file name unchecked: a private key was copied readable by others, a FIFO
    hung, and a second, different author.pub replaced the first. Nothing is made when one is refused."""
    from cuvil.compiler.bundle import generate_keypair
    from cuvil.compiler.bundle.signing import KeyFileError

    root, keys, _ = world
    other = generate_keypair(tmp_path / "other", keys.public_path.stem)
    os.mkfifo(tmp_path / "fifo.pub")
    for bad, match in (([keys.private_path], ""), ([tmp_path / "fifo.pub"], ""),
                       ([keys.public_path, other.public_path], "two different trusted keys are named author.pub")):
        with pytest.raises((KeyFileError, BundleError, OSError), match=match):
            DeviceState.provision(tmp_path / "dev", "dev", fleet.host_class(), bad)
        assert not (tmp_path / "dev").exists()
    dev = DeviceState.provision(tmp_path / "dev", "dev", fleet.host_class(), [keys.public_path, keys.public_path])
    assert [p.name for p in (dev.root / "trusted").iterdir()] == ["author.pub"]
    assert (dev.root / "trusted" / "author.pub").stat().st_mode & 0o077 == 0


def test_pushed_bundle_is_verified_then_held_by_content_hash(world):
    dev = _device(world, "holder")
    _, _, ref = world
    with pytest.raises(BundleMissing):
        dev.accept_bundle(None, ref.content_hash)
    model, held = dev.accept_bundle(ref.data, ref.content_hash)
    assert not held and model.content_hash == ref.content_hash and dev.held_hashes() == [ref.content_hash]
    _, held = dev.accept_bundle(None, ref.content_hash)
    assert held


def test_tampered_or_untrusted_bundles_are_never_held(world, tmp_path):
    dev = _device(world, "strict")
    _, _, ref = world
    bad = bytearray(ref.data)
    bad[-1] ^= 0xFF
    with pytest.raises(BundleError):
        dev.accept_bundle(bytes(bad), ref.content_hash)
    other = BundleRef.from_file(make_bundle(tmp_path, make_keys(tmp_path, "mallory")))
    with pytest.raises(BundleError):
        dev.accept_bundle(other.data, other.content_hash)
    with pytest.raises(BundleError, match="not the announced"):
        dev.accept_bundle(ref.data, "0" * 64)
    with pytest.raises(DeviceError, match="bad bundle hash"):
        dev.accept_bundle(None, "../../etc/passwd")
    assert dev.held_hashes() == []


def test_device_info_says_nothing_about_local_data(world):
    info = _device(world, "info").info()
    assert info["profile"] == fleet.host_class() and info["emulated"] == 0 and info["emulator"] == "native"
    assert not {"x", "y", "examples", "accuracy", "labels"} & set(info)


def test_evaluate_reports_the_schema_and_charges_the_ledger(world):
    dev = _device(world, "evaluator")
    _, _, ref = world
    model, held = dev.accept_bundle(ref.data, ref.content_hash)
    report = evaluate(dev, model, EvalRequest(ref.content_hash, "ds", "r1", latency_runs=10), held)
    assert isinstance(report, EvalReport)
    m = check_report(report.as_metrics(), ReportBounds(latency_runs=10)).as_metrics()
    assert m["cache_hit"] == 0 and m["latency_emulated"] == 0 and m["arena_bytes"] > 0
    assert m["dp_epsilon_spent"] > 0 and m["dp_sigma"] == 10.0 and m["latency_p50_ms"] > 0
    n = len(dev.dataset()[1])
    assert abs(m["dp_count"] / 256 - n) < 100  # noisy count, sigma = 10 examples
    ledger = dev.ledger()
    assert ledger.releases(dev.dataset_name) == 1 and ledger.releases("ds") == 0
    ledger.close()


@pytest.mark.parametrize("n", [0, 1])
def test_records_of_another_shape_fail_alike_whatever_their_number(world, n):
    """The records' shape is checked, never their number: before, reshaping zero records always worked, so a
    model of another input size got an error from a device with data and a report from one without."""
    root, keys, ref = world
    x, y = np.zeros((n, 5), np.float32), np.zeros(n, np.int64)
    dev = DeviceState.provision(root / f"shape{n}", f"shape{n}", fleet.host_class(), [keys.public_path], data=(x, y))
    model, held = dev.accept_bundle(ref.data, ref.content_hash)
    with pytest.raises(DeviceError, match="does not match the model's input"):
        evaluate(dev, model, EvalRequest(ref.content_hash, "ds", "r1", latency_runs=3), held)
    ledger = dev.ledger()
    assert ledger.releases(dev.dataset_name) == 0  # refused before the charge, for every n alike
    ledger.close()


def test_coordinator_may_ask_for_more_noise_but_never_less(world):
    dev = _device(world, "floors")
    _, _, ref = world
    model, held = dev.accept_bundle(ref.data, ref.content_hash)
    for ask in ({"sigma": 5.0}, {"epsilon": 10.0}):
        with pytest.raises(PrivacyRefusal) as e:
            evaluate(dev, model, EvalRequest(ref.content_hash, "ds", f"low-{ask}", latency_runs=5, **ask), held)
        assert e.value.code is RefusalCode.PARAMS_REJECTED
    ledger = dev.ledger()
    assert ledger.releases(dev.dataset_name) == 0  # refused before any release
    ledger.close()
    m = evaluate(dev, model, EvalRequest(ref.content_hash, "ds", "more", latency_runs=5, sigma=20.0, epsilon=2.0), held)
    assert m.dp_sigma == 20.0


def test_an_arm_device_is_flagged_emulated(world):
    dev = _device(world, "arm", profile="rpi5")
    _, _, ref = world
    model, held = dev.accept_bundle(ref.data, ref.content_hash)
    m = evaluate(dev, model, EvalRequest(ref.content_hash, "ds", "r1", latency_runs=5), held)
    assert m.latency_emulated and dev.info()["emulated"] == 1
    assert dev.info()["emulator"] in ("qemu", "host-fallback")


def test_a_device_without_its_ledger_refuses(world):
    dev = _device(world, "no-ledger")
    _, _, ref = world
    (dev.root / "privacy.db").unlink()
    model, held = dev.accept_bundle(ref.data, ref.content_hash)
    with pytest.raises(PrivacyRefusal) as e:
        evaluate(dev, model, EvalRequest(ref.content_hash, "ds", "r1"), held)
    assert e.value.code is RefusalCode.LEDGER_UNAVAILABLE


def test_fleet_plan_rotates_classes_with_the_host_class_first():
    plan = fleet.plan_fleet(12)
    classes = fleet.default_classes()
    assert len(classes) >= 4 and classes[0] == fleet.host_class()
    assert [d.profile for d in plan[:4]] == list(classes[:4]) and len({d.device_id for d in plan}) == 12


def test_device_data_is_seeded_and_non_iid():
    x0, y0 = fleet.device_data(0, 12)
    again = fleet.device_data(0, 12)
    assert np.array_equal(x0, again[0]) and np.array_equal(y0, again[1])
    assert x0.shape[1:] == (1, 8, 8) and x0.dtype == np.float32 and 200 <= len(y0) <= 480
    labels = [fleet.device_data(i, 12)[1] for i in range(4)]
    hists = [np.bincount(y, minlength=10) / len(y) for y in labels]
    assert max(np.abs(hists[0] - h).sum() for h in hists[1:]) > 0.5  # label skew, not IID


def test_resolve_device_from_node_config(world, tmp_path):
    root, keys, _ = world
    dev = _device(world, "real")
    assert fleet.resolve_device({"state-dir": str(dev.root)}, {}).device_id == "real"
    with pytest.raises(DeviceError, match="holds"):
        fleet.resolve_device({"state-dir": str(dev.root), "device-id": "other"}, {})
    rc = {"sim-fleet-dir": str(tmp_path), "sim-trusted-key": str(keys.public_path), "sim-shared-cache": True}
    sim = fleet.resolve_device({"partition-id": 1, "num-partitions": 8}, rc)
    assert sim.device_id == fleet.plan_fleet(8)[1].device_id
    assert sim.cache_dir == tmp_path / "_shared-cache" / sim.profile
    assert sim.info()["threads"] == 1  # one simulation worker, one core, runs it: never the host's cores
    with pytest.raises(DeviceError, match="names no device"):
        fleet.resolve_device({}, {})
