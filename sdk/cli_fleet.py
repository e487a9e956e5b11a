"""Fleet commands for the `cuvil` CLI: ``demo``, ``results``, ``report``, ``device-provision``.

Registered onto the main click group by :func:`register` (one line in ``cli.py``), so the fleet side
can grow without touching the core commands. Errors are formatted by the group, as for every command.
"""

from __future__ import annotations

from pathlib import Path

import click

from .coordinator.config import RunConfig

_DB = click.option("--db", "db", type=click.Path(dir_okay=False, path_type=Path), default=RunConfig().db_file,
                   show_default=True, help="Results database (SQLite), as in the run config's db-path.")


@click.command()
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where keys, bundles, the simulated fleet, the database and the report go "
                   "(default: a new temp dir).")
@click.option("--devices", default=12, show_default=True, type=click.IntRange(4, 1000), help="Simulated devices.")
@click.option("--rounds", default=2, show_default=True, type=click.IntRange(1, 10),
              help="Evaluation rounds before the A/B round.")
def demo(workdir: Path | None, devices: int, rounds: int) -> None:
    """Federated evaluation of a small CNN on a simulated fleet (Flower simulation), with an A/B round."""
    from .demo import run_demo

    run_demo(workdir, echo=click.echo, devices=devices, rounds=rounds)


@click.command()
@_DB
@click.option("--run", "run_id", type=int, default=None, help="One run in detail (per-class tables, ε per device).")
def results(db: Path, run_id: int | None) -> None:
    """Print the history of federated evaluation runs."""
    from .coordinator.report import history_text
    from .coordinator.store import ResultsStore

    if not db.is_file():
        raise FileNotFoundError(2, "no results database", str(db))
    store = ResultsStore(db)
    try:
        click.echo(history_text(store, run_id))
    finally:
        store.close()


@click.command()
@_DB
@click.option("--run", "run_id", type=int, required=True, help="The run to report on.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("report.html"),
              show_default=True, help="HTML file to write (self-contained: plots are inline).")
def report(db: Path, run_id: int, output: Path) -> None:
    """Write a self-contained HTML report of one run."""
    from .coordinator.report import write_html
    from .coordinator.store import ResultsStore

    if not db.is_file():
        raise FileNotFoundError(2, "no results database", str(db))
    store = ResultsStore(db)
    try:
        click.echo(f"wrote {write_html(store, run_id, output)}")
    finally:
        store.close()


@click.command("device-provision")
@click.option("--state-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The device's state directory (trust, compile cache, held bundles, privacy ledger).")
@click.option("--device-id", required=True, help="A stable name for this device.")
@click.option("--profile", required=True, help="Device profile (a shipped profile name, or 'host').")
@click.option("--trust", "trust", multiple=True, required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Public key whose bundles this device runs (repeatable).")
@click.option("--data", "data", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Local evaluation data: an .npz with arrays x and y (read in place, never copied).")
@click.option("--dataset-name", default="local", show_default=True,
              help="The name this device's privacy budget is kept under (the coordinator cannot rename it).")
def device_provision(state_dir: Path, device_id: str, profile: str, trust: tuple[Path, ...], data: Path | None,
                     dataset_name: str) -> None:
    """Provision a device once: identity, trusted keys and a fresh privacy ledger."""
    from .coordinator.device import DeviceState

    state = DeviceState.provision(state_dir, device_id, profile, trust, data_path=data.resolve() if data else None,
                                  dataset_name=dataset_name)
    click.echo(f"provisioned {state.device_id} ({state.profile}) in {state.root}")
    click.echo(f'supernode: --node-config "state-dir=\'{state.root.resolve()}\'"')


def register(group: click.Group) -> None:
    """Add the fleet commands to ``group`` (``demo`` replaces any earlier command of that name)."""
    for cmd in (demo, results, report, device_provision):
        group.add_command(cmd)
