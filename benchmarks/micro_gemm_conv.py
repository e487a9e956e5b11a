"""Micro-benchmark: Cuvil's GEMM / Conv emitters against NumPy (OpenBLAS) and ONNX Runtime, one thread.

    OPENBLAS_NUM_THREADS=1 python benchmarks/micro_gemm_conv.py [--target host] [--repeat 7] [--only conv|gemm|gemv]
    python benchmarks/micro_gemm_conv.py --conv 256,64,64,256,1,1,0 [--choice direct:9:3] [--set pack_min_row_blocks=12]

Each kernel is compiled here (llvmlite.binding, O3) for the target (default: this host) and timed
interleaved with ONNX Runtime (intra/inter op threads 1) and, for GEMM and 1x1 convs, numpy matmul.
Medians of per-round medians; GFLOP/s = 2 x MACs / time. Also checks results against ORT.

Each conv is also timed against OpenBLAS's sgemm 1024^3 (numpy, one thread) in the same rounds, the
reference of "one core's FP32 peak" in issue 12's goal (>= 80% on ResNet-class convs): the column
``of sgemm`` is the conv's GFLOP/s over sgemm's, so a host's speed swings cancel out. The ``res``
rows are the ResNet-class convs beyond ResNet-18: ResNet-50's stride-2 3x3s (128x128 input) and
ASPP's stride-2 trunk (``tests/archs.py``).

``--conv C,H,W,OC,K,S,P[,D]``: one conv, every candidate the tuner may time for it (the first is the cost
model's) and each ``--choice METHOD:MR:NV``, against ORT; ``--set FIELD=VALUE`` changes a tuning field first.
The plan rules in ``compiler/tuning.py`` cite such runs.

``--only gemv``: the wide MLP's batch-1 layers (``tests/archs.py``: 1024 -> 2048 -> 1024), each on
``GEMV_MATRICES`` matrices in turn as in the model (together beyond L2), beside the bound such a layer
has: reading the same bytes with nothing else to do (a vector-sum loop, one stream, as the GEMV's
panels are read). Both as GB/s of weights read; a GEMV at that bound cannot go faster on this core.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llvmlite.binding as llvm  # noqa: E402
import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402

from cuvil.compiler.codegen.cpu.conv.choices import conv_candidates, with_choices  # noqa: E402
from cuvil.compiler.codegen.cpu.conv.emit import emit_conv2d  # noqa: E402
from cuvil.compiler.codegen.cpu.gemm import emit_gemm  # noqa: E402
from cuvil.compiler.codegen.cpu.conv.plan import conv_plan  # noqa: E402
from cuvil.compiler.codegen.cpu.tiles import gemm_tile, pack_gemm_b  # noqa: E402
from cuvil.compiler.codegen.cpu.conv.pack import pack_conv_weights  # noqa: E402
from cuvil.compiler.target import ConvChoice  # noqa: E402
from cuvil.compiler.tuning import parse_overrides  # noqa: E402
from cuvil.devices.detect import resolve_target  # noqa: E402
from cuvil.edge_runtime.candidates import aligned_copy as aligned, interleaved_seconds  # noqa: E402
from tests.hosts import describe_host  # noqa: E402

# (name, N, C, H, W, OC, K, stride, pad, group, times in the model). "r18": the CIFAR ResNet-18 of
# docs/performance.md (3x32x32, 1.11 GFLOP), every conv of it; "mbv2": MobileNetV2 3x96x96 samples.
CONVS = [
    ("r18 conv1 3->64 32x32", 1, 3, 32, 32, 64, 3, 1, 1, 1, 1),
    ("r18 64x32x32 3x3", 1, 64, 32, 32, 64, 3, 1, 1, 1, 4),
    ("r18 64->128 s2 3x3", 1, 64, 32, 32, 128, 3, 2, 1, 1, 1),
    ("r18 1x1 s2 64->128", 1, 64, 32, 32, 128, 1, 2, 0, 1, 1),
    ("r18 128x16x16 3x3", 1, 128, 16, 16, 128, 3, 1, 1, 1, 3),
    ("r18 128->256 s2 3x3", 1, 128, 16, 16, 256, 3, 2, 1, 1, 1),
    ("r18 1x1 s2 128->256", 1, 128, 16, 16, 256, 1, 2, 0, 1, 1),
    ("r18 256x8x8 3x3", 1, 256, 8, 8, 256, 3, 1, 1, 1, 3),
    ("r18 256->512 s2 3x3", 1, 256, 8, 8, 512, 3, 2, 1, 1, 1),
    ("r18 1x1 s2 256->512", 1, 256, 8, 8, 512, 1, 2, 0, 1, 1),
    ("r18 512x4x4 3x3", 1, 512, 4, 4, 512, 3, 1, 1, 1, 3),
    ("res50 128->128 s2 3x3 32x32", 1, 128, 32, 32, 128, 3, 2, 1, 1, 1),
    ("res50 256->256 s2 3x3 16x16", 1, 256, 16, 16, 256, 3, 2, 1, 1, 1),
    ("res50 512->512 s2 3x3 8x8", 1, 512, 8, 8, 512, 3, 2, 1, 1, 1),
    ("resaspp 32->64 s2 3x3 128x128", 1, 32, 128, 128, 64, 3, 2, 1, 1, 1),
    ("resaspp 64->64 s2 3x3 64x64", 1, 64, 64, 64, 64, 3, 2, 1, 1, 1),
]
PEAK_N = 1024  # sgemm PEAK_N^3: issue 12's reference of one core's FP32 peak


def mobilenet_v2_convs(size: int = 96) -> list:
    """Every conv of MobileNetV2 (width 1.0) at size x size, identical shapes merged with a count."""
    found: dict = {}

    def add(kind, c, h, oc, k, st, g):
        key = (c, h, oc, k, st, g)
        name = f"mbv2 {kind} {c}->{oc} {h}x{h}" + (f" s{st}" if st > 1 else "")
        found[key] = (name, found.get(key, (name, 0))[1] + 1)

    h, c = size // 2, 32
    add("conv1", 3, size, 32, 3, 2, 1)
    blocks = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
    for t, oc, n, st in blocks:  # expansion, out channels, repeats, first stride
        for i in range(n):
            s_, hid = st if i == 0 else 1, c * t
            if t != 1:
                add("1x1", c, h, hid, 1, 1, 1)
            add("dw", hid, h, hid, 3, s_, hid)
            h = (h - 1) // s_ + 1
            add("1x1", hid, h, oc, 1, 1, 1)
            c = oc
    add("1x1", c, h, 1280, 1, 1, 1)
    return [(name, 1, c, h, h, oc, k, st, k // 2, g, n) for (c, h, oc, k, st, g), (name, n) in found.items()]


CONVS += mobilenet_v2_convs()
GEMVS = [("wide_mlp 1x1024x2048", 1024, 2048), ("wide_mlp 1x2048x1024", 2048, 1024)]  # (name, K, N)
GEMV_MATRICES = 4  # distinct weights per row, used in turn: 4 x 8 MiB, as the wide MLP's four big layers
GEMMS = [("mlp 1x784x256", 1, 256, 784), ("fc 1x512x10", 1, 10, 512), ("tfm 32x64x256", 32, 256, 64),
         ("sq 256", 256, 256, 256), ("sq 512", 512, 512, 512)]


def jit(module: ir.Module, target, name: str):
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    tm = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.feature_string, opt=3)
    mod = llvm.parse_assembly(str(module))
    mod.verify()
    pb = llvm.create_pass_builder(tm, llvm.PipelineTuningOptions(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    eng = llvm.create_mcjit_compiler(mod, tm)
    eng.finalize_object()
    f = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 6)(eng.get_function_address(name))
    f.engine = eng
    return f


def ort_session(nodes, inits, x_shape):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def timeit(fns: dict, flops: float, repeat: int, budget_s: float = 0.15) -> dict:
    """Interleaved rounds on the wall clock (the autotuner's loop): median of a batch, median over rounds."""
    return interleaved_seconds(fns, rounds=repeat, round_s=budget_s / repeat, clock=time.perf_counter,
                               combine=statistics.median)

def report(name, times, flops, extra=""):
    cu = times["cuvil"]
    parts = [f"{name:<28} cuvil {cu * 1e6:8.1f} us {flops / cu / 1e9:6.1f} GF/s"]
    if "sgemm" in times:
        peak = 2.0 * PEAK_N ** 3 / times["sgemm"]
        parts.append(f"{flops / cu / peak:4.0%} of sgemm {PEAK_N}^3 ({peak / 1e9:.0f} GF/s)")
    for k, t in times.items():
        if k not in ("cuvil", "sgemm"):
            parts.append(f"{k} {t * 1e6:8.1f} us ({t / cu:4.2f}x)")
    print(" | ".join(parts) + extra, flush=True)


def conv_case(N, C, H, W, OC, K, s, p, g, rng, d=1):
    """The inputs of one conv + ReLU, and ONNX Runtime's session of it: (X, W, bias, run ORT)."""
    from onnx import helper

    X = aligned(rng.standard_normal((N, C, H, W)))
    Wt = (rng.standard_normal((OC, C // g, K, K)) / np.sqrt(C // g * K * K)).astype(np.float32)
    bias = aligned(rng.standard_normal(OC))
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[s, s], pads=[p] * 4, dilations=[d, d], group=g)
    sess = ort_session([conv, helper.make_node("Relu", ["c"], ["y"])], {"w": Wt, "b": bias}, X.shape)
    return X, Wt, bias, lambda: sess.run(None, {"x": X})[0]


def conv_kernel(target, X, Wt, bias, K, s, p, g, d=1):
    """Cuvil's kernel of that conv for ``target`` (its plan decides): (run it, its output, the plan)."""
    N, C, H, W = X.shape
    OC, geom = Wt.shape[0], ((s, s), (p,) * 4, (d, d), g)
    plan = conv_plan(target, N, C, H, W, OC, K, K, *geom)
    m = ir.Module()
    m.triple = target.triple
    emit_conv2d(m, "conv", target, N, C, H, W, OC, K, K, *geom, bias=True, activation="Relu")
    f = jit(m, target, "conv")
    Wp = aligned(pack_conv_weights(Wt, target, (N, C, H, W), *geom))
    Y = aligned(np.zeros((N, OC, (H + 2 * p - d * (K - 1) - 1) // s + 1, (W + 2 * p - d * (K - 1) - 1) // s + 1)))
    scratch = aligned(np.zeros(max(16, plan.scratch_bytes // 4)))
    ptrs = [X.ctypes.data, Wp.ctypes.data, bias.ctypes.data, None, Y.ctypes.data, scratch.ctypes.data]
    run = lambda: f(*ptrs)  # noqa: E731
    run.keep = (f, Wp, Y, scratch)  # alive while timed
    return run, Y, plan


def bench_conv(target, spec, repeat, rng):
    name, N, C, H, W, OC, K, s, p, g, _count = spec
    X, Wt, bias, ort_run = conv_case(N, C, H, W, OC, K, s, p, g, rng)
    run, Y, plan = conv_kernel(target, X, Wt, bias, K, s, p, g)
    fns = {"cuvil": run, "ort": ort_run}
    if K == 1 and s == 1 and g == 1:
        X2, W2 = X.reshape(C, H * W), Wt.reshape(OC, C)
        fns["numpy"] = lambda: np.maximum(W2 @ X2 + bias[:, None], 0)
    A, B = rng.standard_normal((2, PEAK_N, PEAK_N), dtype=np.float32)
    fns["sgemm"] = lambda: A @ B
    flops = 2.0 * N * OC * Y.shape[2] * Y.shape[3] * (C // g) * K * K
    times = timeit(fns, flops, repeat)
    run()
    err = np.abs(Y - ort_run()).max()
    report(name, times, flops, f" | {plan.method} {plan.mr}x{plan.nv} err {err:.1e}")
    return times


def bench_candidates(target, shape: str, extra: list[str], repeat: int, rng) -> None:
    """``--conv C,H,W,OC,K,S,P[,D]``: each candidate the tuner may time for that conv (the first is the cost
    model's), and each ``--choice METHOD:MR:NV``, in one interleaved run against ORT: what a plan rule measures."""
    C, H, W, OC, K, s, p, d = (list(map(int, shape.split(","))) + [1])[:8]
    geom = (1, C, H, W, OC, K, K, (s, s), (p,) * 4, (d, d), 1)
    choices = list(conv_candidates(target, geom))
    for text in extra:
        method, mr, nv = text.split(":")
        choices.append(ConvChoice(method, int(mr), int(nv), target.vector_floats))
    X, Wt, bias, ort_run = conv_case(1, C, H, W, OC, K, s, p, 1, rng, d)
    ref, fns = ort_run(), {"ort": ort_run}
    for c in dict.fromkeys(choices):
        run, Y, plan = conv_kernel(with_choices(target, {geom: c}), X, Wt, bias, K, s, p, 1, d)
        run()
        label = f"{plan.method} {plan.mr}x{plan.nv} ({plan.vl} lanes)"
        fns[label] = run
        print(f"{label}: max error against ORT {np.abs(Y - ref).max():.1e}", flush=True)
    flops = 2.0 * OC * ref.shape[2] * ref.shape[3] * C * K * K
    times = timeit(fns, flops, repeat, budget_s=1.5)
    for label, t in times.items():
        print(f"{label:28s} {t * 1e6:9.1f} us {flops / t / 1e9:6.1f} GF/s {t / times['ort']:5.2f}x ORT", flush=True)


def bench_gemm(target, spec, repeat, rng):
    name, M, N, K = spec
    m = ir.Module()
    m.triple = target.triple
    emit_gemm(m, "gemm", target, M, N, K, bias="n")
    f = jit(m, target, "gemm")
    A = aligned(rng.standard_normal((M, K)))
    Wt = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    bias = aligned(rng.standard_normal(N))
    Bp = aligned(pack_gemm_b(Wt, target))
    C = aligned(np.zeros((M, N)))
    ptrs = [A.ctypes.data, Bp.ctypes.data, bias.ctypes.data, None, C.ctypes.data, None]
    from onnx import helper

    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"])
    sess = ort_session([node], {"w": Wt, "b": bias}, A.shape)
    feed = {"x": A}
    fns = {"cuvil": lambda: f(*ptrs), "ort": lambda: sess.run(None, feed), "numpy": lambda: A @ Wt + bias}
    flops = 2.0 * M * N * K
    times = timeit(fns, flops, repeat)
    err = np.abs(C - sess.run(None, feed)[0]).max()
    mr, nv = gemm_tile(target, M, N)
    report(name, times, flops, f" | tile {mr}x{nv} err {err:.1e}")


def read_kernel(target, floats: int):
    """``read(src, out, ...)``: the sum of ``floats`` floats (a multiple of 4 vectors) into one vector at
    ``out``, four accumulators: the time to stream those bytes in with nothing else to do (the kernels'
    six-pointer signature, as :func:`jit` calls it; the last four unused)."""
    vl = target.vector_floats
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vec = ir.VectorType(f32, vl)
    m = ir.Module()
    m.triple = target.triple
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [f32.as_pointer()] * 6), name="read")
    src, dst = fn.args[:2]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    entry, loop, done = b.block, fn.append_basic_block("loop"), fn.append_basic_block("done")
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(i64)
    accs = [b.phi(vec) for _ in range(4)]
    new = [b.fadd(a, b.load(b.bitcast(b.gep(src, [b.add(i, ir.Constant(i64, u * vl))]), vec.as_pointer()), align=64))
           for u, a in enumerate(accs)]
    nxt = b.add(i, ir.Constant(i64, 4 * vl))
    i.add_incoming(ir.Constant(i64, 0), entry)
    i.add_incoming(nxt, loop)
    for a, v in zip(accs, new):
        a.add_incoming(ir.Constant(vec, None), entry)
        a.add_incoming(v, loop)
    b.cbranch(b.icmp_unsigned("<", nxt, ir.Constant(i64, floats)), loop, done)
    b.position_at_end(done)
    b.store(b.fadd(b.fadd(new[0], new[1]), b.fadd(new[2], new[3])), b.bitcast(dst, vec.as_pointer()), align=64)
    b.ret_void()
    return jit(m, target, "read")


def bench_gemv(target, spec, repeat, rng):
    from onnx import helper

    from cuvil.compiler.codegen.cpu.tiles import pack_gemv_b

    name, K, N = spec
    m = ir.Module()
    m.triple = target.triple
    emit_gemm(m, "gemv", target, 1, N, K, b_layout="wide", bias="n")
    f = jit(m, target, "gemv")
    A, bias, C = aligned(rng.standard_normal((1, K))), aligned(rng.standard_normal(N)), aligned(np.zeros((1, N)))
    Ws = [(rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32) for _ in range(GEMV_MATRICES)]
    packed = [aligned(pack_gemv_b(w, target)) for w in Ws]
    sessions = [ort_session([helper.make_node("Gemm", ["x", "w", "b"], ["y"])], {"w": w, "b": bias}, A.shape)
                for w in Ws]
    read, out = read_kernel(target, K * N), aligned(np.zeros(target.vector_floats))
    feed = {"x": A}
    fns = {"cuvil": lambda: [f(A.ctypes.data, p.ctypes.data, bias.ctypes.data, None, C.ctypes.data, None) for p in packed],
           "ort": lambda: [s.run(None, feed) for s in sessions],
           "read": lambda: [read(w.ctypes.data, out.ctypes.data, None, None, None, None) for w in Ws]}
    times = {k: t / GEMV_MATRICES for k, t in timeit(fns, 0.0, repeat, budget_s=0.6).items()}
    f(A.ctypes.data, packed[-1].ctypes.data, bias.ctypes.data, None, C.ctypes.data, None)
    err = np.abs(C - sessions[-1].run(None, feed)[0]).max()
    gbs = {k: 4.0 * K * N / t / 1e9 for k, t in times.items()}
    print(f"{name:<24} " + " | ".join(f"{k} {times[k] * 1e6:7.1f} us {gbs[k]:5.1f} GB/s" for k in ("cuvil", "ort", "read")) +
          f" | cuvil at {gbs['cuvil'] / gbs['read']:4.0%} of the read, ort at {gbs['ort'] / gbs['read']:4.0%}, "
          f"cuvil/ort {times['cuvil'] / times['ort']:.2f} | err {err:.1e}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="host")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--only", choices=["conv", "gemm", "gemv"], default=None)
    ap.add_argument("--filter", default="")
    ap.add_argument("--conv", help="C,H,W,OC,K,S,P[,D]: one conv's candidates against ORT (see bench_candidates)")
    ap.add_argument("--choice", action="append", default=[], help="with --conv: one more METHOD:MR:NV to time")
    ap.add_argument("--set", action="append", default=[], help="FIELD=VALUE: a tuning field of the target changed")
    a = ap.parse_args()
    target = resolve_target(a.target)
    try:
        fields = parse_overrides(a.set)
    except ValueError as e:
        raise SystemExit(f"micro_gemm_conv: {e}") from None
    target = dataclasses.replace(target, tuning=target.tuning.replace(**fields))
    print(f"{describe_host()}; target {target.name}: {target.cpu}, {target.vector_bits}-bit")
    rng = np.random.default_rng(0)
    if a.conv:
        bench_candidates(target, a.conv, a.choice, a.repeat, rng)
        return
    if a.only in (None, "conv"):
        total: dict[str, float] = {}
        for spec in CONVS:
            if a.filter in spec[0]:
                times = bench_conv(target, spec, a.repeat, rng)
                model = total.setdefault(spec[0].split()[0], {})
                for k, t in times.items():
                    model[k] = model.get(k, 0.0) + spec[-1] * t
        for model, tt in total.items():
            print(f"{model} convs (each x times used, medians summed): cuvil {tt['cuvil'] * 1e3:.2f} ms, "
                  f"ort {tt['ort'] * 1e3:.2f} ms, ort/cuvil {tt['ort'] / tt['cuvil']:.2f}x")
    if a.only in (None, "gemm"):
        for spec in GEMMS:
            if a.filter in spec[0]:
                bench_gemm(target, spec, a.repeat, rng)
    if a.only in (None, "gemv"):
        for spec in GEMVS:
            if a.filter in spec[0]:
                bench_gemv(target, spec, a.repeat, rng)


if __name__ == "__main__":
    main()
