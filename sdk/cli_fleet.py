"""Fleet commands for the `cuvil` CLI: ``demo``, ``rollout``, ``device-provision``, ``fleet ...``.

The result commands (``results``, ``report``, ``dashboard``) are in :mod:`.cli_results`.

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
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1, 10),
              help="Evaluation rounds of v1 first.")
@click.option("--train-rounds", default=3, show_default=True, type=click.IntRange(1, 3),
              help="DP fine-tuning rounds (more would pass the devices' privacy budget).")
@click.option("--int8", is_flag=True, help="Instead of the loop: an A/B of the model against its int8 version "
                                           "(accuracy cost, latency and bundle-size gain per device class).")
@click.option("--force", is_flag=True, help="Write into a --workdir that is not empty (replacing its files).")
def demo(workdir: Path | None, devices: int, rounds: int, train_rounds: int, int8: bool, force: bool) -> None:
    """The loop on a simulated fleet: evaluate v1, DP fine-tuning, v2 signed, canary rollout, evaluate again."""
    if int8:
        from .demo import run_demo

        run_demo(workdir, echo=click.echo, devices=devices, rounds=rounds, int8=True, force=force)
        return
    from .demo_loop import run_loop_demo

    run_loop_demo(workdir, echo=click.echo, devices=devices, rounds=rounds, train_rounds=train_rounds, force=force)


@click.command()
@click.argument("bundle_a", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("bundle_b", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--trust", "trust", multiple=True, required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Public key the simulated devices trust (repeatable; both bundles' signers).")
@click.option("--devices", default=8, show_default=True, type=click.IntRange(1, 1000), help="Simulated devices.")
@click.option("--fleet-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the simulated devices keep their state (default: beside the database).")
@click.option("--canary-fraction", default=RunConfig.canary_fraction, show_default=True,
              type=click.FloatRange(0, 1, min_open=True), help="Share of each class that gets B first.")
@click.option("--alpha", default=RunConfig.rollout_alpha, show_default=True,
              type=click.FloatRange(0, 0.5, min_open=True, max_open=True),
              help="Chance of rolling back a B that is not worse.")
@click.option("--margin", default=RunConfig.rollout_margin, show_default=True, type=click.FloatRange(0, 1, max_open=True),
              help="Accuracy B may lose against A and still be promoted.")
@_DB
def rollout(bundle_a: Path, bundle_b: Path, trust: tuple[Path, ...], devices: int, fleet_dir: Path | None,
            canary_fraction: float, alpha: float, margin: float, db: Path) -> None:
    """Canary rollout of BUNDLE_B over BUNDLE_A per device class on a simulated fleet (Flower simulation).

    On a real fleet the same ServerApp mode runs with
    flwr run . --run-config "bundle='A.cuvil' bundle-b='B.cuvil' rollout=true".
    """
    from .coordinator.rollout_view import NothingEvaluated, nothing_evaluated
    from .coordinator.simulation import run_fleet_simulation
    from .coordinator.store import ResultsStore

    db.parent.mkdir(parents=True, exist_ok=True)
    rc = {"db-path": str(db), "bundle": str(bundle_a.resolve()), "bundle-b": str(bundle_b.resolve()),
          "rollout": True, "canary-fraction": canary_fraction, "rollout-alpha": alpha, "rollout-margin": margin,
          "min-nodes": devices, "round-timeout": 300.0, "inventory-timeout": 300.0, "node-wait": 120.0}
    run_fleet_simulation(devices, rc, fleet_dir or db.parent / "fleet", list(trust))
    store = ResultsStore.open_read_only(db)
    try:
        run_id = store.runs()[-1]["id"]
        for r in store.rollouts(run_id):
            unknown = f", {r['unknown']} not known (a switch went unanswered)" if r["unknown"] else ""
            click.echo(f"{r['device_class']}: {r['decision']} ({r['reason']}); {r['applied']} of "
                       f"{r['class_devices']} devices switched{unknown}")
        click.echo(f"run {run_id}: cuvil results --db {db} --run {run_id}")
        why = nothing_evaluated(store, run_id)
        if why is not None:
            hint = ": does --trust name the key that signed the bundles?" if "SIGNATURE_REJECTED" in why else ""
            raise NothingEvaluated(f"run {run_id}: {why}{hint}")
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


@click.group("fleet")
def fleet() -> None:
    """Set up a real fleet: TLS certificates, SuperNode keys, an example model and device data."""


@fleet.command("certs")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for ca.crt, ca.key, superlink.pem and superlink.key.")
@click.option("--san", "sans", multiple=True, required=True,
              help="A host name or IP address the SuperLink is reached at (repeatable; every one devices use).")
@click.option("--days", default=365, show_default=True, type=int, help="Validity of both certificates.")
@click.option("--force", is_flag=True, help="Replace existing files.")
def fleet_certs(out_dir: Path, sans: tuple[str, ...], days: int, force: bool) -> None:
    """Create a certificate authority and the SuperLink's TLS certificate, signed by it."""
    from .coordinator.credentials import make_certificates

    made = make_certificates(out_dir, sans, days, force)
    click.echo(f"CA certificate:        {made.ca_cert}  (every SuperNode's --root-certificates)")
    click.echo(f"CA key:                {made.ca_key}  (keep it offline)")
    click.echo(f"SuperLink certificate: {made.cert}  (SANs: {', '.join(made.sans)})")
    click.echo(f"SuperLink key:         {made.key}")


@fleet.command("node-key")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Private key file to write (the public key goes beside it as OUT.pub).")
@click.option("--force", is_flag=True, help="Replace existing files.")
def fleet_node_key(out_path: Path, force: bool) -> None:
    """Create a SuperNode's authentication key pair (EC P-384, OpenSSH format)."""
    from .coordinator.credentials import make_node_key, node_key_fingerprint

    priv, pub = make_node_key(out_path, force)
    click.echo(f"private key: {priv}  (the SuperNode's --auth-supernode-private-key)")
    click.echo(f"public key:  {pub}  (register it: flwr supernode register {pub} FEDERATION)")
    click.echo(f"identity:    NAME@{node_key_fingerprint(pub)}  (how results name the device of this key)")


@fleet.command("example")
@click.option("--key", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The author's private key (cuvil keygen) to sign the example bundles with.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for digits-v1.cuvil, digits-v2.cuvil and data/device-<i>.npz.")
@click.option("--devices", default=3, show_default=True, type=click.IntRange(1, 1000),
              help="Devices to write evaluation data for.")
@click.option("--force", is_flag=True, help="Write into an --out that is not empty (replacing its files).")
def fleet_example(key: Path, out_dir: Path, devices: int, force: bool) -> None:
    """Write two signed versions of a small digits model and each device's evaluation data."""
    from .fleet_example import write_example

    made = write_example(out_dir, key, devices, force)
    for path in made.bundles:
        click.echo(f"bundle: {path}")
    click.echo(f"device data: {made.data[0].parent}/device-{{1..{devices}}}.npz")


def register(group: click.Group) -> None:
    """Add the fleet commands to ``group`` (``demo`` replaces any earlier command of that name)."""
    for cmd in (demo, rollout, device_provision, fleet):
        group.add_command(cmd)
