"""SVE ``sdot`` GEMMs, vector-length agnostic: the scalable profiles without i8mm compile their int8
GEMMs to SVE ``sdot`` with ``whilelt`` predicated loads (no fixed width), the NEON and i8mm profiles
do not, and under qemu one build equals the int8 reference at SVE lengths 128 (where it takes the NEON
tiles), 256 and 512."""

from __future__ import annotations

import pytest

from cuvil.compiler.codegen.cpu.int_dot import choose_dot
from cuvil.compiler.codegen.lower import lower
from cuvil.devices.detect import resolve_target
from cuvil.devices.isa_report import from_assembly
from cuvil.edge_runtime import jit

from .test_mmla import CASES, QEMU, check_under_qemu


@pytest.mark.parametrize("profile,sve", [("arm64-sve2", True), ("graviton4", False), ("rpi5", False)])
def test_scalable_profiles_compile_to_sve_sdot(profile, sve):
    target = resolve_target(profile)
    assert (choose_dot(target, False).kind == "sve-sdot") == sve
    for graph, *_ in CASES:
        asm = jit.emit_assembly(lower(graph, target, optimize=False).llvm_ir, target)
        r = from_assembly(asm, "aarch64")
        assert (r.dots.get("sdot SVE", 0) > 0) == sve, r.summary()
        if sve:
            assert "whilelt\tp" in asm and "ld1b\t{ z" in asm, "the loads are not predicated SVE loads"


@QEMU
@pytest.mark.parametrize("case", range(len(CASES)))
def test_sve_gemms_are_exact_at_every_length(case, tmp_path):
    check_under_qemu(case, "arm64-sve2", "sdot SVE", (128, 256, 512), tmp_path)
