"""The conformance cases' ops compiled for the Jetson GPUs and assembled by ``ptxas``.

The first case that imports stands for each op set and input dtypes (its key); the chosen cases
are merged into modules of ``chunk`` graphs (``onnx_suite.merge``), each lowered to PTX for every
architecture of :data:`PTXAS_ARCH` and assembled; a module that fails is retried case by case, so
the keys that fail are named one by one. Used by ``benchmarks/onnx_conformance.py`` (every case that
passes natively) and ``test_onnx_ptx.py`` (a fixed sample).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.compiler.codegen.ptxas import PTXAS_ARCH, ptxas
from tests.conformance.onnx_cases import Case
from tests.conformance.onnx_suite import import_case, merge, mergeable

@dataclass(frozen=True)
class PtxOutcome:
    key: str
    case: str
    error: str = ""  # empty: every architecture's ptxas accepted it


def key_of(case: Case) -> str:
    dtypes = sorted({str(x.dtype) for x in case.data_sets[0][0]}) if case.data_sets else []
    return f"{'+'.join(case.ops)} [{','.join(dtypes)}]"


def representatives(cases: Iterable[Case]) -> dict[str, list[Case]]:
    """The cases of each key, in order."""
    chosen: dict[str, list[Case]] = {}
    for case in cases:
        chosen.setdefault(key_of(case), []).append(case)
    return chosen


def _first_imported(key: str, cases: Sequence[Case]):
    """(key, case, imported) for the first case of the key that imports, else its outcome."""
    for case in cases:
        try:
            return key, case, import_case(case)
        except Exception:  # noqa: BLE001,S112  (the next case of the key may import)
            continue
    return PtxOutcome(key, cases[0].name, "no case of it imports")


def assemble(graph, workdir: Path) -> str:
    """'' when ptxas takes the graph's PTX for every architecture, else the first complaint."""
    from cuvil.compiler.codegen.nvptx import gpu_target, lower_ptx
    from cuvil.edge_runtime import jit

    for arch, ptxas_arch in PTXAS_ARCH.items():
        try:
            program = lower_ptx(graph, gpu_target(graph.name, arch))
            ptx = jit.emit_assembly(program.llvm_ir, program.target)
        except Exception as e:  # noqa: BLE001  (reported per case: a typed refusal is a failure here too)
            return f"{arch}: {type(e).__name__}: {str(e)[:300]}"
        done = ptxas(ptx, ptxas_arch, workdir)
        if done.returncode:
            return f"{arch}: ptxas: {done.stderr.strip()[:300]}"
    return ""


def check_ptx(cases: Sequence[Case], chunk: int = 48) -> list[PtxOutcome]:
    """One outcome per key of ``cases`` (its first case that imports stands for it)."""
    ready, out = [], []
    for key, of_key in representatives(cases).items():
        got = _first_imported(key, of_key)
        (out if isinstance(got, PtxOutcome) else ready).append(got)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        merged = [r for r in ready if mergeable(r[1], r[2])]
        singles = [r for r in ready if not mergeable(r[1], r[2])]
        for k in range(0, len(merged), chunk):
            part = merged[k:k + chunk]
            if not assemble(merge([g.graph for _, _, g in part], "ptx"), work):
                out += [PtxOutcome(key, case.name) for key, case, _ in part]
            else:
                singles += part
        out += [PtxOutcome(key, case.name, assemble(g.graph, work)) for key, case, g in singles]
    return out
