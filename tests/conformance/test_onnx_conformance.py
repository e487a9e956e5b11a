"""ONNX's own backend conformance suite through Cuvil (``onnx_suite``): every in-scope node case of
the installed onnx and every case of its model directories is imported, run by the reference
interpreter and compiled and run natively on this host; a seeded sample runs under qemu for ARM.

The run prints the share of in-scope cases that pass; it must not fall below :data:`FLOOR` (raise
it as coverage grows), and no case may crash, hang or raise an untyped error.
``benchmarks/onnx_conformance.py`` runs the same harness and lists what fails.
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("onnx")

from tests.conformance.onnx_cases import load_cases, sample  # noqa: E402
from tests.conformance.onnx_suite import NEVER, run_emulated, run_suite, summarize  # noqa: E402

FLOOR = 0.96  # 96.9% on 12-07 (DepthToSpace, SpaceToDepth, run-time per-tensor QuantizeLinear)
ARM_SAMPLE, ARM_SEED = 64, 20
QEMU = shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")


def test_onnx_conformance_suite(capsys):
    cases = load_cases()
    results = run_suite(cases, workers=2)
    summary = summarize(cases, results)
    with capsys.disabled():
        print(f"\n{summary.line()}")
    never = [f"{r.name}: {r.outcome} {r.detail}" for r in results if r.outcome in NEVER]
    assert not never, "\n".join(never)
    assert summary.share >= FLOOR, summary.line()


@pytest.mark.skipif(not QEMU, reason="needs qemu-user, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross")
@pytest.mark.parametrize("profile, sve_bits", [("rpi5", None), ("graviton3", 256)])
def test_a_seeded_sample_runs_the_same_on_arm_under_qemu(profile, sve_bits, capsys):
    """NEON (rpi5) and SVE (graviton3) builds of the same single-op cases, one qemu run each."""
    results = run_emulated(sample(load_cases(), ARM_SAMPLE, ARM_SEED), profile, sve_bits)
    with capsys.disabled():
        print(f"\n{profile} under qemu: {sum(r.outcome == 'pass' for r in results)}/{len(results)} sampled cases match")
    assert len(results) >= ARM_SAMPLE // 3, f"only {len(results)} sampled cases got as far as the ARM build"
    wrong = [f"{r.name}: {r.outcome} {r.detail}" for r in results if r.outcome != "pass"]
    assert not wrong, "\n".join(wrong)
