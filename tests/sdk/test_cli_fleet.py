"""`cuvil device-provision`, `cuvil results --mark-aborted`, `cuvil fleet ...` (results: test_cli_results.py)."""

from __future__ import annotations

import re

from click.testing import CliRunner

from cuvil.cli import main
from cuvil.coordinator.store import ResultsStore


def test_device_provision(tmp_path):
    from cuvil import api

    keys = api.keygen(tmp_path / "keys", "author")
    out = CliRunner().invoke(main, ["device-provision", "--state-dir", str(tmp_path / "dev"), "--device-id", "j1",
                                    "--profile", "rpi5", "--trust", str(keys.public_path)])
    assert out.exit_code == 0 and "state-dir=" in out.output
    again = CliRunner().invoke(main, ["device-provision", "--state-dir", str(tmp_path / "dev"), "--device-id", "j1",
                                      "--profile", "rpi5", "--trust", str(keys.public_path)])
    assert again.exit_code == 1 and "already provisioned" in again.output


def test_mark_aborted_marks_runs_whose_coordinator_is_gone(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "r.db"
    code = f"from cuvil.coordinator.store import ResultsStore; ResultsStore({str(path)!r}).start_run({{}}, 'k')"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)  # that coordinator process is gone
    out = CliRunner().invoke(main, ["results", "--db", str(path), "--mark-aborted"])
    assert out.exit_code == 0 and "marked aborted: run 1" in out.output
    (run,) = ResultsStore(path).runs()
    assert run["status"] == "aborted" and run["reason"].startswith("coordinator gone")


def test_fleet_certs_node_key_and_example(tmp_path):
    from cuvil import api

    out = CliRunner().invoke(main, ["fleet", "certs", "--out", str(tmp_path / "tls"), "--san", "127.0.0.1",
                                    "--san", "localhost"])
    assert out.exit_code == 0 and "SANs: 127.0.0.1, localhost" in out.output
    assert sorted(p.name for p in (tmp_path / "tls").iterdir()) == ["ca.crt", "ca.key", "superlink.key",
                                                                   "superlink.pem"]
    bad = CliRunner().invoke(main, ["fleet", "certs", "--out", str(tmp_path / "x"), "--san", "no such host"])
    assert bad.exit_code == 1 and bad.output.startswith("error: SAN 'no such host'")
    out = CliRunner().invoke(main, ["fleet", "node-key", "--out", str(tmp_path / "keys" / "device-1")])
    assert out.exit_code == 0 and (tmp_path / "keys" / "device-1.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    assert re.search(r"^identity: +NAME@[0-9a-f]{16} ", out.output, re.M)
    keys = api.keygen(tmp_path / "author", "author")
    out = CliRunner().invoke(main, ["fleet", "example", "--key", str(keys.private_path), "--out",
                                    str(tmp_path / "ex"), "--devices", "2"])
    assert out.exit_code == 0, out.output
    for name in ("digits-v1.cuvil", "digits-v2.cuvil", "data/device-1.npz", "data/device-2.npz"):
        assert (tmp_path / "ex" / name).is_file()
    model = api.load(tmp_path / "ex" / "digits-v1.cuvil", [keys.public_path])
    assert model.graph.inputs == ("pixels",)
