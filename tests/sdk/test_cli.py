"""The `cuvil` command, through click's CliRunner and as a real `python -m cuvil` process."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import cuvil
from cuvil.cli import main
from cuvil.compiler.errors import BundleError

from ..compiler.bundle.helpers import small_graph


@pytest.fixture(autouse=True)
def no_trust_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_TRUST_DIR", str(tmp_path / "no-trust-dir"))


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args: str, ok: bool = True):
        result = runner.invoke(main, [str(a) for a in args])
        if ok:
            assert result.exit_code == 0, (result.output, result.exception)
        return result

    return invoke


@pytest.fixture
def setup(tmp_path, cli):
    cli("keygen", "--out", tmp_path / "keys")
    bundle = tmp_path / "m.cuvil"
    cuvil.export(small_graph(), bundle, tmp_path / "keys" / "cuvil.key", name="small", version="7")
    return tmp_path, bundle, tmp_path / "keys" / "cuvil.pub"


def one_line_error(result, code: int = 1) -> str:
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_keygen(tmp_path, cli):
    result = cli("keygen", "--out", tmp_path / "k", "--name", "author")
    assert stat.S_IMODE((tmp_path / "k" / "author.key").stat().st_mode) == 0o600
    assert (tmp_path / "k" / "author.pub").exists() and "fingerprint" in result.stdout
    assert "already exists" in one_line_error(cli("keygen", "--out", tmp_path / "k", "--name", "author", ok=False))


def test_verify_ok_wrong_key_and_tampering(setup, cli, tmp_path):
    _, bundle, pub = setup
    assert "ok:" in cli("verify", bundle, "--trust", pub).stdout
    cli("keygen", "--out", tmp_path / "other")
    assert "not trusted" in one_line_error(cli("verify", bundle, "--trust", tmp_path / "other" / "cuvil.pub", ok=False))
    data = bundle.read_bytes()
    for name, content in {"flip": data[:300] + bytes([data[300] ^ 4]) + data[301:], "cut": data[:-1],
                          "long": data + b"\0", "empty": b""}.items():
        bad = tmp_path / f"{name}.cuvil"
        bad.write_bytes(content)
        one_line_error(cli("verify", bad, "--trust", pub, ok=False))
        one_line_error(cli("run", bad, "--trust", pub, "--input", pub, ok=False))


def test_verify_without_any_trusted_key(setup, cli):
    _, bundle, _ = setup
    assert "no trusted keys" in one_line_error(cli("verify", bundle, ok=False))


def test_missing_files_are_one_line_errors(setup, cli, tmp_path):
    _, bundle, pub = setup
    one_line_error(cli("verify", tmp_path / "nope.cuvil", "--trust", pub, ok=False))
    one_line_error(cli("verify", bundle, "--trust", tmp_path / "nope.pub", ok=False))
    one_line_error(cli("inspect", tmp_path / "nope.cuvil", ok=False))


def test_debug_shows_the_exception(setup, cli, tmp_path):
    _, bundle, _ = setup
    cli("keygen", "--out", tmp_path / "other")
    result = cli("--debug", "verify", bundle, "--trust", tmp_path / "other" / "cuvil.pub", ok=False)
    assert result.exit_code == 1 and isinstance(result.exception, BundleError)


def test_usage_errors_exit_2(setup, cli):
    _, bundle, pub = setup
    assert cli("run", bundle, "--trust", pub, ok=False).exit_code == 2  # neither --input nor --inputs
    assert cli("frobnicate", ok=False).exit_code == 2
    assert cli("run", bundle, "--trust", pub, "--input", bundle, "--sve-bits", "128", ok=False).exit_code == 2  # ignored
    bad_batch = cli("compile", bundle, "--trust", pub, "--target", "host", "--batch", "-1", ok=False)
    assert bad_batch.exit_code == 2 and "Traceback" not in bad_batch.output  # was a 52-line ValueError


def test_run_matches_the_interpreter_exactly(setup, cli):
    tmp_path, bundle, pub = setup
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "in.npz", x=x)
    want = cuvil.run_reference(small_graph(), {"x": x})
    for flag, path in (("--input", "x.npy"), ("--inputs", "in.npz")):
        out = tmp_path / f"out-{flag.strip('-')}.npz"
        cli("run", bundle, "--trust", pub, flag, tmp_path / path, "--output", out, "--reference")
        with np.load(out, allow_pickle=False) as got:
            assert sorted(got.files) == sorted(want)
            assert all(got[k].tobytes() == want[k].tobytes() for k in want)
    assert "y: float32[4, 8]" in cli("run", bundle, "--trust", pub, "--input", tmp_path / "x.npy").stdout
    np.save(tmp_path / "x64.npy", x.astype(np.float64))
    assert "dtype" in one_line_error(cli("run", bundle, "--trust", pub, "--input", tmp_path / "x64.npy", ok=False))


def test_inspect_bundle(setup, cli):
    _, bundle, pub = setup
    out = cli("inspect", bundle).stdout
    assert out.startswith('graph "small"') and "NOT trusted" in out
    assert "parameters:" in out and "FLOPs:" in out and "inputs:      x: f32[N,8]" in out
    out = cli("inspect", bundle, "--trust", pub, "--no-graph").stdout
    assert "(trusted)" in out and "graph" not in out.splitlines()[0]


def test_opset9_initializers_listed_as_inputs_run_with_the_one_data_input(tmp_path, cli):
    """IR version 3 lists every initializer among the graph inputs (inputs with defaults): the bundle
    takes only the data input, so ``run --input x.npy`` works and matches ONNX Runtime fed ``x`` alone."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("cuvil.compiler.frontends.onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(9)
    inits = {"W": rng.standard_normal((5, 4)).astype(np.float32), "B": rng.standard_normal(5).astype(np.float32),
             "S": np.array([1, 5], np.int64)}
    nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["h"], transB=1), helper.make_node("Reshape", ["h", "S"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])] + [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)) for n, v in inits.items()]
    graph = helper.make_graph(nodes, "op9", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
                              [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 3
    onnx.save(model, tmp_path / "op9.onnx")
    x = rng.standard_normal((1, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    (want,) = ort.InferenceSession(str(tmp_path / "op9.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    cli("keygen", "--out", tmp_path / "k")
    cli("import", tmp_path / "op9.onnx", "-o", tmp_path / "op9.cuvil", "--key", tmp_path / "k" / "cuvil.key")
    cli("run", tmp_path / "op9.cuvil", "--trust", tmp_path / "k" / "cuvil.pub", "--input", tmp_path / "x.npy",
        "--output", tmp_path / "y.npz")
    with np.load(tmp_path / "y.npz", allow_pickle=False) as got:
        np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-6)


def test_import_and_inspect_onnx(tmp_path, cli):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("cuvil.compiler.frontends.onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "tiny",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "tiny.onnx")
    assert "FLOPs:       24 FLOPs" in cli("inspect", tmp_path / "tiny.onnx").stdout
    cli("keygen", "--out", tmp_path / "k")
    for out in ("a.cuvil", "b.cuvil"):
        cli("import", tmp_path / "tiny.onnx", "-o", tmp_path / out, "--key", tmp_path / "k" / "cuvil.key",
            "--name", "tiny", "--model-version", "3")
    assert (tmp_path / "a.cuvil").read_bytes() == (tmp_path / "b.cuvil").read_bytes()
    assert "tiny 3" in cli("verify", tmp_path / "a.cuvil", "--trust", tmp_path / "k" / "cuvil.pub").stdout
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    one_line_error(cli("import", tmp_path / "bad.onnx", "-o", tmp_path / "c.cuvil", "--key",
                       tmp_path / "k" / "cuvil.key", ok=False))


def test_real_process(setup):
    tmp_path, bundle, pub = setup

    def cuvil_cmd(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cuvil", *map(str, args)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "CUVIL_TRUST_DIR": str(tmp_path / "none")})

    ok = cuvil_cmd("verify", bundle, "--trust", pub)
    assert ok.returncode == 0 and "ok:" in ok.stdout, ok.stderr
    bad = tmp_path / "bad.cuvil"
    data = bundle.read_bytes()
    bad.write_bytes(data[:-10] + bytes([data[-10] ^ 1]) + data[-9:])
    refused = cuvil_cmd("verify", bad, "--trust", pub)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("error: ") and "Traceback" not in refused.stderr


def test_control_characters_never_reach_the_terminal(tmp_path, cli):
    from cuvil.compiler import DType, N, Node, TensorType, infer_graph_types

    name = "evil\x1b[2J"
    g = infer_graph_types("g", {name: TensorType(DType.F32, (N, 2))}, {}, [Node.make("Relu", [name], ["y"])], ["y"])
    cli("keygen", "--out", tmp_path / "k")
    cuvil.export(g, tmp_path / "e.cuvil", tmp_path / "k" / "cuvil.key")
    out = cli("inspect", tmp_path / "e.cuvil").stdout
    assert "\x1b" not in out and "evil" in out


def test_delta_writes_a_signed_delta_that_rebuilds_the_target(setup, cli):
    from cuvil.compiler.bundle import apply_delta, load_public_key, read_delta
    from ..compiler.bundle.helpers import big_graph

    tmp, _, pub = setup
    key = tmp / "keys" / "cuvil.key"
    g = big_graph(1 << 18, 4)
    v1, v2 = tmp / "v1.cuvil", tmp / "v2.cuvil"
    cuvil.export(g, v1, key, name="big", version="1")
    cuvil.export(g.replace(constants={**g.constants, "layer0.weight": g.constants["layer0.weight"] * 2}), v2, key,
                 name="big", version="2")
    out = cli("delta", v1, v2, "-o", tmp / "d.delta", "--key", key).stdout
    assert out.count("\n") == 1 and "d.delta" in out and "x the" in out
    trusted = [load_public_key(pub)]
    rebuilt = apply_delta(read_delta((tmp / "d.delta").read_bytes(), trusted), v1.read_bytes(), trusted)
    assert rebuilt == v2.read_bytes() and (tmp / "d.delta").stat().st_size < 0.5 * v2.stat().st_size
    assert "Cuvil bundle" in one_line_error(cli("delta", pub, v2, "-o", tmp / "x", "--key", key, ok=False))


def test_an_output_that_names_an_input_is_refused_and_the_input_kept(setup, cli):
    """``import -o KEY --key KEY`` replaced the signing key with a bundle; run and delta alike. The
    check goes by the file, so a second name (a hard link) is caught too."""
    tmp_path, bundle, pub = setup
    key = tmp_path / "keys" / "cuvil.key"
    os.link(key, tmp_path / "key-again")
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((2, 8), np.float32))
    before = {p: p.read_bytes() for p in (key, bundle, x)}
    for args in (("delta", bundle, bundle, "-o", key, "--key", key),
                 ("delta", bundle, bundle, "-o", tmp_path / "key-again", "--key", key),
                 ("delta", bundle, bundle, "-o", bundle, "--key", key),
                 ("run", bundle, "--trust", pub, "--input", x, "--output", x)):
        assert "refusing to overwrite it" in one_line_error(cli(*args, ok=False))
    assert {p: p.read_bytes() for p in before} == before


def test_key_names_are_file_names_and_success_lines_stay_one_line(tmp_path, cli):
    """keygen --name $'a\\nforged: line' made files with control characters and printed a forged line."""
    for name in ("a\nforged: line", "x\x1b[31m", "", ".hidden", "a/b", "x" * 200):
        assert "bad key name" in one_line_error(cli("keygen", "--out", tmp_path / "k", "--name", name, ok=False))
    assert not (tmp_path / "k").exists() or not any((tmp_path / "k").iterdir())
    odd = tmp_path / "out\ndir"
    result = cli("keygen", "--out", odd, "--name", "ok-1.2_x")
    assert len(result.stdout.splitlines()) == 3 and "\\n" in result.stdout.splitlines()[0]


def test_a_closed_or_full_standard_output_is_an_error(tmp_path):
    """With stdout closed every command exited 0 having printed nothing; --help on a full device printed a
    33-line traceback. Both are one line on stderr and exit 1."""
    closed = subprocess.run(f"{sys.executable} -m cuvil devices >&-", shell=True, capture_output=True, text=True,
                            timeout=120)
    assert closed.returncode == 1 and closed.stderr == "error: standard output is closed\n"
    with open("/dev/full", "w") as full:
        help_ = subprocess.run([sys.executable, "-m", "cuvil", "--help"], stdout=full, stderr=subprocess.PIPE,
                               text=True, timeout=120)
    assert help_.returncode == 1 and help_.stderr.count("\n") == 1 and help_.stderr.startswith("error: ")
