"""docs/fleet.md on loopback, exactly: a SuperLink and three SuperNodes as separate processes, TLS, node
authentication, ``flwr run`` on the repository's own ``pyproject.toml`` -- and what survives faults.

The shell blocks of the document's step-by-step section are extracted and run as they stand (the
test sets the variables of its first block). Then, with real processes killed mid-round:

- the ServerApp: every report a device released ends in the results database after the run is
  resumed, and no device is charged twice;
- the SuperLink (and everything it started): the same, after it is restarted with the documented
  command;
- a SuperNode: its request ends at the round deadline at the latest, the run finishes with the others.

The modules' tests run in file order over one fleet (started once: the set-up costs most of the time).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from cuvil.coordinator.credentials import node_key_fingerprint  # noqa: E402
from cuvil.coordinator.device import DeviceState  # noqa: E402
from cuvil.coordinator.device_class import host_class  # noqa: E402
from cuvil.coordinator.store import ResultsStore  # noqa: E402

from .processes import Shell, cmdline, descendants, doc_blocks, kill_tree, wait_for  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
DEVICES = ("device-1", "device-2", "device-3")
ENV_VARS = ("FLEET", "FLWR_HOME", "SUPERLINK_HOST", "SUPERLINK_PORT", "SUPERNODE_PORT")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_ports(count: int) -> int:
    """A port p with p .. p + count - 1 all free."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count < 65535 and all(_free(base + i) for i in range(count)):
            return base
    raise AssertionError("no free ports")


@dataclass
class Fleet:
    root: Path
    sh: Shell
    blocks: dict[str, str]
    stranger: subprocess.Popen

    @property
    def db(self) -> Path:
        return self.root / "results.db"

    def pid(self, name: str) -> int:
        return int((self.root / f"{name}.pid").read_text().split()[0])

    def query(self, sql: str, args=()) -> list[tuple]:
        if not self.db.is_file():
            return []
        try:
            with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5) as c:
                return c.execute(sql, args).fetchall()
        except sqlite3.Error:
            return []

    def identity(self, device: str) -> str:
        """What the coordinator records the device as: its name bound to its node key's fingerprint."""
        return f"{device}@{node_key_fingerprint(self.root / 'keys' / f'{device}.pub')}"

    @property
    def identities(self) -> list[str]:
        return sorted(self.identity(d) for d in DEVICES)

    def releases(self) -> dict[str, int]:
        """Per device: how many releases its privacy ledger has charged."""
        out = {}
        for dev in DEVICES:
            state = DeviceState.open(self.root / "devices" / dev)
            ledger = state.ledger()
            try:
                out[dev] = ledger.releases(state.dataset_name)
            finally:
                ledger.close()
        return out

    def serverapp(self) -> int | None:
        found = [p for p in descendants(self.pid("superlink")) if "flwr-serverapp" in cmdline(p)]
        return found[0] if found else None


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    (root / "logs").mkdir()
    bin_dir = str(Path(sys.executable).parent)  # this interpreter's cuvil, flwr and flower-* first
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "FLEET": str(root),
           "FLWR_HOME": str(root / "flwr"), "SUPERLINK_HOST": "127.0.0.1", "SUPERLINK_PORT": str(free_ports(1)),
           "SUPERNODE_PORT": str(free_ports(len(DEVICES) + 1)), "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1"}
    blocks = doc_blocks(REPO / "docs" / "fleet.md")
    assert list(blocks) == ["env", "model", "certs", "superlink", "connection", "devices", "supernodes", "run", "ab",
                            "resume"]
    exported = {w.split("=")[0] for line in blocks["env"].splitlines() if line.startswith("export ")
                for w in line.split("#")[0].split()[1:]}
    assert exported == set(ENV_VARS), "the test sets exactly the variables the document's first block exports"
    sh = Shell(env, REPO, root / "logs")
    stranger = None
    try:
        for name, timeout in (("model", 120), ("certs", 60), ("superlink", 30), ("connection", 120),
                              ("devices", 180), ("supernodes", 30)):
            sh.run(blocks[name], name, timeout)
        # a SuperNode whose key was never registered: refused, it never joins
        sh.run('cuvil fleet node-key --out "$FLEET/keys/stranger"', "stranger-key", 60)
        stranger = sh.start(
            'exec flower-supernode --superlink "$SUPERLINK_HOST:$SUPERLINK_PORT" --root-certificates '
            '"$FLEET/tls/ca.crt" --auth-supernode-private-key "$FLEET/keys/stranger" --port "$SUPERNODE_PORT" '
            '--max-retries 2 --max-wait-time 30 --node-config "state-dir=\'$FLEET/nowhere\'"', "stranger")
        yield Fleet(root, sh, blocks, stranger)
    finally:
        sh.close(sorted(root.glob("*.pid")))


def _new_run(fleet: Fleet, known: int) -> int | None:
    rows = fleet.query("SELECT id FROM runs WHERE id > ? ORDER BY id", (known,))
    return rows[0][0] if rows else None


def _last_run(fleet: Fleet) -> int:
    rows = fleet.query("SELECT max(id) FROM runs")
    return (rows[0][0] or 0) if rows else 0


def _check_complete(fleet: Fleet, run_id: int, rounds: int) -> ResultsStore:
    store = ResultsStore(fleet.db)
    run = next(r for r in store.runs() if r["id"] == run_id)
    assert run["status"] == "finished", run
    rows = store.rounds(run_id)
    assert [(r["number"], r["kind"]) for r in rows] == [(1, "eval"), (2, "ab:A"), (2, "ab:B")][:rounds]
    for r in rows:
        assert r["finished_at"] is not None and r["sampled"] == len(DEVICES)
    return store


def _resume(fleet: Fleet, run_id: int) -> str:
    return fleet.sh.run(fleet.blocks["resume"], f"resume-{run_id}", 240, {"RUN": str(run_id)})


def test_a_killed_serverapp_loses_nothing_and_the_resumed_run_charges_no_device_twice(fleet):
    known, before = _last_run(fleet), fleet.releases()
    run = fleet.sh.start(fleet.blocks["run"], "run-serverapp-killed")
    run_id = wait_for(lambda: _new_run(fleet, known), 180, "the coordinator to start a run")
    # the first device released (its message is out): kill the ServerApp, and the run's stream with it
    wait_for(lambda: any(fleet.releases()[d] > before[d] for d in DEVICES), 180, "a device to release")
    kill_tree(wait_for(fleet.serverapp, 30, "the ServerApp process"))
    kill_tree(run.pid)
    # the others finish and release while no coordinator listens
    wait_for(lambda: all(fleet.releases()[d] == before[d] + 1 for d in DEVICES), 120, "every device to release")
    assert fleet.query("SELECT status FROM runs WHERE id = ?", (run_id,)) == [("running",)]

    out = _resume(fleet, run_id)
    assert f"marked aborted: run {run_id}" in out  # the ServerApp's process is gone: no minute to wait
    store = _check_complete(fleet, run_id, 1)
    assert next(r for r in store.runs() if r["id"] == run_id)["resumed"] == 1
    (rnd,) = store.rounds(run_id)
    assert sorted(x["device_id"] for x in store.reports(rnd["id"])) == fleet.identities
    # every device asked again (or not) for the same release-id answered from its stored reply
    assert fleet.releases() == {d: before[d] + 1 for d in DEVICES}
    store.close()


def test_a_killed_superlink_loses_nothing_once_restarted_and_resumed(fleet):
    known, before = _last_run(fleet), fleet.releases()
    run = fleet.sh.start(fleet.blocks["run"], "run-superlink-killed")
    run_id = wait_for(lambda: _new_run(fleet, known), 180, "the coordinator to start a run")
    wait_for(lambda: any(fleet.releases()[d] > before[d] for d in DEVICES), 180, "a device to release")
    kill_tree(fleet.pid("superlink"))  # the SuperLink, its ServerApp executor and the ServerApp
    kill_tree(run.pid)
    time.sleep(2)
    fleet.sh.run(fleet.blocks["superlink"], "superlink-restarted", 30)
    fleet.sh.run("until flwr ls fleet > /dev/null 2>&1; do sleep 1; done", "superlink-answers", 120)

    _resume(fleet, run_id)
    store = _check_complete(fleet, run_id, 1)
    (rnd,) = store.rounds(run_id)
    assert sorted(x["device_id"] for x in store.reports(rnd["id"])) == fleet.identities
    assert fleet.releases() == {d: before[d] + 1 for d in DEVICES}
    store.close()


def test_the_documented_ab_run_shows_progress_and_a_dead_supernode_costs_a_round_at_most_its_timeout(fleet):
    known = _last_run(fleet)
    run = fleet.sh.start(fleet.blocks["ab"], "run-ab")
    run_id = wait_for(lambda: _new_run(fleet, known), 180, "the coordinator to start a run")
    # device-3 dies once the A round is done: the B round's message to it is never answered
    wait_for(lambda: fleet.query("SELECT 1 FROM rounds WHERE run_id = ? AND kind = 'ab:A' AND finished_at"
                                 " IS NOT NULL", (run_id,)), 180, "the A round to finish", step=0.05)
    kill_tree(fleet.pid("device-3"))
    run.wait(timeout=180)
    out = fleet.sh.output(run)
    assert run.returncode == 0, out[-3000:]

    store = _check_complete(fleet, run_id, 3)
    rounds = store.rounds(run_id)
    assert [len(store.reports(r["id"])) for r in rounds] == [3, 3, 2]
    (dead,) = store.failures(rounds[2]["id"])
    # the round deadline passed (a timeout), or Flower's heartbeats declared the node gone before it
    # the dead node cost its round no more than the round deadline (default 120 s) and a few seconds
    assert rounds[2]["finished_at"] - rounds[2]["started_at"] < 120 + 5
    assert dead["device_id"] == fleet.identity("device-3") and (dead["kind"], dead["reason"][:28]) in (
        ("timeout", "no reply within the round's "), ("failure", "Error: Node Unavailable — Th"))
    devices = {d["device_id"]: d for d in store.devices()}
    assert sorted(devices) == fleet.identities
    assert all(d["profile"] == host_class() and d["threads"] > 0 and "/" in d["isa"] for d in devices.values())
    cmp = {c["device_class"]: c for c in store.comparisons(run_id)}
    assert cmp["all"]["devices"] == 2

    # what `flwr run --stream` showed, through Flower's logger
    for line in (f"cuvil run {run_id}: 1 evaluation round(s) of digits-mlp@1, then A/B against digits-mlp@2",
                 f"inventory: 3 devices ({host_class()} 3), 0 silent",
                 "round 1 [eval] digits-mlp@1: 3 devices sampled, bundle pushed to ",  # 0 after this module's
                 # earlier runs of it, 3 when this test runs alone
                 f"  round 1: {fleet.identity('device-1')} reported", "round 2 [ab:B] digits-mlp@2: 3 devices sampled",
                 f"{fleet.identity('device-3')} {dead['kind']}: {dead['reason'][:28]}",
                 "A/B: A = digits-mlp@1, B = digits-mlp@2", "  all: 2 devices, A ",
                 f"cuvil run {run_id} finished"):
        assert line in out, line
    assert f"{run_id}" in out.split(f"cuvil run {run_id} finished")[1]  # then `cuvil results` lists it
    store.close()

    # the SuperNode whose key was never registered was refused and never joined the federation
    wait_for(lambda: "failed to activate supernode" in fleet.sh.output(fleet.stranger).lower(), 60,
             "the stranger's refusal")
    ls = fleet.sh.run("flwr supernode ls fleet --format json", "supernode-ls", 60)
    listed = json.loads(ls[ls.index("{"):])["nodes"]
    assert len(listed) == len(DEVICES)
