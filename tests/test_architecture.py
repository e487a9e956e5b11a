"""Architecture rules that are cheap to check: import direction and a light edge side."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# folder -> (import name, layer); imports may only point to the same or a lower layer.
LAYERS = {
    "compiler": ("cuvil.compiler", 0),
    "devices": ("cuvil.devices", 1),
    "edge_runtime": ("cuvil.edge_runtime", 2),
    "coordinator": ("cuvil.coordinator", 3),
    "sdk": ("cuvil", 4),
}


def _layer_of(module: str) -> int | None:
    best = None
    for name, layer in LAYERS.values():
        if module == name or module.startswith(name + "."):
            if best is None or len(name) > len(best[0]):
                best = (name, layer)
    return best[1] if best else None


def _imports(path: Path, package: str):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield node.lineno, mod
            for alias in node.names:  # `from . import edge_runtime` names a subpackage
                yield node.lineno, f"{mod}.{alias.name}"


def test_imports_point_one_way():
    violations = []
    for folder, (pkg_name, layer) in LAYERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("").parts
            package = ".".join((pkg_name, *rel[:-1]))
            for lineno, mod in _imports(path, package):
                target = _layer_of(mod)
                if target is not None and target > layer:
                    violations.append(f"{path.relative_to(ROOT)}:{lineno} imports {mod}")
    assert not violations, "imports point backwards:\n" + "\n".join(violations)


def test_layer_check_catches_a_backward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from ...edge_runtime import session\n")
    found = [m for _, m in _imports(bad, "cuvil.compiler.ir")]
    assert _layer_of(found[0]) == 2  # compiler (layer 0) -> edge_runtime (layer 2) is flagged


BLOCKER = textwrap.dedent(
    """
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] in {'torch', 'onnx', 'onnxruntime', 'opacus', 'onnxscript'}:
                raise ImportError(f'{name} is blocked in this test')
            return None
    sys.meta_path.insert(0, Block())
    """
)


@pytest.mark.parametrize("module", ["cuvil.edge_runtime", "cuvil.edge_runtime.training", "cuvil.compiler",
                                    "cuvil.devices", "cuvil"])
def test_edge_side_imports_without_torch_or_onnx(module):
    code = BLOCKER + f"import {module}\nassert 'torch' not in sys.modules and 'onnx' not in sys.modules\nprint('ok')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_blocker_really_blocks():
    proc = subprocess.run([sys.executable, "-c", BLOCKER + "import onnx"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "blocked" in proc.stderr


# edge_runtime modules that may import torch/opacus: the fine-tuning ones, and only when a device trains
TRAINING_IMPORTERS = {"training/torch_graph.py": "module", "training/dpsgd.py": "function"}


def test_torch_and_opacus_are_imported_only_by_on_device_fine_tuning():
    found = []
    for path in sorted((ROOT / "edge_runtime").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        top_level = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n.split(".")[0] in {"torch", "opacus"} for n in names):
                found.append((path.relative_to(ROOT / "edge_runtime").as_posix(),
                              "module" if id(node) in top_level else "function"))
    allowed = set(TRAINING_IMPORTERS.items())
    assert found and set(found) <= allowed, f"unexpected torch/opacus imports: {sorted(set(found) - allowed)}"
