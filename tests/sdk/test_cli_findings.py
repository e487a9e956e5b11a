"""Smaller CLI findings: Ctrl-C, output folders that hold files, options that were silently ignored or
taken for their default, inputs checked when they are given, and errors that name what is wrong."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import cuvil
from cuvil import api
from cuvil.cli import main

from ..compiler.bundle.helpers import small_graph

ROOT = Path(__file__).resolve().parents[2]
INTERRUPT = """
import importlib, os, signal, sys, tomllib
entry = tomllib.load(open({pyproject!r}, "rb"))["project"]["scripts"]["cuvil"]
module, name = entry.split(":")
command = getattr(importlib.import_module(module), name)
signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGINT))  # a real Ctrl-C, at a known time
signal.setitimer(signal.ITIMER_REAL, {after})
"""


@pytest.fixture(autouse=True)
def no_trust_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_TRUST_DIR", str(tmp_path / "no-trust-dir"))


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_ctrl_c_while_the_command_imports_is_one_line_and_exit_130():
    """The console script's entry point: Ctrl-C 50 ms in falls in the CLI's imports (half a second)."""
    done = _child(INTERRUPT.format(pyproject=str(ROOT / "pyproject.toml"), after=0.05)
                  + 'sys.argv = ["cuvil", "--version"]\nsys.exit(command())\n')
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "error: interrupted\n")


def test_ctrl_c_while_python_m_cuvil_imports_is_one_line_and_exit_130():
    code = ("import os, runpy, signal, sys\n"
            "signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGINT))\n"
            "signal.setitimer(signal.ITIMER_REAL, 0.05)\n"
            "sys.argv = ['cuvil', '--version']\n"
            "runpy.run_module('cuvil', run_name='__main__', alter_sys=True)\n")
    done = _child(code)
    assert (done.returncode, done.stderr) == (130, "error: interrupted\n")


def test_ctrl_c_in_a_command_ends_it_although_a_worker_thread_is_stuck_and_logs():
    """As Flower's simulation workers do after Ctrl-C: a non-daemon thread waits for ever on an engine that
    is gone and logs an ERROR traceback; the command printed Aborted! and never exited."""
    code = INTERRUPT.format(pyproject=str(ROOT / "pyproject.toml"), after=0) + textwrap.dedent("""
        import logging, threading, time
        from cuvil.cli import main as cli

        def worker():
            time.sleep(1.0)
            logging.getLogger("flwr").error("Traceback (most recent call last): ...")
            threading.Event().wait()

        @cli.command()
        def hang():
            threading.Thread(target=worker).start()
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            threading.Event().wait()

        sys.argv = ["cuvil", "hang"]
        sys.exit(command())
    """)
    done = _child(code)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "error: interrupted\n")


def test_an_interrupted_demo_removes_its_own_temporary_dir_and_never_the_users(tmp_path):
    from cuvil.demo import demo_workdir

    with pytest.raises(KeyboardInterrupt), demo_workdir(None, force=False) as work:
        (work / "results.db").write_bytes(b"half")
        raise KeyboardInterrupt
    assert work.name.startswith("cuvil-demo-") and not work.exists()
    mine = tmp_path / "mine"
    with pytest.raises(KeyboardInterrupt), demo_workdir(mine, force=False) as work:
        (work / "results.db").write_bytes(b"half")
        raise KeyboardInterrupt
    assert (mine / "results.db").read_bytes() == b"half"
    with demo_workdir(None, force=False) as work:  # a finished demo's results stay where it said they are
        pass
    assert work.is_dir()
    work.rmdir()


def _provision(tmp_path, data: Path):
    keys = api.keygen(tmp_path / "keys", "author")
    return CliRunner().invoke(main, ["device-provision", "--state-dir", str(tmp_path / "dev"), "--device-id", "d1",
                                     "--profile", "rpi5", "--trust", str(keys.public_path), "--data", str(data)])


@pytest.mark.parametrize("content, expected", [
    (None, "No such file or directory"),
    (b"x,y\n1,2\n", "not an .npz archive"),
    ("x only", "y is not a file in the archive"),
    ("pickled", "Object arrays cannot be loaded"),
])
def test_device_provision_reads_its_data_as_the_device_will_and_makes_nothing(tmp_path, content, expected):
    data = tmp_path / "data.npz"
    if content == "x only":
        np.savez(data, x=np.zeros((2, 1, 8, 8), np.float32))
    elif content == "pickled":
        np.savez(data, x=np.array([{}], object), y=np.zeros(1))
    elif content is not None:
        data.write_bytes(content)
    out = _provision(tmp_path, data)
    assert out.exit_code == 1 and out.output.count("\n") == 1, out.output
    assert out.output.startswith(f"error: cannot read the local dataset {data}: ") and expected in out.output
    assert not (tmp_path / "dev").exists()


def test_device_provision_takes_a_good_data_file(tmp_path):
    np.savez(tmp_path / "data.npz", x=np.zeros((2, 1, 8, 8), np.float32), y=np.zeros(2, np.int64))
    assert _provision(tmp_path, tmp_path / "data.npz").exit_code == 0


def test_fleet_example_refuses_a_folder_that_holds_files_unless_force(tmp_path):
    keys = api.keygen(tmp_path / "keys", "author")
    out_dir = tmp_path / "ex"
    out_dir.mkdir()
    (out_dir / "notes.txt").write_text("mine")
    args = ["fleet", "example", "--key", str(keys.private_path), "--out", str(out_dir), "--devices", "1"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 1 and refused.output == f"error: {out_dir} is not empty; pass --force to write into it\n"
    assert sorted(p.name for p in out_dir.iterdir()) == ["notes.txt"]
    assert CliRunner().invoke(main, [*args, "--force"]).exit_code == 0
    assert (out_dir / "digits-v1.cuvil").is_file() and (out_dir / "notes.txt").read_text() == "mine"


def test_demo_refuses_a_workdir_that_holds_files_unless_force(tmp_path):
    (tmp_path / "results.db").write_bytes(b"an earlier run")
    refused = CliRunner().invoke(main, ["demo", "--workdir", str(tmp_path)])
    assert refused.exit_code == 1 and "is not empty; pass --force" in refused.output
    assert (tmp_path / "results.db").read_bytes() == b"an earlier run"


@pytest.fixture
def bundle(tmp_path):
    pair = api.keygen(tmp_path / "keys")
    path = tmp_path / "m.cuvil"
    cuvil.export(small_graph(), path, pair.private_path, name="small", version="1")
    np.save(tmp_path / "x.npy", np.ones((1, 8), np.float32))
    return path, pair.public_path


@pytest.mark.parametrize("bits", ["0", "-128", "100", "4096", "2176"])
def test_sve_bits_the_architecture_forbids_are_a_usage_error(bundle, bits):
    path, pub = bundle
    out = CliRunner().invoke(main, ["run", str(path), "--trust", str(pub), "--input", str(path.parent / "x.npy"),
                                    "--device", "graviton3", "--sve-bits", bits])
    assert out.exit_code == 2 and "--sve-bits" in out.output, out.output


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_npz_inputs_with_a_name_twice_are_refused(bundle):
    path, pub = bundle
    inputs = path.parent / "in.npz"
    with zipfile.ZipFile(inputs, "w") as z:
        for value in (1.0, 2.0):
            with z.open("x.npy", "w") as f:
                np.lib.format.write_array(f, np.full((1, 8), value, np.float32))
    out = CliRunner().invoke(main, ["run", str(path), "--trust", str(pub), "--inputs", str(inputs)])
    assert out.exit_code == 1 and out.output == f"error: cannot read inputs from {inputs}: 'x.npy' is in the archive twice\n"


@pytest.mark.parametrize("given, code", [(["--percentile", "99.9"], 2), (["--percentile", "99.9", "--calibration-method",
                                                                          "percentile"], 1), ([], 1)])
def test_percentile_without_the_percentile_method_is_a_usage_error(tmp_path, given, code):
    """Exit 1 where it is accepted: the model file does not exist (the usage check comes first)."""
    out = CliRunner().invoke(main, ["import", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "o.cuvil"), "--key",
                                    str(tmp_path / "k.key"), *given])
    assert out.exit_code == code, out.output
    assert ("--percentile is for --calibration-method percentile" in out.output) == (code == 2)


@pytest.mark.parametrize("name, content, expected", [
    ("zero.cuvil", bytes(4096), "the file is all zero bytes"),
    ("zero.onnx", bytes(4096), "the file is all zero bytes"),
    ("empty.cuvil", b"", "the file is empty"),
    ("big.cuvil", bytes(1 << 17), "the file is zero bytes at its start"),
], ids=["zero-bundle", "zero-onnx", "empty-bundle", "big-zero-bundle"])
def test_inspect_of_an_empty_or_zero_filled_file_says_so(tmp_path, name, content, expected):
    (tmp_path / name).write_bytes(content)
    out = CliRunner().invoke(main, ["inspect", str(tmp_path / name)])
    assert out.exit_code == 1 and out.output == f"error: {tmp_path / name} is not a model: {expected}\n"
