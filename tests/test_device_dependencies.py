"""A device needs only the base dependencies: a fresh venv with exactly those evaluates and releases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import numpy as np
import pytest

from cuvil.coordinator.fleet import device_data

from .coordinator.fleet_helpers import make_bundle, make_keys

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("dp_accounting", "opacus", "torch", "flwr", "scipy", "onnx", "onnxruntime")

DEVICE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from cuvil.coordinator.device import DeviceState, EvalRequest, evaluate
    from cuvil.edge_runtime.loader import load_bytes

    root, bundle, key, data, profile = sys.argv[1:6]
    with np.load(data) as z:
        state = DeviceState.provision(root, "fresh", profile, [key], data=(z["x"], z["y"]))
    raw = open(bundle, "rb").read()
    model, held = state.accept_bundle(raw, load_bytes(raw, state.trust()).content_hash)
    first = evaluate(state, model, EvalRequest(model.content_hash, "ds", "r1", latency_runs=3), held)
    again = evaluate(state, model, EvalRequest(model.content_hash, "ds", "r1", latency_runs=3), True)
    print(json.dumps({"report": first.as_metrics(), "repeat_same": first.dp_correct == again.dp_correct,
                      "heavy": sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[6].split(",")))}))
""")


@pytest.mark.slow
def test_a_fresh_venv_with_only_the_base_dependencies_evaluates_and_releases(tmp_path):
    base = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    # nothing of this process's environment may leak in (Ray, for one, sets PYTHONPATH)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300, env=env)
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check"]
    log = ""
    for args in ([*base, "-c", str(ROOT / "constraints.txt")], ["--no-deps", "-e", str(ROOT)]):
        proc = subprocess.run([*pip, *args], capture_output=True, text=True, timeout=900, env=env)
        log += proc.stdout[-1500:]
        assert proc.returncode == 0, proc.stderr[-2000:]
    check = subprocess.run([py, "-c", "import numpy, llvmlite, cryptography"], capture_output=True, text=True,
                           timeout=120, env=env, cwd=tmp_path)
    assert check.returncode == 0, f"the base dependencies did not install: {check.stderr[-500:]}\n{log}"

    keys = make_keys(tmp_path)
    bundle = make_bundle(tmp_path, keys)
    x, y = device_data(0, 4)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    proc = subprocess.run([py, "-c", DEVICE, str(tmp_path / "dev"), str(bundle), str(keys.public_path),
                           str(tmp_path / "data.npz"), "x86-avx2", ",".join(HEAVY)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["heavy"] == [] and out["repeat_same"]
    report = out["report"]
    assert report["dp_epsilon_spent"] == pytest.approx(0.7719, abs=1e-3)  # dp-accounting's ε for σ = 10, 3 sums
    assert abs(report["dp_count"] / 256 - len(y)) < 100
