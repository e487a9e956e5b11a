"""Result commands for the `cuvil` CLI: ``results``, ``report`` and ``dashboard``, all read-only.

Each opens the results database with SQLite's ``mode=ro``: looking at results never changes them,
and works while a coordinator is still writing (only ``results --mark-aborted`` writes, and says so),
and on read-only storage too (``coordinator/store_sqlite.py``). A missing database or run is a one-line
error and exit status 1 (the group formats it).
"""

from __future__ import annotations

from pathlib import Path

import click

from .cli_fleet import _DB


def _open(db: Path):
    from .coordinator.store import ResultsStore

    return ResultsStore.open_read_only(db)


@click.command()
@_DB
@click.option("--run", "run_id", type=int, default=None,
              help="One run in detail: per-class tables, A/B verdict, failures with reasons, ε per device.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts (timestamps as epoch and UTC).")
@click.option("--mark-aborted", is_flag=True,
              help="First mark every running run whose coordinator is gone (dead, or silent for a minute) aborted "
                   "(the one option that writes to the database).")
def results(db: Path, run_id: int | None, as_json: bool, mark_aborted: bool) -> None:
    """Print the history of federated evaluation runs: timestamps, round durations, failures, ε."""
    from .coordinator.report import history_json, history_text
    from .coordinator.store import ResultsStore

    if mark_aborted:
        writer = ResultsStore(db, create=False)
        try:
            gone = writer.mark_aborted()
        finally:
            writer.close()
        click.echo(f"marked aborted: {', '.join(f'run {i}' for i in gone) or 'none'}", err=as_json)
    store = _open(db)
    try:
        click.echo(history_json(store, run_id) if as_json else history_text(store, run_id))
    finally:
        store.close()


@click.command()
@_DB
@click.option("--run", "run_id", type=int, required=True, help="The run to report on.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("report.html"),
              show_default=True, help="HTML file to write (self-contained: charts are inline SVG).")
def report(db: Path, run_id: int, output: Path) -> None:
    """Write a self-contained HTML report of one run."""
    from .coordinator.report import write_html

    store = _open(db)
    try:
        click.echo(f"wrote {write_html(store, run_id, output)}")
    finally:
        store.close()


@click.command()
@_DB
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (the default serves this machine only).")
@click.option("--port", default=8050, show_default=True, type=click.IntRange(0, 65535), help="0: any free port.")
def dashboard(db: Path, host: str, port: int) -> None:
    """Serve a live dashboard of the results database (read-only) until interrupted."""
    from .coordinator.dashboard import DashboardServer

    server = DashboardServer(db, host, port)
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: serving on {host}: anyone who can reach it sees the fleet's results", err=True)
    click.echo(f"dashboard of {db} at {server.url} (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


def register(group: click.Group) -> None:
    for cmd in (results, report, dashboard):
        group.add_command(cmd)
