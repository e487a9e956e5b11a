"""Federated evaluation in Flower's simulation engine (Ray): the embedded default.

Simulated devices are provisioned before Ray starts (state dirs with trust, ledger and local data),
exactly as an operator provisions a real device, so client processes never build data themselves.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import fleet
from .config import RunConfig
from .rounds import Event

BACKEND_CONFIG: dict[str, Any] = {
    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    "init_args": {"num_cpus": 2, "include_dashboard": False},
}


def run_fleet_simulation(num_devices: int, run_config: Mapping[str, Any], fleet_dir: str | os.PathLike,
                         trusted_keys: Sequence[str | os.PathLike], classes: Sequence[str] | None = None,
                         on_event: Event | None = None, num_cpus: int = 2, quiet: bool = True,
                         shared_cache: bool = False) -> None:
    """Provision ``num_devices`` simulated devices under ``fleet_dir`` and run the coordinator over them.

    ``shared_cache``: devices of one class share a compile cache (they share this host's disk), so a
    large simulated fleet compiles once per class instead of once per device.
    """
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # a local simulation phones nobody (override: set it)
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    from flwr.simulation import run_simulation

    from .client_app import make_client_app
    from .server_app import make_server_app

    fleet_dir = Path(fleet_dir)
    cfg = RunConfig.from_mapping({"poll-interval": 0.05, **run_config}).replace(
        sim_fleet_dir=str(fleet_dir), sim_classes=",".join(classes or fleet.default_classes()),
        sim_trusted_key=",".join(str(k) for k in trusted_keys), sim_shared_cache=bool(shared_cache))
    fleet.provision_sim_fleet(fleet_dir, num_devices, trusted_keys, cfg.classes, cfg.sim_seed)
    rc = cfg.as_run_config()
    init_args = {**BACKEND_CONFIG["init_args"], "num_cpus": num_cpus, "log_to_driver": not quiet}
    backend = {**BACKEND_CONFIG, "init_args": init_args}
    loggers = {name: logging.getLogger(name) for name in ("flwr", "ray")}
    levels = {name: lg.level for name, lg in loggers.items()}
    if quiet:  # Flower warns that run_simulation is deprecated (it is the documented Python entry point)
        loggers["flwr"].setLevel(logging.ERROR)
        loggers["ray"].setLevel(logging.WARNING)
    try:
        run_simulation(server_app=make_server_app(rc, on_event), client_app=make_client_app(rc),
                       num_supernodes=num_devices, backend_config=backend, verbose_logging=False)
    finally:
        for name, lg in loggers.items():
            lg.setLevel(levels[name])
