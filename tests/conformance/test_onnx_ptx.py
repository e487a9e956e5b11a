"""Every op (and input dtype) of ONNX's single-op node cases compiles to PTX that ``ptxas`` accepts
for the Jetson architectures (``ptx_check``: a few merged modules; a failing one is retried case by
case so the message names each failing op). ``benchmarks/onnx_conformance.py`` checks the ops of
every case that passes natively the same way."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("onnx")

from tests.conformance.onnx_cases import load_cases  # noqa: E402
from tests.conformance.ptx_check import check_ptx  # noqa: E402


@pytest.mark.skipif(not shutil.which("ptxas"), reason="ptxas (CUDA toolkit) not installed")
def test_every_single_op_case_assembles_with_ptxas():
    cases = [c for c in load_cases(model_dirs=()) if c.scope is None and len(c.ops) == 1]
    outcomes = check_ptx(cases)
    assert len(outcomes) >= 400, f"only {len(outcomes)} op/dtype keys"
    failed = [f"{o.key} ({o.case}): {o.error}" for o in outcomes if o.error and o.error != "no case of it imports"]
    assert not failed, "\n".join(failed)
