"""One edge device's identity and local state, and its evaluation of a bundle (domain logic, no Flower).

A device's state directory holds everything that must outlive the client process (Flower starts a
fresh one for every message)::

    device.json     identity: device id and profile (written once, at provisioning)
    trusted/        public keys whose bundles this device runs (*.pub / *.pem)
    cache/          the compile cache (content hash + target + compiler fingerprint -> object code)
    bundles/        bundles held, content-addressed: <content hash>.cuvil
    privacy.db      the privacy ledger, provisioned once; missing later means refusal, never reset
    data.npz        the local evaluation dataset (x, y) unless ``data_path`` points elsewhere

The privacy budget is charged to the device's own dataset name (set at provisioning), never to a
name the coordinator sends: a coordinator cannot reset a device's budget by renaming its dataset.

Metrics leave through :func:`cuvil.edge_runtime.privacy.release.release_report` only.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..compiler.errors import CuvilError
from ..edge_runtime import runner
from ..edge_runtime.loader import Model, load, load_bytes
from ..edge_runtime.privacy.ledger import PrivacyFloors, PrivacyLedger
from ..edge_runtime.private import private_dir
from ..edge_runtime.report import EvalReport
from ..edge_runtime.privacy.mechanism import DEFAULT_PARAMS
from ..edge_runtime.privacy.release import check_params, release_report
from ..edge_runtime.training import TrainingCapability, training_capability
from ..edge_runtime.trust import TrustStore
from .device_class import device_class, isa, threads

_HASH_CHARS = set("0123456789abcdef")


class DeviceError(CuvilError):
    """The device is not provisioned, or its state is unusable."""


class BundleMissing(CuvilError):
    """The coordinator assumed this device holds a bundle that it does not hold."""


def runtime_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from ..edge_runtime.cache import CODEGEN_VERSION

    try:
        return f"cuvil {version('cuvil')} codegen {CODEGEN_VERSION}"
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return f"cuvil unknown codegen {CODEGEN_VERSION}"


@dataclass(frozen=True)
class EvalRequest:
    bundle_hash: str
    dataset: str  # the coordinator's label, for its records; the budget is charged to state.dataset_name
    release_id: str
    sigma: float = 0.0  # requested noise; 0 asks for the device's floor (the ledger refuses less)
    epsilon: float = 0.0  # requested budget; 0 asks for the device's own (the ledger refuses more)
    latency_warmup: int = 5
    latency_runs: int = 50
    latency_budget_s: float = 0.25


class DeviceState:
    """A provisioned device's state directory."""

    def __init__(self, root: Path, device_id: str, profile: str, data_path: Path | None, dataset_name: str = "local"):
        self.root = root
        self.device_id = device_id
        self.profile = profile
        self.data_path = data_path
        self.dataset_name = dataset_name  # the privacy ledger's key for this device's evaluation data
        self.cache_dir = root / "cache"  # a simulated fleet may point its devices at one shared cache

    # provisioning ----------------------------------------------------------------------------------
    @classmethod
    def provision(cls, root: str | os.PathLike, device_id: str, profile: str,
                  trusted_keys: Iterable[str | os.PathLike] = (), data: tuple[np.ndarray, np.ndarray] | None = None,
                  data_path: str | os.PathLike | None = None, floors: PrivacyFloors = PrivacyFloors(),
                  dataset_name: str = "local") -> DeviceState:
        """Create the state directory once; its ledger is created here and never again."""
        root = Path(root)
        if (root / "device.json").exists():
            raise DeviceError(f"{root} is already provisioned (device {cls.open(root).device_id})")
        from ..devices import resolve_profile

        resolve_profile(profile)  # an unknown profile fails here, not at the first round
        for sub in ("trusted", "cache", "bundles"):
            private_dir(root / sub)
        for key in trusted_keys:
            key = Path(key)
            (root / "trusted" / key.name).write_bytes(key.read_bytes())
        if data is not None:
            x, y = data
            _atomic_write(root / "data.npz", _npz_bytes(x=np.asarray(x, np.float32), y=np.asarray(y, np.int64)))
        PrivacyLedger.create(root / "privacy.db", floors).close()
        ident = {"device_id": device_id, "profile": profile, "data_path": str(data_path) if data_path else None,
                 "dataset_name": dataset_name, "provisioned_at": time.time()}
        _atomic_write(root / "device.json", json.dumps(ident, sort_keys=True).encode())
        return cls.open(root)

    @classmethod
    def open(cls, root: str | os.PathLike) -> DeviceState:
        root = Path(root)
        try:
            ident = json.loads((root / "device.json").read_text())
            return cls(root, str(ident["device_id"]), str(ident["profile"]),
                       Path(ident["data_path"]) if ident.get("data_path") else None,
                       str(ident.get("dataset_name") or "local"))
        except (OSError, ValueError, KeyError) as e:
            raise DeviceError(f"no provisioned device at {root} ({e})") from None

    # state -----------------------------------------------------------------------------------------
    def trust(self) -> TrustStore:
        return TrustStore.from_dir(self.root / "trusted")

    def ledger(self) -> PrivacyLedger:
        return PrivacyLedger.open(self.root / "privacy.db")

    def training_capability(self) -> TrainingCapability:
        """Whether this device fine-tunes (torch and opacus present, memory enough): the inventory says so."""
        from ..devices import resolve_profile

        return training_capability(resolve_profile(self.profile).memory_budget_mib, _free_memory() or None)

    def held_hashes(self) -> list[str]:
        return sorted(p.stem for p in (self.root / "bundles").glob("*.cuvil"))

    def bundle_path(self, content_hash: str) -> Path:
        if len(content_hash) != 64 or not set(content_hash) <= _HASH_CHARS:
            raise DeviceError(f"bad bundle hash {content_hash!r}")
        return self.root / "bundles" / f"{content_hash}.cuvil"

    def accept_bundle(self, data: bytes | None, content_hash: str) -> tuple[Model, bool]:
        """Verify a pushed bundle (or the held one when none is pushed); return (model, was held).

        Verification against this device's trusted keys happens before anything is parsed or stored;
        a pushed bundle is held (content-addressed) only after it verified and matched its hash.
        """
        path = self.bundle_path(content_hash)
        if data is None:
            if not path.is_file():
                raise BundleMissing(f"bundle {content_hash[:12]} is not held by {self.device_id}")
            model = load(path, self.trust())
            held = True
        else:
            model = load_bytes(data, self.trust())
            held = path.is_file()
            if not held and model.content_hash == content_hash:
                _atomic_write(path, bytes(data))
        if model.content_hash != content_hash:
            from ..compiler.errors import BundleError

            raise BundleError(f"bundle content {model.content_hash[:12]} is not the announced {content_hash[:12]}")
        return model, held

    def dataset(self) -> tuple[np.ndarray, np.ndarray]:
        path = self.data_path or self.root / "data.npz"
        try:
            with np.load(path, allow_pickle=False) as z:
                return z["x"].astype(np.float32), z["y"].astype(np.int64)
        except (OSError, KeyError, ValueError) as e:
            raise DeviceError(f"cannot read the local dataset {path}: {e}") from None

    def info(self) -> dict[str, Any]:
        """What ``query.device_info`` answers: nothing about the local data."""
        from ..devices import resolve_profile

        prof = resolve_profile(self.profile)
        emulated = not runner.native(prof)
        can = self.training_capability()
        return {
            "device_id": self.device_id, "profile": device_class(self.profile), "arch": prof.arch, "cpu": prof.cpu,
            "features": ",".join(prof.features), "isa": isa(prof), "threads": threads(),
            "runtime_version": runtime_version(),
            "emulated": int(emulated), "emulator": runner.emulator_name(prof),
            "held_bundles": self.held_hashes(), "free_memory_bytes": _free_memory(),
            "can_train": int(can.can_train), "train_reason": can.reason,
        }


# evaluation ---------------------------------------------------------------------------------------
def evaluate(state: DeviceState, model: Model, request: EvalRequest, bundle_was_cached: bool) -> EvalReport:
    """Compile (cached), evaluate on the local data, time on synthetic inputs, release privately.

    Returns the device's :class:`EvalReport`; raises PrivacyRefusal (with no metrics) when the
    ledger refuses.
    """
    from ..devices import resolve_profile

    prof = resolve_profile(state.profile)
    ledger = state.ledger()  # a missing or corrupt ledger refuses before any work is done
    try:
        floors = ledger.floors
        params = check_params(replace(DEFAULT_PARAMS, sigma=request.sigma or floors.min_sigma,
                                      epsilon=request.epsilon or floors.epsilon, delta=floors.delta), ledger)
        x, y = state.dataset()
        n = min(len(x), params.max_examples)
        x, y = x[:n], y[:n]
        compiled = runner.prepare(model, prof, state.cache_dir)
        in_name, in_shape = compiled.input_name, compiled.input_shape
        outs = compiled.run_many([{in_name: x[i].reshape(in_shape)} for i in range(n)])
        probs = _probabilities(np.concatenate([next(iter(o.values())).reshape(1, -1) for o in outs])) \
            if n else np.zeros((0, 1))
        correct = probs.argmax(axis=1) == y
        losses = -np.log(np.clip(probs[np.arange(n), y], 1e-12, 1.0))
        # Latency on synthetic inputs of the static shape: no private information, no budget.
        synthetic = np.random.default_rng(0).standard_normal(in_shape).astype(np.float32)
        lat = compiled.latency({in_name: synthetic}, request.latency_warmup, request.latency_runs,
                               request.latency_budget_s)
        noisy, spent = release_report(ledger, state.dataset_name, request.release_id, correct, losses, params)
    finally:
        ledger.close()
    return EvalReport.build(noisy, spent, lat, emulated=compiled.emulated, compile_ms=compiled.compile_ms,
                            cache_hit=compiled.cache_hit, arena_bytes=compiled.arena_bytes,
                            bundle_was_cached=bundle_was_cached)


def _probabilities(out: np.ndarray) -> np.ndarray:
    """Rows of class probabilities (softmax applied when the model's output holds logits)."""
    out = np.asarray(out, dtype=np.float64)
    if np.all(out >= 0) and np.allclose(out.sum(axis=1), 1.0, atol=1e-3):
        return out
    e = np.exp(out - out.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _free_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _npz_bytes(**arrays: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


__all__ = ["BundleMissing", "DeviceError", "DeviceState", "EvalRequest", "evaluate", "runtime_version"]
