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


def _provision(tmp_path, *trust):
    args = ["device-provision", "--state-dir", str(tmp_path / "dev"), "--device-id", "j1", "--profile", "rpi5"]
    return CliRunner().invoke(main, [*args, *(a for t in trust for a in ("--trust", str(t)))])


def test_device_provision_refuses_what_the_device_could_not_trust_and_makes_nothing(tmp_path):
    from cuvil import api

    first, second = api.keygen(tmp_path / "k1", "cuvil"), api.keygen(tmp_path / "k2", "cuvil")
    (tmp_path / "k.txt").write_bytes(first.public_path.read_bytes())
    cases = {  # --trust files -> the one line it is refused with
        (first.public_path, second.public_path): "two different trusted keys are named cuvil.pub",
        (first.private_path,): "is not a PEM public key",  # was copied into the device with mode 0644
        (tmp_path / "k.txt",): "must end in .pub or .pem",  # the device reads no other: it would trust nothing
    }
    for trust, expected in cases.items():
        out = _provision(tmp_path, *trust)
        assert out.exit_code == 1 and out.output.startswith("error: ") and expected in out.output, out.output
        assert not (tmp_path / "dev").exists()
    ok = _provision(tmp_path, first.public_path, first.public_path)  # one key named twice is one key
    assert ok.exit_code == 0, ok.output
    assert [p.name for p in (tmp_path / "dev" / "trusted").iterdir()] == ["cuvil.pub"]


def test_device_provision_refuses_a_fifo_as_a_key_without_blocking(tmp_path):
    import os
    import threading

    fifo = tmp_path / "f.pub"
    os.mkfifo(fifo)
    result = []
    worker = threading.Thread(target=lambda: result.append(_provision(tmp_path, fifo)), daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():  # the old copy blocked in open(): give it a writer that closes at once, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(20)
    assert result and result[0].exit_code == 1 and "not a regular file" in result[0].output, result


def test_rollout_that_no_device_evaluated_says_why_and_exits_non_zero(tmp_path, monkeypatch):
    from cuvil.coordinator import simulation

    def refused_everywhere(num_devices, rc, fleet_dir, trusted_keys, **kwargs):
        """What a fleet that trusts another signer records: every device refuses, nothing is reported."""
        store = ResultsStore(rc["db-path"])
        run = store.start_run({})
        for number, kind in ((1, "eval"), (2, "ab:A"), (2, "ab:B")):
            rnd = store.start_round(run, number, kind, "m@1", "a" * 64, "digits")
            if kind == "eval":
                for dev in ("d1", "d2"):
                    store.add_failure(rnd, dev, "refused", "SIGNATURE_REJECTED: bundle_rejected")
        store.add_rollout(run, "rpi5", "m@1", "m@2", 1, 0, 2, None, None, None, 0.05, 0.0, "rollback",
                          "no canary reported both versions: nothing shows B is safe")
        store.finish_run(run)
        store.close()

    monkeypatch.setattr(simulation, "run_fleet_simulation", refused_everywhere)
    for name in ("a.cuvil", "b.cuvil", "k.pub"):
        (tmp_path / name).write_bytes(b"x")
    out = CliRunner().invoke(main, ["rollout", str(tmp_path / "a.cuvil"), str(tmp_path / "b.cuvil"),
                                    "--trust", str(tmp_path / "k.pub"), "--db", str(tmp_path / "r.db")])
    assert out.exit_code == 1, out.output
    assert "rpi5: rollback" in out.stdout
    assert out.stderr == ("error: run 1: no device reported an evaluation: 2 devices refused (SIGNATURE_REJECTED: "
                          "bundle_rejected): does --trust name the key that signed the bundles?\n")
