"""Federated evaluation in Flower's simulation engine (Ray): the embedded default.

Simulated devices are provisioned before Ray starts (state dirs with trust, ledger and local data),
exactly as an operator provisions a real device, so client processes never build data themselves.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..compiler.errors import CuvilError
from ..edge_runtime.trust import check_trust_files
from . import fleet
from .config import RunConfig
from .rounds import Event
from .sim_delivery import pending_delivery

_WARM: list[bool] = []  # this process warmed torch and Opacus (a Ray worker serves many simulated devices)
IN_FLIGHT_PER_WORKER = 4  # messages out per Ray worker: enough to keep it busy, few enough for Flower's store
BACKEND_CONFIG: dict[str, Any] = {
    "client_resources": {"num_cpus": fleet.SIM_DEVICE_CORES, "num_gpus": 0.0},
    "init_args": {"num_cpus": 2, "include_dashboard": False},
}


def run_fleet_simulation(num_devices: int, run_config: Mapping[str, Any], fleet_dir: str | os.PathLike,
                         trusted_keys: Sequence[str | os.PathLike], classes: Sequence[str] | None = None,
                         on_event: Event | None = None, num_cpus: int = 2, quiet: bool = True,
                         shared_cache: bool = False, client_mods: Sequence[Any] = ()) -> None:
    """Provision ``num_devices`` simulated devices under ``fleet_dir`` and run the coordinator over them.

    Flower's in-memory message store scans every message in flight for each node it serves, so the
    coordinator keeps at most ``IN_FLIGHT_PER_WORKER`` messages per worker out (``max-in-flight``).
    ``shared_cache``: devices of one class share a compile cache (they share this host's disk), so a
    large simulated fleet compiles once per class instead of once per device. ``client_mods``: Flower
    mods around every device's handlers (they run in Ray's workers).
    """
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # a local simulation phones nobody (override: set it)
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    from flwr.simulation import run_simulation

    from .client_app import make_client_app
    from .server_app import make_server_app

    check_trust_files(trusted_keys)  # before any device is provisioned with them
    fleet_dir = Path(fleet_dir)
    knobs = {"poll-interval": 0.05, "max-in-flight": IN_FLIGHT_PER_WORKER * num_cpus}
    cfg = RunConfig.from_mapping({**knobs, **run_config}).replace(
        sim_fleet_dir=str(fleet_dir), sim_classes=",".join(classes or fleet.default_classes()),
        sim_trusted_key=",".join(str(k) for k in trusted_keys), sim_shared_cache=bool(shared_cache))
    _provision(fleet_dir, num_devices, trusted_keys, cfg, on_event)
    rc = cfg.as_run_config()
    mods = [*client_mods, *([warm_training_mod] if cfg.train_rounds else [])]
    init_args = {**BACKEND_CONFIG["init_args"], "num_cpus": num_cpus, "log_to_driver": not quiet}
    backend = {**BACKEND_CONFIG, "init_args": init_args}
    loggers = {name: logging.getLogger(name) for name in ("flwr", "ray")}
    levels = {name: lg.level for name, lg in loggers.items()}
    if quiet:  # Flower warns that run_simulation is deprecated (it is the documented Python entry point)
        loggers["flwr"].setLevel(logging.ERROR)
        loggers["ray"].setLevel(logging.WARNING)
    if on_event is not None:
        on_event("simulation_start", devices=num_devices, workers=num_cpus)
    started_ray, stop = False, threading.Event()
    try:
        started_ray = _start_ray(init_args)
        with pending_delivery():
            server = make_server_app(rc, on_event, lambda grid: _StoppableGrid(grid, stop))
            run_simulation(server_app=server, client_app=make_client_app(rc, mods), num_supernodes=num_devices,
                           backend_config=backend, verbose_logging=False)
    except BaseException:
        stop.set()  # Ctrl-C: the coordinator's thread ends (its run marked aborted), so the process can exit
        raise
    finally:
        for name, lg in loggers.items():
            lg.setLevel(levels[name])
        if started_ray:
            import ray

            ray.shutdown()  # Flower shuts it down when its engine ends; not when the engine never started


class SimulationInterrupted(CuvilError):
    """The simulation was stopped (Ctrl-C) while its coordinator was still exchanging messages."""


class _StoppableGrid:
    """A Flower Grid whose every call raises once ``stop`` is set. On Ctrl-C Flower's engine stops, but its
    ServerApp thread (not a daemon) kept waiting for replies no device would send, so the process printed
    Aborted! and never exited; failing the coordinator's next call ends its run as aborted instead."""

    def __init__(self, grid: Any, stop: threading.Event):
        self._grid, self._stop = grid, stop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._grid, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._stop.is_set():
                raise SimulationInterrupted("the simulation was interrupted")
            return attr(*args, **kwargs)

        return call


def _start_ray(init_args: Mapping[str, Any]) -> bool:
    """Start Ray as Flower's engine would (which then finds it running), before the coordinator runs:
    Ray's start-up holds this process for seconds on a busy machine (11 s at 10,000 devices, load 14),
    and inside the engine it fell in the coordinator's first progress interval. True when started here."""
    import ray

    if ray.is_initialized():
        return False
    pythonpath = os.pathsep.join([*sys.path, *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ["PYTHONPATH"] = pythonpath  # as Flower's RayBackend.init_ray: workers import what this process does
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, **{"include_dashboard": False, **init_args})
    return True


def warm_training_mod(msg: Any, context: Any, call_next: Any) -> Any:
    """A Flower mod (runs that train): a Ray worker's first message, the inventory's, imports torch and
    Opacus and takes a toy DP-SGD step, so a training round does not wait on each worker's first import."""
    if not _WARM:
        _WARM.append(True)
        from ..edge_runtime.training.dpsgd import warm_up

        try:
            warm_up()
        except ImportError:  # no torch here: the device says it cannot train, and the round skips it
            pass
    return call_next(msg, context)


def _provision(fleet_dir: Path, num_devices: int, trusted_keys: Sequence[str | os.PathLike], cfg: RunConfig,
               on_event: Event | None, every_s: float = 5.0) -> None:
    """Provision every simulated device (idempotent), with a progress event at least every ``every_s``."""
    last = time.monotonic()
    for done, dev in enumerate(fleet.plan_fleet(num_devices, cfg.classes), start=1):
        fleet.provision_sim_device(fleet_dir, dev, num_devices, trusted_keys, cfg.sim_seed)
        if on_event is not None and time.monotonic() - last >= every_s:
            on_event("progress", stage="simulated devices", done=done, of=num_devices, what="provisioned")
            last = time.monotonic()
