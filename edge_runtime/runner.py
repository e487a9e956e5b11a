"""Running a model as a device of some profile: natively when this host can, emulated when it cannot.

A device's evaluation (``cuvil.coordinator.device``) calls :func:`prepare` and never cares which path
it got. Native devices
compile with the on-disk cache and are timed for real. A device whose ISA is not the host's runs its
real cross-compiled code under the emulation harness (``cuvil.devices.emulation``, qemu-user); its
latency is flagged as emulated and never counted as device latency. Where no emulator is installed
the model runs natively on the host instead, still flagged as emulated (``emulator_name`` says so).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..compiler.errors import BundleError
from ..devices.profile import DeviceProfile
from .compile import compile_model, runnable_here
from .latency import LatencyReport, histogram, measure
from .loader import Model

Inputs = Mapping[str, np.ndarray]
Rows = tuple[np.ndarray, np.ndarray]  # (first output of each example, stacked; which examples ran)
_EMULATED_TIMING_RUNS = 8  # synthetic examples per emulated timing (one qemu start)


@dataclass
class Runner:
    input_name: str
    input_shape: tuple[int, ...]
    emulated: bool
    compile_ms: float
    cache_hit: bool
    arena_bytes: int
    run_each: Callable[[np.ndarray], Rows]  # examples stacked on a leading axis -> Rows
    latency: Callable[[Inputs, int, int, float], LatencyReport]
    threads: int = 1  # threads one inference runs on


def native(profile: DeviceProfile) -> bool:
    return runnable_here(profile.target())


def _emulation_ready(profile: DeviceProfile) -> bool:
    """True when the cross toolchain and qemu-user for this profile's architecture are installed."""
    try:
        from ..devices.emulation import EmulationError, toolchain_for

        toolchain_for(profile.target())
        return True
    except (ImportError, EmulationError):
        return False


def emulator_name(profile: DeviceProfile) -> str:
    return "native" if native(profile) else "qemu" if _emulation_ready(profile) else "host-fallback"


def inference_threads(profile: DeviceProfile, cores: int | None = None) -> int:
    """Threads this device's inferences run on: its class's default, within the cores it really has
    (``cores``: what the device is given, default this host's; emulated code runs on one: its wall
    time is no latency)."""
    from ..devices import host_profile

    have = host_profile().cores if cores is None else min(cores, host_profile().cores)
    if native(profile):
        return max(1, min(profile.default_threads, have))
    return max(1, min(host_profile().default_threads, have)) if not _emulation_ready(profile) else 1


def prepare(model: Model, profile: DeviceProfile, cache_dir: str | os.PathLike, cores: int | None = None) -> Runner:
    """The model compiled (or read from ``cache_dir``) for ``profile``, running on at most ``cores``."""
    types = model.input_types()  # from the manifest: a lazily loaded model's cache hit reads no weights
    if not types:
        raise BundleError(f"{model.name} takes no input")
    in_name, in_type = next(iter(types.items()))
    in_shape = tuple(int(d) for d in in_type.bind(1).shape)
    threads = inference_threads(profile, cores)
    if native(profile):
        return _native_runner(model, profile.target(), cache_dir, in_name, in_shape, False, threads)
    if not _emulation_ready(profile):
        return _native_runner(model, "host", cache_dir, in_name, in_shape, True, threads)
    return _emulated_runner(model, profile, Path(cache_dir), in_name, in_shape)


def _native_runner(model: Model, target, cache_dir, in_name: str, in_shape: tuple[int, ...], emulated: bool,
                   threads: int) -> Runner:
    session = compile_model(model, target=target, batch=1, cache_dir=cache_dir, threads=threads)
    st = session.stats

    def latency(inputs: Inputs, warmup: int, runs: int, budget_s: float) -> LatencyReport:
        session.run(inputs)
        return measure(session.run_raw, warmup=warmup, runs=runs, budget_s=budget_s)

    return Runner(in_name, in_shape, emulated, st.lower_ms + st.llvm_ms + st.load_ms, st.cache_hit,
                  session.memory_plan.arena_bytes, session.run_each, latency, session.threads)


def _emulated_runner(model: Model, profile: DeviceProfile, cache_dir: Path, in_name: str,
                     in_shape: tuple[int, ...]) -> Runner:
    """The device's real cross-compiled code, linked into the qemu harness (cached like native code)."""
    from .emulated import EmulatedModel

    t0 = time.perf_counter()
    em = EmulatedModel(model.graph, profile.target(), 1, cache_dir=cache_dir, content_hash=model.content_hash)
    compile_ms = (time.perf_counter() - t0) * 1e3

    def run_each(examples: np.ndarray) -> Rows:
        """One qemu start for every example; when that run fails, each example alone (one that fails
        then is marked as not run, so one record's failure never decides another's outcome)."""
        samples = [{in_name: np.asarray(x).reshape(in_shape)} for x in examples]
        try:
            rows: list[np.ndarray | None] = [next(iter(o.values())) for o in em.run(samples)] if samples else []
        except Exception:  # noqa: BLE001 - contained per example below
            rows = []
            for s in samples:
                try:
                    rows.append(next(iter(em.run([s])[0].values())))
                except Exception:  # noqa: BLE001
                    rows.append(None)
        return stack_rows(rows)

    def latency(inputs: Inputs, warmup: int, runs: int, budget_s: float) -> LatencyReport:
        # Emulation proves correctness, not speed: this is the emulated wall time per example (qemu
        # start included), reported for completeness and flagged so no aggregate counts it. It is
        # timed on ``inputs`` (synthetic), never on a run over private data, whose wall time would
        # reveal how many examples the device holds.
        k = max(1, min(runs, _EMULATED_TIMING_RUNS))
        t = time.perf_counter()
        em.run([inputs] * k)
        per = (time.perf_counter() - t) * 1e3 / k
        return LatencyReport(per, per, per, per, 1, 0, histogram([per]))

    return Runner(in_name, in_shape, True, compile_ms, em.cache_hit, em.lowered.plan.arena_bytes, run_each, latency)


def stack_rows(rows: Sequence[np.ndarray | None]) -> Rows:
    """Rows of one model (None: the example did not run) as :data:`Rows`; a missing row is zeros."""
    ran = np.array([r is not None for r in rows], dtype=bool)
    shape = next((np.shape(r) for r in rows if r is not None), (0,))
    table = np.zeros((len(rows), *shape), np.float32)
    for i, r in enumerate(rows):
        if r is not None:
            table[i] = r
    return table, ran
