"""`cuvil import --int8`: a float ONNX model quantized from calibration inputs, a QDQ model as it is."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

import cuvil
from cuvil.cli import main
from tests.qdq import draws, quantize_static
from tests.zoo import export_onnx


@pytest.fixture(autouse=True)
def no_trust_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_TRUST_DIR", str(tmp_path / "no-trust-dir"))


def _run(*args, ok=True):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert (result.exit_code == 0) == ok, (result.output, result.exception)
    return result.output


def test_import_int8_with_calibration_writes_a_quarter_size_bundle(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.Flatten(),
                        nn.Linear(64 * 6 * 6, 32)).eval()
    proto = export_onnx(net, (torch.randn(1, 3, 8, 8),), tmp_path / "m.onnx", dynamic_batch=True)
    np.savez(tmp_path / "calib.npz", input=np.stack(draws((3, 8, 8), 16, seed=3)))
    _run("keygen", "--out", tmp_path / "k")
    key = tmp_path / "k" / "cuvil.key"
    _run("import", tmp_path / "m.onnx", "-o", tmp_path / "f32.cuvil", "--key", key)
    out = _run("import", tmp_path / "m.onnx", "-o", tmp_path / "i8.cuvil", "--key", key, "--int8",
               "--calibration", tmp_path / "calib.npz", "--calibration-method", "percentile", "--reduce-range")
    assert "SQNR" in out and "top-1 agreement" in out
    ratio = (tmp_path / "i8.cuvil").stat().st_size / (tmp_path / "f32.cuvil").stat().st_size
    assert ratio < 0.27  # int8 weights; their scales cost a few KiB of manifest
    model = cuvil.load(tmp_path / "i8.cuvil", trusted_keys=[tmp_path / "k" / "cuvil.pub"])
    ops = {n.op for n in model.graph.nodes}
    assert {"QConv", "QMatMul"} <= ops and not ops & {"Conv", "Gemm"}, ops  # signed in integer form
    int8 = [w for w in model.graph.constants.values() if w.dtype == np.int8]
    assert int8 and max(int(np.abs(w.astype(np.int32)).max()) for w in int8) == 63  # --reduce-range: 7-bit

    qdq = tmp_path / "qdq.onnx"
    import onnx

    onnx.save(quantize_static(proto, draws((1, 3, 8, 8), 4, seed=1)), qdq)
    assert "quantized already" in _run("import", qdq, "-o", tmp_path / "q.cuvil", "--key", key, "--int8")
    model = cuvil.load(tmp_path / "q.cuvil", trusted_keys=[tmp_path / "k" / "cuvil.pub"])
    assert "QConv" in {n.op for n in model.graph.nodes}
    bad = _run("import", tmp_path / "m.onnx", "-o", tmp_path / "x.cuvil", "--key", key, "--int8", ok=False)
    assert "--calibration" in bad and "Traceback" not in bad
    bad = _run("import", qdq, "-o", tmp_path / "x.cuvil", "--key", key, "--int8", "--reduce-range", ok=False)
    assert "--reduce-range" in bad and "Traceback" not in bad


def test_calibration_method_and_bias_correction_options(tmp_path):
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    export_onnx(net, (torch.randn(1, 32),), tmp_path / "m.onnx", dynamic_batch=True)
    np.savez(tmp_path / "calib.npz", input=np.stack(draws((32,), 64, seed=3)))
    _run("keygen", "--out", tmp_path / "k")
    args = ["import", tmp_path / "m.onnx", "-o", tmp_path / "i8.cuvil", "--key", tmp_path / "k" / "cuvil.key",
            "--int8", "--calibration", tmp_path / "calib.npz"]
    assert "minmax calibration, bias correction)" in _run(*args)  # the defaults
    out = _run(*args, "--calibration-method", "entropy", "--no-bias-correction")
    assert "(entropy calibration)" in out
    assert "(mse calibration, bias correction)" in _run(*args, "--calibration-method", "mse")
    bad = _run(*args, "--calibration-method", "kl", ok=False)
    assert "kl" in bad and "Traceback" not in bad
    out = _run(*args, "--sensitivity", "--float-layer", "/2/Gemm")
    assert "kept in float: /2/Gemm" in out and "costs most: /0/Gemm" in out  # the only int8 layer left
    model = cuvil.load(tmp_path / "i8.cuvil", trusted_keys=[tmp_path / "k" / "cuvil.pub"])
    assert [n.op for n in model.graph.nodes if n.op in ("Gemm", "QMatMul")] == ["QMatMul", "Gemm"]
    bad = _run(*args, "--float-layer", "/9/Gemm", ok=False)
    assert "/9/Gemm" in bad and "/0/Gemm, /2/Gemm" in bad and "Traceback" not in bad


def test_target_agreement_from_check_inputs(tmp_path):
    """An MLP whose first input feature is 300x the others: all int8 it keeps the top-1 class on 91%
    of the check inputs, its first layer in float on 99.8% (tests/compiler/test_quantize.py)."""
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    with torch.no_grad():
        net[0].weight[:, 0] /= 300
    export_onnx(net, (torch.randn(1, 16),), tmp_path / "m.onnx", dynamic_batch=True)
    for name, count, seed in (("calib", 256, 0), ("check", 400, 1)):
        x = np.stack(draws((16,), count, seed))
        x[:, 0] *= 300
        np.savez(tmp_path / f"{name}.npz", input=x)
    _run("keygen", "--out", tmp_path / "k")
    args = ["import", tmp_path / "m.onnx", "-o", tmp_path / "i8.cuvil", "--key", tmp_path / "k" / "cuvil.key",
            "--int8", "--calibration", tmp_path / "calib.npz"]
    out = _run(*args, "--target-agreement", "0.99", "--check-inputs", tmp_path / "check.npz")
    assert "on 400 check inputs: the first 1 layers in float" in out and "kept in float: /0/Gemm" in out
    model = cuvil.load(tmp_path / "i8.cuvil", trusted_keys=[tmp_path / "k" / "cuvil.pub"])
    assert [n.op for n in model.graph.nodes if n.op in ("Gemm", "FusedGemm", "QMatMul")][1:] == ["QMatMul", "QMatMul"]
    bad = _run(*args, "--target-agreement", "1.0", "--check-inputs", tmp_path / "check.npz", ok=False)
    assert "not reached" in bad and "Traceback" not in bad and len(bad.strip().splitlines()) == 1
    bad = _run("import", tmp_path / "m.onnx", "-o", tmp_path / "x.cuvil", "--key", tmp_path / "k" / "cuvil.key",
               "--target-agreement", "0.99", ok=False)
    assert "--target-agreement is for --int8 --calibration" in bad
