"""Which device a ClientApp is: a simulated fleet plan, or a real SuperNode's ``node_config``.

Simulation: ``partition-id`` picks one virtual device. Its profile follows a fixed rotation over the
fleet's classes (the host's own x86 class natively, ARM classes emulated) and its local data is a
non-IID slice of scikit-learn's digits (label skew from a seeded Dirichlet, light augmentation so
each device holds a few hundred examples). Everything is derived from the seed, so the server, the
demo and every client process agree on the plan without talking.

Real SuperNode: ``--node-config "device-id='jetson-01' device-profile='jetson-orin'
state-dir='/var/lib/cuvil' data-path='/data/eval.npz'"``; the state directory must have been
provisioned (``cuvil device-provision``) — a device never provisions itself from a server message.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .config import RunConfig
from .device import DeviceError, DeviceState
from .device_class import host_class

ARM_CLASSES = ("rpi5", "jetson-orin", "graviton3")
SIM_DEVICE_CORES = 1  # a simulated device runs on one core: each simulation worker (one CPU) runs one at a time
HOLDOUT_SEED = 0


def default_classes() -> tuple[str, ...]:
    """The host's class first, then ARM classes (emulated unless this host is one of them)."""
    host = host_class()
    return (host, *(c for c in ARM_CLASSES if c != host))


@dataclass(frozen=True)
class SimDevice:
    partition_id: int
    device_id: str
    profile: str


def sim_device(partition_id: int, classes: Sequence[str] | None = None) -> SimDevice:
    """Simulated device ``partition_id``: its class follows the rotation over ``classes``."""
    classes = tuple(classes or default_classes())
    cls = classes[partition_id % len(classes)]
    return SimDevice(partition_id, f"sim-{partition_id:03d}-{cls}", cls)


def plan_fleet(num_devices: int, classes: Sequence[str] | None = None) -> list[SimDevice]:
    classes = tuple(classes or default_classes())
    return [sim_device(i, classes) for i in range(num_devices)]


def digits(split: str = "all") -> tuple[np.ndarray, np.ndarray]:
    """Digits as [n, 1, 8, 8] float32 in [0, 1]; ``"train"`` / ``"holdout"`` split 50/50 with a fixed permutation."""
    x, y = _digits_arrays()
    if split == "all":
        return x, y
    order = np.random.default_rng(HOLDOUT_SEED).permutation(len(x))
    half = len(x) // 2
    idx = order[:half] if split == "train" else order[half:]
    return x[idx], y[idx]


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits, read straight from its CSV (importing sklearn costs seconds)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DeviceError("the simulated fleet needs scikit-learn's bundled digits data (pip install scikit-learn)")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    raw = np.loadtxt(path, delimiter=",", dtype=np.float32)
    x = (raw[:, :-1] / 16.0).reshape(-1, 1, 8, 8).astype(np.float32)
    return x, raw[:, -1].astype(np.int64)


def device_data(partition_id: int, num_partitions: int, seed: int = 0, alpha: float = 0.5,
                size_range: tuple[int, int] = (200, 480)) -> tuple[np.ndarray, np.ndarray]:
    """A non-IID local dataset: label proportions ~ Dirichlet(alpha), drawn from the held-out digits.

    Examples are resampled from the held-out pool with a little pixel noise, so a device can hold a
    few hundred examples that the model never saw in training.
    """
    x_pool, y_pool = digits("holdout")
    gen = np.random.default_rng([seed, num_partitions, partition_id])
    props = gen.dirichlet([alpha] * 10)
    n = int(gen.integers(size_range[0], size_range[1] + 1))
    labels = gen.choice(10, size=n, p=props)
    by_label = [np.flatnonzero(y_pool == c) for c in range(10)]
    idx = np.array([gen.choice(by_label[c]) for c in labels], dtype=np.int64)
    x = np.clip(x_pool[idx] + gen.normal(0, 0.05, x_pool[idx].shape).astype(np.float32), 0.0, 1.0)
    return x.astype(np.float32), labels.astype(np.int64)


def provision_sim_device(root: str | os.PathLike, dev: SimDevice, num_partitions: int,
                         trusted_keys: Sequence[str | os.PathLike], seed: int = 0) -> DeviceState:
    """Provision one simulated device's state directory under ``root`` (idempotent)."""
    path = Path(root) / dev.device_id
    if (path / "device.json").exists():
        return DeviceState.open(path)
    return DeviceState.provision(path, dev.device_id, dev.profile, trusted_keys,
                                 data=device_data(dev.partition_id, num_partitions, seed))


def provision_sim_fleet(root: str | os.PathLike, num_devices: int, trusted_keys: Sequence[str | os.PathLike],
                        classes: Sequence[str] | None = None, seed: int = 0) -> list[DeviceState]:
    return [provision_sim_device(root, d, num_devices, trusted_keys, seed) for d in plan_fleet(num_devices, classes)]


def resolve_device(node_config: Mapping[str, Any], run_config: Mapping[str, Any]) -> DeviceState:
    """The DeviceState a ClientApp runs as, from its node config (and, in simulation, the run config)."""
    if "state-dir" in node_config:
        state = DeviceState.open(node_config["state-dir"])
        want = node_config.get("device-id")
        if want and want != state.device_id:
            raise DeviceError(f"node config says device {want!r}, its state dir holds {state.device_id!r}")
        return state
    if "partition-id" in node_config:
        cfg = RunConfig.from_mapping(run_config)
        if not cfg.sim_fleet_dir:
            raise DeviceError("simulation needs run config 'sim-fleet-dir' (where simulated devices keep state)")
        partition, partitions = int(node_config["partition-id"]), int(node_config["num-partitions"])
        if not 0 <= partition < partitions:
            raise DeviceError(f"partition-id {partition} is outside 0..{partitions - 1}")
        dev = sim_device(partition, cfg.classes or None)
        state = provision_sim_device(cfg.sim_fleet_dir, dev, partitions, cfg.trusted_keys, cfg.sim_seed)
        state.cores = SIM_DEVICE_CORES
        if cfg.sim_shared_cache:
            # Simulated devices share this host's disk: one compile cache per device class (content-keyed,
            # so a hit is exactly the code the device would have compiled), compiled once per class.
            state.cache_dir = Path(cfg.sim_fleet_dir) / "_shared-cache" / dev.profile
        return state
    raise DeviceError("node config names no device: give state-dir (real SuperNode) or partition-id (simulation)")
