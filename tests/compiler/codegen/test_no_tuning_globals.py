"""Code generation keeps no module-level mutable or tuning state: what a target tunes lives in its
Tuning record (compiler/tuning.py), so nothing can be patched behind the compile cache's back."""

from __future__ import annotations

import ast
from pathlib import Path

CODEGEN = Path(__file__).resolve().parents[3] / "compiler" / "codegen"
TUNING_WORDS = ("WIDTHS", "BUDGET", "PREFETCH", "REGISTERS", "BLOCK_BYTES", "PANEL_BYTES", "CHANNEL_BLOCK",
                "MIN_PIXELS", "MAX_PIXELS", "MIN_CHANNELS", "MIN_ROW_BLOCKS", "WINOGRAD", "ROWS_")
MUTABLE = (ast.List, ast.Set, ast.ListComp, ast.SetComp)


def findings(source: str) -> list[str]:
    out = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            targets, value = [t.id for t in node.targets if isinstance(t, ast.Name)], node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets, value = [node.target.id], node.value
        else:
            continue
        mutable = isinstance(value, MUTABLE) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("set", "list"))
        for name in (t for t in targets if not t.startswith("__")):  # __all__ is a convention, not state
            if mutable:
                out.append(f"{name}: a mutable {type(value).__name__}")
            if any(w in name.upper() for w in TUNING_WORDS):
                out.append(f"{name}: a tuning knob outside Tuning")
    return out


def test_codegen_has_no_module_level_tuning_or_mutable_state():
    bad = {str(p.relative_to(CODEGEN)): f for p in sorted(CODEGEN.rglob("*.py")) if (f := findings(p.read_text()))}
    assert bad == {}


def test_the_check_sees_what_it_forbids():
    assert findings("WINOGRAD_WIDTHS = (256,)\n") == ["WINOGRAD_WIDTHS: a tuning knob outside Tuning"]
    assert findings("TABLE = [1, 2]\nOK = (1, 2)\n") == ["TABLE: a mutable List"]
    assert findings("S = set()\n") == ["S: a mutable Call"]
    assert findings("def f():\n    x = [1]\n") == []
