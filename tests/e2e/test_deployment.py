"""Flower's deployment engine on loopback: a SuperLink and SuperNodes with TLS and node authentication.

Certificates and node keys are made here with ``cryptography``. One evaluation round runs over three
SuperNodes; one is killed mid-round and the round completes with the other two, the kill recorded
as a failure (or a timeout); a SuperNode whose key was never registered is refused. Every wait is bounded and
every process is killed at the end, whatever happens.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")
if shutil.which("flower-superlink") is None or shutil.which("flower-supernode") is None:
    pytest.skip("flower-superlink / flower-supernode not installed", allow_module_level=True)

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

from cuvil.coordinator.device import DeviceState  # noqa: E402
from cuvil.coordinator.fleet import device_data, host_class  # noqa: E402
from cuvil.coordinator.store import ResultsStore  # noqa: E402

from ..coordinator.fleet_helpers import make_bundle, make_keys  # noqa: E402

pytestmark = pytest.mark.slow
def flower_tool(name: str) -> str:
    """Flower's console script beside this interpreter, else on PATH (a venv over system packages)."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    assert found, f"{name} is not installed (pip install 'flwr[simulation]')"
    return found


# certificates and keys ----------------------------------------------------------------------------
def _cert(subject: str, key, issuer_name, issuer_key, ca: bool) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(issuer_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        b = (b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                          x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False))
    return b.sign(issuer_key, hashes.SHA256())


def make_tls(d: Path) -> dict[str, Path]:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cuvil test CA")])
    ca = _cert("cuvil test CA", ca_key, ca_name, ca_key, ca=True)
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv = _cert("127.0.0.1", srv_key, ca_name, ca_key, ca=False)
    files = {"ca": d / "ca.crt", "cert": d / "server.pem", "key": d / "server.key"}
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files["cert"].write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    files["key"].write_bytes(srv_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    return files


def make_node_key(d: Path, name: str) -> tuple[Path, Path]:
    """An EC P-384 key pair in OpenSSH format, as SuperNode authentication expects."""
    key = ec.generate_private_key(ec.SECP384R1())
    priv, pub = d / name, d / f"{name}.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    os.chmod(priv, 0o600)
    return priv, pub


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# processes ----------------------------------------------------------------------------------------
class Procs:
    """Every process the test starts, each in its own session so its children die with it (killpg)."""

    def __init__(self, logs: Path, env: dict[str, str]):
        self.logs, self.env, self.procs = logs, env, {}

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.procs[name] = (p, log)
        return p

    def kill(self, name: str) -> None:
        p, log = self.procs.pop(name)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=30)
        log.close()

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name)


def wait_for(cond, timeout: float, what: str, step: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def flwr(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([flower_tool("flwr"), *args], env=env, capture_output=True, text=True, timeout=timeout)


APP_TOML = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "cuvil-fleet-e2e"
version = "1.0.0"
description = "Cuvil federated evaluation (deployment test)"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "cuvil"

[tool.flwr.app.components]
serverapp = "cuvil.coordinator.server_app:app"
clientapp = "cuvil.coordinator.client_app:app"

[tool.flwr.app.config]
db-path = "{db}"
bundle = "{bundle}"
num-rounds = 1
round-timeout = 60.0
inventory-timeout = 90.0
min-nodes = 3
node-wait = 120.0
poll-interval = 1.0
"""


@pytest.fixture
def deployment(tmp_path):
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr-home"), "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1"}
    (tmp_path / "logs").mkdir()
    procs = Procs(tmp_path / "logs", env)
    try:
        yield tmp_path, env, procs
    finally:
        procs.close()


def test_round_over_tls_with_node_auth_survives_a_killed_node(deployment):
    tmp, env, procs = deployment
    tls = make_tls(tmp)
    port = free_port()
    author = make_keys(tmp)
    bundle = make_bundle(tmp, author)
    db = tmp / "results.db"

    procs.start("superlink", [flower_tool("flower-superlink"), "--ssl-ca-certfile", str(tls["ca"]),
                              "--ssl-certfile", str(tls["cert"]), "--ssl-keyfile", str(tls["key"]),
                              "--enable-supernode-auth", "--host", "127.0.0.1", "--port", str(port),
                              "--database", str(tmp / "superlink.db"), "--disable-runtime-dependency-installation"])
    (tmp / "flwr-home").mkdir()
    (tmp / "flwr-home" / "config.toml").write_text(
        f'[superlink]\ndefault = "e2e"\n\n[superlink.e2e]\naddress = "127.0.0.1:{port}"\n'
        f'root-certificates = "{tls["ca"]}"\n')
    wait_for(lambda: flwr(env, "ls", "e2e", timeout=30).returncode == 0, 60, "the SuperLink to answer over TLS")

    nodes = []
    for i in range(3):
        priv, pub = make_node_key(tmp, f"node{i}")
        reg = flwr(env, "supernode", "register", str(pub), "e2e", "--name", f"device-{i}")
        assert reg.returncode == 0, reg.stdout + reg.stderr
        state = DeviceState.provision(tmp / f"device{i}", f"device-{i}", host_class(), [author.public_path],
                                      data=device_data(i, 3))
        nodes.append(f"node{i}")
        procs.start(f"node{i}", [flower_tool("flower-supernode"), "--superlink", f"127.0.0.1:{port}",
                                 "--root-certificates", str(tls["ca"]), "--auth-supernode-private-key", str(priv),
                                 "--port", str(free_port()), "--node-config", f"state-dir='{state.root}'"])
    stranger, _ = make_node_key(tmp, "stranger")  # never registered
    procs.start("stranger", [flower_tool("flower-supernode"), "--superlink", f"127.0.0.1:{port}",
                             "--root-certificates", str(tls["ca"]), "--auth-supernode-private-key", str(stranger),
                             "--port", str(free_port()), "--max-retries", "2", "--max-wait-time", "30",
                             "--node-config", f"state-dir='{tmp / 'nowhere'}'"])

    app = tmp / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text(APP_TOML.format(db=db, bundle=bundle))
    run = procs.start("run", [flower_tool("flwr"), "run", str(app), "e2e", "--stream"])

    def round_started() -> bool:
        if not db.is_file():
            return False
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
                return c.execute("SELECT count(*) FROM rounds").fetchone()[0] > 0
        except sqlite3.Error:
            return False

    wait_for(round_started, 240, "the coordinator to start round 1", step=0.2)
    procs.kill("node2")  # mid-round: its message is out, its reply never comes
    wait_for(lambda: run.poll() is not None, 240, "the run to finish")

    store = ResultsStore(db)  # a fresh handle: everything the coordinator wrote is on disk
    (run_row,) = store.runs()
    assert run_row["status"] == "finished", procs.log("superlink")[-3000:]
    devices = {d["device_id"] for d in store.devices()}
    assert devices == {"device-0", "device-1", "device-2"}
    (rnd,) = store.rounds(run_row["id"])
    reports = store.reports(rnd["id"])
    failures = store.failures(rnd["id"])
    assert rnd["sampled"] == 3 and rnd["finished_at"] is not None
    assert sorted(r["device_id"] for r in reports) == ["device-0", "device-1"]
    # the SuperLink reports the dead node (NODE_UNAVAILABLE, a failure) or the round deadline passes (a timeout)
    assert [f["device_id"] for f in failures] == ["device-2"] and failures[0]["kind"] in ("failure", "timeout")
    assert failures[0]["reason"]
    assert all(r["metrics"]["cache_hit"] == 0 for r in reports)

    # the SuperNode whose key was never registered is refused and never joins the federation
    wait_for(lambda: "failed to activate supernode" in procs.log("stranger").lower(), 60, "the stranger's refusal")
    ls = flwr(env, "supernode", "ls", "e2e", "--format", "json", timeout=60)
    assert ls.returncode == 0, ls.stdout + ls.stderr
    listed = json.loads(ls.stdout[ls.stdout.index("{"):])["nodes"]
    assert len(listed) == 3  # the three registered devices; the stranger never joined
    store.close()
