"""The ISA report: SVE in SVE2 builds, none in NEON builds (Jetson, Raspberry Pi), zmm in AVX-512 builds.

Counted over the real object code (objdump) where a disassembler exists and over LLVM assembly
otherwise; ``cuvil compile --target`` prints the same report.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler import DType, TensorType
from cuvil.devices import list_profiles, resolve_target
from cuvil.devices.isa_report import IsaReportError, classify, from_assembly, from_object, from_objdump
from cuvil.edge_runtime import jit
from cuvil.edge_runtime.compile import lower_for
from tests.devices.llvm_asm import compile_loop

NEON_ONLY = ("rpi5", "jetson-orin", "jetson-xavier")
SVE2 = ("arm64-sve2", "graviton4", "jetson-thor", "graviton3")
HAVE_OBJDUMP = bool(shutil.which("aarch64-linux-gnu-objdump") or shutil.which("llvm-objdump"))


def test_classify_lines():
    r = classify(["ld1w\t{ z0.s }, p0/z, [x0, x9, lsl #2]", "whilelo\tp0.s, x9, x8", "incw\tx9",
                  "fmla\tv0.4s, v1.4s, v2.4s", "ldr\tq0, [x1]", "fadd\ts0, s0, s1", "ret"], "aarch64")
    assert (r["SVE"], r["NEON"], r.total, r.vector_isa) == (3, 2, 7, "SVE")
    x = classify(["vfmadd231ps\t%zmm1, %zmm2, %zmm0", "vaddps\t%ymm1, %ymm2, %ymm0", "vmovss\t(%rax), %xmm0",
                  "vmovaps\t%xmm1, %xmm2 {%k1}", "retq"], "x86_64")
    assert (x["AVX-512"], x["AVX2"], x["SSE"], x.vector_isa) == (2, 1, 1, "AVX-512")
    assert classify(["ret"], "aarch64").vector_isa == "scalar"
    dump = "0000000000000000 <f>:\n   0:\twhilelo\tp0.s, xzr, x9\n   4:\tfadd\tv0.4s, v0.4s, v0.4s  // c\n"
    assert from_objdump(dump, "aarch64").counts == {"SVE": 1, "NEON": 1}


def test_integer_dot_products_are_counted():
    a = classify(["sdot\tv0.4s, v1.16b, v2.16b", "smmla\tv3.4s, v4.16b, v5.16b", "sdot\tz0.s, z1.b, z2.b",
                  "fmla\tv0.4s, v1.4s, v2.4s", "add\tx0, x0, #1"], "aarch64")
    assert (a.int_dot, a["NEON"], a["SVE"]) == (3, 3, 1)
    assert "integer dot products 3 (sdot NEON 1, sdot SVE 1, smmla NEON 1)" in a.summary()
    assert a.dots == {"sdot NEON": 1, "smmla NEON": 1, "sdot SVE": 1}
    x = classify(["vpdpbusd\t%zmm2, %zmm1, %zmm0", "{vex}\tvpdpbusd\t%ymm2, %ymm1, %ymm0", "vpmaddubsw\t%ymm1, %ymm2, %ymm3",
                  "vpmaddwd\t%ymm1, %ymm2, %ymm3", "tdpbsud\t%tmm2, %tmm1, %tmm0", "vpaddd\t%ymm1, %ymm2, %ymm3"],
                 "x86_64")
    assert x.int_dot == 5
    assert x.dots == {"vpdpbusd AVX-512": 1, "vpdpbusd AVX2": 1, "vpmaddubsw AVX2": 1, "vpmaddwd AVX2": 1,
                      "tdpbsud scalar": 1}
    assert classify(["fmla\tv0.4s, v1.4s, v2.4s"], "aarch64").int_dot == 0


def _int8_graph():
    gb = GraphBuilder("isa8")
    x = gb.input("x", TensorType(DType.F32, (1, 8, 6, 6)))
    q = gb.add1("QuantizeLinear", [x], scale=[0.05], zero_point=[128], to=DType.U8)
    w = np.random.default_rng(1).integers(-127, 128, (16, 8, 3, 3)).astype(np.int8)
    c = gb.add1("QConv", [q, gb.constant(w, "w")], strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1],
                x_scale=0.05, x_zero_point=128, w_scale=[0.01] * 16, y_scale=0.3, y_zero_point=0, to=DType.U8)
    return gb.build([gb.add1("DequantizeLinear", [c], scale=[0.3], zero_point=[0])])


@pytest.mark.parametrize("profile,has_dot", [("rpi5", True), ("jetson-orin", True), ("graviton4", True), ("arm64-sve2", True),
                                             ("x86-avx2", True), ("x86-amx", True), ("jetson-xavier", False)])
def test_int8_builds_use_integer_dot_products(profile, has_dot):
    """dotprod profiles compile int8 convs to sdot, AVX2 to vpmadd*; Xavier (no dotprod) has none."""
    low = lower_for(_int8_graph(), profile)
    r = from_assembly(jit.emit_assembly(low.llvm_ir, low.target), low.target.triple.split("-")[0])
    assert (r.int_dot > 0) == has_dot, r.summary()


@pytest.mark.parametrize("cpu,features,want", [
    ("generic", "+neon,+sve,+sve2", "SVE"), ("cortex-a76", "+neon,+dotprod", "NEON"),
])
def test_loop_assembly(cpu, features, want):
    r = from_assembly(compile_loop("aarch64-unknown-linux-gnu", cpu, features), "aarch64")
    assert r.vector_isa == want, r.summary()
    assert (r["SVE"] == 0) == (want == "NEON")


def _graph():
    gb = GraphBuilder("isa")
    x = gb.input("x", TensorType(DType.F32, (3, 67)))
    w = gb.constant(np.random.default_rng(0).standard_normal((67, 37)).astype(np.float32), "w")
    (y,) = gb.add("MatMul", [x, w])
    (z,) = gb.add("Tanh", [y])
    (s,) = gb.add("Softmax", [z], axis=-1)
    return gb.build([s])


@pytest.fixture(scope="module")
def reports():
    graph = _graph()
    out = {}
    for name in list_profiles():
        low = lower_for(graph, name)
        obj = jit.emit_object(low.llvm_ir, low.target)
        try:
            out[name] = from_object(obj, low.target.triple)
        except IsaReportError:
            out[name] = from_assembly(jit.emit_assembly(low.llvm_ir, low.target), low.target.triple.split("-")[0])
    return out


@pytest.mark.parametrize("profile", SVE2)
def test_sve2_builds_contain_sve(reports, profile):
    assert reports[profile]["SVE"] > 0, reports[profile].summary()


@pytest.mark.parametrize("profile", NEON_ONLY)
def test_neon_builds_contain_no_sve(reports, profile):
    r = reports[profile]
    assert r["SVE"] == 0 and r["NEON"] > 0, r.summary()


@pytest.mark.parametrize("profile", ["arm64-sve2", "graviton4"])
def test_sve_code_is_vector_length_agnostic(profile):
    """Predicated (whilelo) loops and no vscale_range: code pinned to one length is wrong at others."""
    low = lower_for(_graph(), profile)
    tm = jit.target_machine(low.target)
    assert "vscale_range" not in str(jit.optimize(low.llvm_ir, tm))
    asm = jit.emit_assembly(low.llvm_ir, low.target)
    assert "whilelo" in asm and from_assembly(asm, "aarch64")["SVE"] > 0


def test_x86_builds(reports):
    assert reports["x86-avx512"]["AVX-512"] > 0
    assert reports["x86-avx2"]["AVX-512"] == 0 and reports["x86-avx2"]["AVX2"] > 0
    assert resolve_target("x86-avx512").vector_bits == 512


@pytest.mark.skipif(not HAVE_OBJDUMP, reason="no aarch64 disassembler")
def test_cli_compile_reports_the_isa(tmp_path):
    from click.testing import CliRunner

    import cuvil
    from cuvil.cli import main

    pair = cuvil.keygen(tmp_path, "k")
    bundle = tmp_path / "m.cuvil"
    cuvil.export(_graph(), bundle, pair.private_path)
    runner = CliRunner()
    for target, isa in (("arm64-sve2", "vector ISA: SVE"), ("jetson-orin", "vector ISA: NEON (SVE 0,")):
        res = runner.invoke(main, ["compile", str(bundle), "--trust", str(pair.public_path), "--target", target,
                                   "-o", str(tmp_path / f"{target}.o")])
        assert res.exit_code == 0, res.output
        assert isa in res.output and (tmp_path / f"{target}.o").stat().st_size > 0
    res = runner.invoke(main, ["compile", str(bundle), "--trust", str(pair.public_path), "--target", "jetson-xavier",
                               "--gpu", "-o", str(tmp_path / "xavier.o")])
    assert res.exit_code == 0 and ".target sm_72" in (tmp_path / "xavier.sm_72.ptx").read_text()


@pytest.mark.parametrize("name", ["/", "../up", "/tmp/elsewhere", "..", "a b/c"])
def test_the_ptx_without_an_output_path_is_written_here_whatever_the_graph_is_named(tmp_path, monkeypatch, name):
    """The PTX's name came from the signed graph name: '/' wrote '/.o.sm_87.ptx', '../x' above the folder."""
    from cuvil.compiler.ir.graph import Graph
    from cuvil.preflight import compile_for

    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    graph = _graph()
    graph = Graph(name, graph.inputs, graph.outputs, graph.nodes, graph.types, graph.constants)
    report = compile_for(graph, "jetson-orin", gpu=True)
    assert report.ptx_path.parent == Path(".") and report.ptx_path.name.endswith(".sm_87.ptx")
    assert [p.name for p in (tmp_path / "here").iterdir()] == [report.ptx_path.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]
