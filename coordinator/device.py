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

Metrics leave through :func:`cuvil.edge_runtime.privacy.release.release` only.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..compiler.atomic_file import atomic_write
from ..compiler.bundle.format import is_sha256_hex
from ..compiler.bundle.signing import public_pem
from ..compiler.errors import BundleError, CuvilError
from ..edge_runtime import runner
from ..edge_runtime.loader import Model, load, load_bytes
from ..edge_runtime.privacy.ledger import PrivacyFloors, PrivacyLedger
from ..compiler.regular_file import read_regular
from ..edge_runtime.private import device_secret, private_dir
from ..edge_runtime.privacy.seal import LedgerSeal
from ..edge_runtime.report import EvalReport
from ..edge_runtime.training import TrainingCapability, training_capability
from ..edge_runtime.privacy.mechanism import encode_sums
from ..edge_runtime.privacy.outcomes import outcomes
from ..edge_runtime.privacy.release import prepare, release
from ..edge_runtime.latency import MAX_RUNS, MAX_WARMUP
from ..edge_runtime.privacy.errors import PrivacyRefusal, Reason, RefusalCode
from ..edge_runtime.privacy.request import MAX_EPSILON, MAX_SIGMA, integer, number, resolve
from ..edge_runtime.privacy.request import release_id as request_id
from ..edge_runtime.trust import TrustStore, check_trust_files
from .device_class import device_class, isa



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

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> EvalRequest:
        """A coordinator's round config, every field checked (PrivacyRefusal PARAMS_REJECTED otherwise)."""
        label = cfg.get("dataset", "")
        if not isinstance(label, str) or len(label) > 200:
            raise PrivacyRefusal(RefusalCode.PARAMS_REJECTED, Reason.WRONG_TYPE, "dataset must be a short string")
        integer("round", cfg.get("round", 0), 0, 2**31)
        return cls(bundle_hash=str(cfg.get("bundle-hash", "")), dataset=label,
                   release_id=request_id(cfg.get("release-id")),
                   sigma=number("dp-sigma", cfg.get("dp-sigma", 0.0), 0.0, MAX_SIGMA),
                   epsilon=number("dp-epsilon", cfg.get("dp-epsilon", 0.0), 0.0, MAX_EPSILON),
                   latency_warmup=integer("latency-warmup", cfg.get("latency-warmup", 5), 0, MAX_WARMUP),
                   latency_runs=integer("latency-runs", cfg.get("latency-runs", 50), 1, MAX_RUNS))


class DeviceState:
    """A provisioned device's state directory."""

    def __init__(self, root: Path, device_id: str, profile: str, data_path: Path | None, dataset_name: str = "local",
                 seal_dir: Path | None = None):
        self.root = root
        self.seal_dir = seal_dir  # where the ledger's seal (key, counter) lives; None: not sealed
        self.device_id = device_id
        self.profile = profile
        self.data_path = data_path
        self.dataset_name = dataset_name  # the privacy ledger's key for this device's evaluation data
        self.cache_dir = root / "cache"  # a simulated fleet may point its devices at one shared cache
        self.cores: int | None = None  # cores the device's inferences may use; None: all of this host's

    # provisioning ----------------------------------------------------------------------------------
    @classmethod
    def provision(cls, root: str | os.PathLike, device_id: str, profile: str,
                  trusted_keys: Iterable[str | os.PathLike] = (), data: tuple[np.ndarray, np.ndarray] | None = None,
                  data_path: str | os.PathLike | None = None, floors: PrivacyFloors = PrivacyFloors(),
                  dataset_name: str = "local", seal_dir: str | os.PathLike | None = None) -> DeviceState:
        """Create the state directory once; its ledger is created here and never again.

        ``seal_dir``: seal the ledger (:mod:`cuvil.edge_runtime.privacy.seal`) with a key and counter
        kept there, outside the state directory, so putting back an old ledger is detected.
        """
        root = Path(root)
        if (root / "device.json").exists():
            raise DeviceError(f"{root} is already provisioned (device {cls.open(root).device_id})")
        from ..devices import resolve_profile

        resolve_profile(profile)  # an unknown profile fails here, not at the first round
        trust = check_trust_files(trusted_keys)  # read as the device reads them, before anything is made
        if data_path is not None:
            read_dataset(Path(data_path))  # as the device reads it: a bad file fails here, not at the first round
        for sub in ("trusted", "cache", "bundles"):
            private_dir(root / sub)
        for source, key in zip(trust.sources, trust.keys):
            _atomic_write(root / "trusted" / Path(source).name, public_pem(key))
        if data is not None:
            x, y = data
            _atomic_write(root / "data.npz", _npz_bytes(x=np.asarray(x, np.float32), y=np.asarray(y, np.int64)))
        seal_dir = Path(seal_dir).resolve() if seal_dir is not None else None
        PrivacyLedger.create(root / "privacy.db", floors, _seal(seal_dir), dataset_name).close()
        ident = {"device_id": device_id, "profile": profile, "data_path": str(data_path) if data_path else None,
                 "dataset_name": dataset_name, "provisioned_at": time.time(),
                 "ledger_seal_dir": str(seal_dir) if seal_dir else None}
        _atomic_write(root / "device.json", json.dumps(ident, sort_keys=True).encode())
        return cls.open(root)

    @classmethod
    def open(cls, root: str | os.PathLike) -> DeviceState:
        root = Path(root)
        try:
            ident = json.loads(read_regular(root / "device.json"))  # a FIFO there must not hang the device
            return cls(root, str(ident["device_id"]), str(ident["profile"]),
                       Path(ident["data_path"]) if ident.get("data_path") else None,
                       str(ident.get("dataset_name") or "local"),
                       Path(ident["ledger_seal_dir"]) if ident.get("ledger_seal_dir") else None)
        except (OSError, ValueError, KeyError) as e:
            raise DeviceError(f"no provisioned device at {root} ({e})") from None

    # state -----------------------------------------------------------------------------------------
    def trust(self) -> TrustStore:
        return TrustStore.from_dir(self.root / "trusted")

    def ledger(self) -> PrivacyLedger:
        return PrivacyLedger.open(self.root / "privacy.db", _seal(self.seal_dir), self.dataset_name)

    def training_capability(self) -> TrainingCapability:
        """Whether this device fine-tunes (torch and opacus present, memory enough): the inventory says so."""
        from ..devices import resolve_profile

        return training_capability(resolve_profile(self.profile).memory_budget_mib, _free_memory() or None)

    def held_hashes(self) -> list[str]:
        return sorted(p.stem for p in (self.root / "bundles").glob("*.cuvil"))

    def memory_budget(self) -> int:
        """Bytes this device's class gives one model: also the most a pushed bundle or delta may have."""
        from ..devices import resolve_profile

        return resolve_profile(self.profile).memory_budget_bytes

    def bundle_path(self, content_hash: str) -> Path:
        if not is_sha256_hex(content_hash):
            raise DeviceError(f"bad bundle hash {content_hash!r}")
        return self.root / "bundles" / f"{content_hash}.cuvil"

    def accept_bundle(self, data: bytes | None, content_hash: str) -> tuple[Model, bool]:
        """Verify a pushed bundle (or the held one when none is pushed); return (model, was held).

        Verification against this device's trusted keys happens before anything is parsed or stored;
        a pushed bundle is held (content-addressed) only after it verified and matched its hash. A held
        file that no longer verifies is dropped and reported missing, so the coordinator pushes it again.
        """
        path = self.bundle_path(content_hash)
        if data is None:
            if not path.is_file():
                raise BundleMissing(f"bundle {content_hash[:12]} is not held by {self.device_id}")
            trust = self.trust()  # outside the try: a trust store in trouble is not the bundle's fault
            try:  # weights read only on a compile-cache miss, not kept
                model = load(path, trust, lazy=True)
            except (BundleError, ValueError) as e:
                raise self._dropped(content_hash, e) from None
            held = True
        else:
            model = load_bytes(data, self.trust())
            held = path.is_file()
            if not held and model.content_hash == content_hash:
                _atomic_write(path, bytes(data))
        if model.content_hash != content_hash:
            if data is None:
                raise self._dropped(content_hash, BundleError(f"it holds {model.content_hash[:12]}"))
            raise BundleError(f"bundle content {model.content_hash[:12]} is not the announced {content_hash[:12]}")
        return model, held

    def damaged(self, content_hash: str) -> BundleMissing | None:
        """Whether the held bundle ``content_hash`` fails verification read whole (a lazily loaded one is
        checked only where its weights are read): then it is dropped, and the error to answer with is
        returned (the coordinator pushes what a device lacks). None where it verifies or is not held."""
        path, trust = self.bundle_path(content_hash), self.trust()
        if not path.is_file():
            return None
        try:
            if load(path, trust).content_hash == content_hash:
                return None
            error: Exception = BundleError("it holds another bundle")
        except (BundleError, ValueError) as e:
            error = e
        return self._dropped(content_hash, error)

    def _dropped(self, content_hash: str, error: Exception) -> BundleMissing:
        """Drop a held bundle that failed verification (bit rot, a partial restore): never run, never
        kept, so the device answers as for a bundle it lost and is sent it again."""
        self.bundle_path(content_hash).unlink(missing_ok=True)
        return BundleMissing(f"held bundle {content_hash[:12]} failed verification and was dropped ({error})")

    def dataset(self) -> tuple[np.ndarray, np.ndarray]:
        return read_dataset(self.data_path or self.root / "data.npz")

    def info(self) -> dict[str, Any]:
        """What ``query.device_info`` answers: nothing about the local data."""
        from ..devices import resolve_profile

        prof = resolve_profile(self.profile)
        emulated = not runner.native(prof)
        can = self.training_capability()
        return {
            "device_id": self.device_id, "profile": device_class(self.profile), "arch": prof.arch, "cpu": prof.cpu,
            "features": ",".join(prof.features), "isa": isa(prof), "threads": runner.inference_threads(prof, self.cores),
            "runtime_version": runtime_version(),
            "emulated": int(emulated), "emulator": runner.emulator_name(prof),
            "held_bundles": self.held_hashes(), "free_memory_bytes": _free_memory(),
            "can_train": int(can.can_train), "train_reason": can.reason,
        }


def read_dataset(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A device's evaluation data: an .npz (never unpickled) with arrays ``x`` and ``y``."""
    try:
        data = read_regular(path)
        if not data.startswith(b"PK\x03\x04"):  # np.load takes anything else for a pickle it refuses to read
            raise ValueError("not an .npz archive")
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return z["x"].astype(np.float32), z["y"].astype(np.int64)
    except (OSError, KeyError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e.args[0] if e.args else e)
        raise DeviceError(f"cannot read the local dataset {path}: {reason.splitlines()[0]}") from None


# evaluation ---------------------------------------------------------------------------------------
def evaluate(state: DeviceState, model: Model, request: EvalRequest, bundle_was_cached: bool) -> EvalReport:
    """Check and prepare the release, compile (cached), time on synthetic inputs, then evaluate on the
    local data and release privately.

    Everything that can refuse or fail does so before the local data are read (so neither a refusal
    nor its timing depends on them); a repeated release-id is answered from the stored noisy reply
    without reading the data at all. Returns the device's :class:`EvalReport`; raises
    PrivacyRefusal (with no metrics) when the device refuses.
    """
    from ..devices import resolve_profile

    prof = resolve_profile(state.profile)
    ledger = state.ledger()  # a missing or corrupt ledger refuses before any work is done
    try:
        params = resolve(request.sigma, request.epsilon, ledger.floors)
        ticket = prepare(ledger, state.dataset_name, request_id(request.release_id), params,
                         bundle_hash=model.content_hash)
        compiled = runner.prepare(model, prof, state.cache_dir, state.cores)
        # Latency on synthetic inputs of the static shape: no private information, no budget.
        synthetic = np.random.default_rng(0).standard_normal(compiled.input_shape).astype(np.float32)
        lat = compiled.latency({compiled.input_name: synthetic}, request.latency_warmup, request.latency_runs,
                               request.latency_budget_s)
        sums: dict[str, int] = {}
        if ticket.cached is None:
            x, y = state.dataset()
            if int(np.prod(x.shape[1:])) != int(np.prod(compiled.input_shape)):  # the records' shape, never their
                raise DeviceError("the local dataset does not match the model's input")  # number: 0 reshaped always
            n = min(len(x), params.max_examples)
            rows, ran = _rows(compiled, x[:n], params.max_examples, synthetic)  # n rows, then padding rows
            labels = np.concatenate([y[:n], np.zeros(len(rows) - n, np.int64)])
            correct, losses = outcomes(rows, labels, ran)  # over the padding too: the same work whatever n is
            sums, _ = encode_sums(correct[:n], losses[:n], params)
        noisy, spent = release(ledger, ticket, sums)
    finally:
        ledger.close()
    return EvalReport.build(noisy, spent, lat, emulated=compiled.emulated, compile_ms=compiled.compile_ms,
                            cache_hit=compiled.cache_hit, arena_bytes=compiled.arena_bytes,
                            bundle_was_cached=bundle_was_cached, threads=compiled.threads)


def _rows(compiled: runner.Runner, x: np.ndarray, runs: int, pad: np.ndarray) -> runner.Rows:
    """``runs`` output rows: one per example, then the synthetic padding's, all through one loop (so
    the time a release takes does not tell how many examples the device holds). An example the model
    fails on is marked as not run (it counts as incorrect), so a failure caused by one record never
    becomes an error reply; a model that cannot run at all marks every example so."""
    examples = np.empty((runs, *compiled.input_shape), np.float32)
    examples[:len(x)] = x.reshape(len(x), *compiled.input_shape)
    examples[len(x):] = pad
    try:
        return compiled.run_each(examples)
    except Exception:  # noqa: BLE001 - the same for every example, whatever the data
        return np.zeros((runs, 0), np.float32), np.zeros(runs, bool)


def _seal(seal_dir: Path | None) -> LedgerSeal | None:
    if seal_dir is None:
        return None
    try:
        return LedgerSeal(device_secret(seal_dir / "ledger.key"), seal_dir / "ledger.counter")
    except (OSError, CuvilError) as e:  # an unusable seal is a refusal, never an unsealed ledger
        raise PrivacyRefusal(RefusalCode.LEDGER_UNAVAILABLE, Reason.LEDGER_BROKEN, f"ledger seal: {e}") from None


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
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _atomic_write(path: Path, data: bytes) -> None:
    """A device's own state (its private data among it): whole or not at all, readable by it alone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, 0o600) as f:
        f.write(data)


__all__ = ["BundleMissing", "DeviceError", "DeviceState", "EvalRequest", "evaluate", "runtime_version"]
