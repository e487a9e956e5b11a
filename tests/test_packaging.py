"""A normal (non-editable) install carries every module and data file under the `cuvil` name."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"sdk": "cuvil", "compiler": "cuvil/compiler", "devices": "cuvil/devices",
           "edge_runtime": "cuvil/edge_runtime", "coordinator": "cuvil/coordinator"}


def test_wheel_maps_every_folder_onto_the_cuvil_package(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("cuvil-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for folder, target in FOLDERS.items():
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".toml") and "__pycache__" not in path.parts:
                expected.add(f"{target}/{path.relative_to(ROOT / folder).as_posix()}")
    assert expected and expected <= names, sorted(expected - names)[:10]
    assert "cuvil/devices/profiles/rpi5.toml" in names and not any(n.startswith(("sdk/", "tests/")) for n in names)


def test_the_repository_builds_as_a_flower_app(tmp_path):
    """`flwr build` of the repository itself (what `flwr run .` uploads) succeeds and carries the app."""
    import shutil
    import tomllib

    import pytest

    pytest.importorskip("flwr")
    flwr = Path(sys.executable).parent / "flwr"
    flwr = str(flwr) if flwr.exists() else shutil.which("flwr")
    assert flwr, "flwr is not installed (pip install 'cuvil[fl]')"
    proc = subprocess.run([flwr, "build", "--app", str(ROOT)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "FLWR_TELEMETRY_ENABLED": "0"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (fab,) = tmp_path.glob("*.fab")
    with zipfile.ZipFile(fab) as z:
        names = set(z.namelist())
        app = tomllib.loads(z.read("pyproject.toml").decode())["tool"]["flwr"]["app"]
    assert {"coordinator/server_app.py", "coordinator/client_app.py", "devices/profiles/rpi5.toml"} <= names
    assert not any(n.startswith(("tests/", "benchmarks/", "docs/", ".venv", ".git")) for n in names)
    assert app["components"]["serverapp"] == "cuvil.coordinator.server_app:app"
