"""Each int8 conv of the CIFAR ResNet-18 alone, against the ceiling its integer multiplies set.

The ceiling is the conv's products over the rate this CPU runs the dot-product step itself: a loop
of twelve independent accumulators, JIT-compiled for ``--target``, each step ``vpmaddwd`` + ``vpaddd``
(16 products: int16 pairs, any weights) or ``vpmaddubsw`` + ``vpmaddwd`` by ones + ``vpaddd`` (32
products: u8 x s8, weight pairs with ``|w0| + |w1| <= 128``, i.e. 7-bit weights), and where the target has
AVX-512 VNNI, ``vpdpbusd`` on zmm (64 u8 x s8 products, any weights) for the direct form. Products: the direct
conv's (only the taps that read inside the image), and for the 3x3 stride-1 convs the compiler gives
Winograd F(2x2, 3x3) on AVX2-class targets, its 16 products per 2x2 tile, on int16). A kernel cannot beat
the lower of its form's ceilings with these instructions; the rest of its time is transforms,
requantization, packing and memory.

    python benchmarks/int8_conv_ceiling.py [--target x86-avx2] [--runs 200] [--against FIELD=VALUE]

Printed: per conv shape and weight range the least wall time over ``--runs`` runs beside its
ceilings, from the best step rates timed in turns with those runs (a busy machine or a moving clock
only slows both), and the model's totals (each shape times its count in ResNet-18). Times are
microseconds on one thread.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llvmlite.binding as llvm  # noqa: E402
import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402

from cuvil.compiler import DType, TensorType  # noqa: E402
from cuvil.compiler.codegen.cpu.int_dot import choose_dot  # noqa: E402
from cuvil.compiler.tuning import parse_override  # noqa: E402
from cuvil.compiler.frontends.builder import GraphBuilder  # noqa: E402
from cuvil.devices.detect import resolve_target  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph  # noqa: E402

# (name, C, H=W, M, kernel, stride, pad, times in ResNet-18): every conv of tests/zoo.py's ResNet-18
CONVS = [
    ("conv1 3->64 32x32", 3, 32, 64, 3, 1, 1, 1),
    ("64x32x32 3x3", 64, 32, 64, 3, 1, 1, 4),
    ("64->128 s2 3x3", 64, 32, 128, 3, 2, 1, 1),
    ("128x16x16 3x3", 128, 16, 128, 3, 1, 1, 3),
    ("128->256 s2 3x3", 128, 16, 256, 3, 2, 1, 1),
    ("256x8x8 3x3", 256, 8, 256, 3, 1, 1, 3),
    ("256->512 s2 3x3", 256, 8, 512, 3, 2, 1, 1),
    ("512x4x4 3x3", 512, 4, 512, 3, 1, 1, 3),
    ("1x1 s2 64->128", 64, 32, 128, 1, 2, 0, 1),
    ("1x1 s2 128->256", 128, 16, 256, 1, 2, 0, 1),
    ("1x1 s2 256->512", 256, 8, 512, 1, 2, 0, 1),
]
ACCS = 12  # independent accumulators: what a 6x2 register tile of 16 ymm registers keeps
I16V, I32V, I8V = ir.VectorType(ir.IntType(16), 16), ir.VectorType(ir.IntType(32), 8), ir.VectorType(ir.IntType(8), 32)
Z32V, Z8V = ir.VectorType(ir.IntType(32), 16), ir.VectorType(ir.IntType(8), 64)  # zmm, for vpdpbusd
PRODUCTS = {"wd": 16, "ubsw": 32, "dp": 64}  # products a step of each form


def _step_loop(form: str) -> ir.Module:
    """``void steps(i64 n, <8|16 x i32>* out)``: n rounds of a step of ``form`` (a ``PRODUCTS`` key) on
    each accumulator, whose operand is the accumulator itself (so that nothing is hoisted out of the loop)."""
    acc_t = Z32V if form == "dp" else I32V
    mod = ir.Module("steps")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ir.IntType(64), acc_t.as_pointer()]), "steps")
    wd = ir.Function(mod, ir.FunctionType(I32V, [I16V, I16V]), "llvm.x86.avx2.pmadd.wd")
    ub = ir.Function(mod, ir.FunctionType(I16V, [I8V, I8V]), "llvm.x86.avx2.pmadd.ub.sw")
    dp = ir.Function(mod, ir.FunctionType(Z32V, [Z32V, Z32V, Z32V]), "llvm.x86.avx512.vpdpbusd.512")
    entry, loop, done = fn.append_basic_block("entry"), fn.append_basic_block("loop"), fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(ir.IntType(64))
    accs = [b.phi(acc_t) for _ in range(ACCS)]
    w16 = ir.Constant(I16V, [3 + k for k in range(16)])
    w8 = ir.Constant(I8V, [(5 * k) % 60 - 30 for k in range(32)])
    ones = ir.Constant(I16V, [1] * 16)
    w64 = b.bitcast(ir.Constant(Z8V, [(5 * k) % 250 - 125 for k in range(64)]), Z32V)
    nxt = []
    for acc in accs:
        if form == "dp":
            nxt.append(b.call(dp, [acc, acc, w64]))
        elif form == "ubsw":
            pairs = b.call(ub, [b.bitcast(acc, I8V), w8])
            nxt.append(b.add(acc, b.call(wd, [pairs, ones])))
        else:
            nxt.append(b.add(acc, b.call(wd, [b.bitcast(acc, I16V), w16])))
    i2 = b.add(i, ir.Constant(ir.IntType(64), 1))
    b.cbranch(b.icmp_unsigned("<", i2, fn.args[0]), loop, done)
    i.add_incoming(ir.Constant(ir.IntType(64), 0), entry)
    i.add_incoming(i2, loop)
    for k, (acc, n) in enumerate(zip(accs, nxt)):
        acc.add_incoming(ir.Constant(acc_t, [k + 1] * acc_t.count), entry)
        acc.add_incoming(n, loop)
    b.position_at_end(done)
    total = nxt[0]
    for n in nxt[1:]:
        total = b.xor(total, n)
    b.store(total, fn.args[1], align=4)
    b.ret_void()
    return mod


def step_loops(target) -> dict[str, Callable[[int, int], None]]:
    """The step loops the target runs (``vpdpbusd`` only with VNNI), compiled for ``target``:
    ``fn(rounds, out_address)``."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    loops = {}
    forms = ("wd", "ubsw", "dp") if "+avx512vnni" in target.feature_string.split(",") else ("wd", "ubsw")
    for form in forms:  # an engine owns its target machine: one each
        tm = llvm.Target.from_triple(target.triple).create_target_machine(cpu=target.cpu,
                                                                          features=target.feature_string, opt=3)
        eng = llvm.create_mcjit_compiler(llvm.parse_assembly(str(_step_loop(form))), tm)
        eng.finalize_object()
        fn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)(eng.get_function_address("steps"))
        fn.engine = eng  # the code lives as long as its engine
        loops[form] = fn
    return loops


def products_per_us(fn, form: str, rounds: int = 200_000, tries: int = 10) -> float:
    """Products a microsecond at the step's own throughput (the fastest of ``tries`` timings)."""
    out = np.zeros(16, np.int32)
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter_ns()
        fn(rounds, out.ctypes.data)
        best = min(best, (time.perf_counter_ns() - t0) / 1e3)
    return rounds * ACCS * PRODUCTS[form] / best


def direct_products(c: int, hw: int, m: int, k: int, stride: int, pad: int) -> int:
    """Products of the taps that read inside the image (the padding's are skipped)."""
    out = (hw + 2 * pad - k) // stride + 1
    reads = sum(0 <= o * stride + t - pad < hw for o in range(out) for t in range(k))  # per axis
    return reads * reads * c * m


def winograd_products(target, c: int, hw: int, m: int, k: int, stride: int) -> int | None:
    """F(2x2, 3x3)'s products where the compiler may take it (3x3, stride 1, from the tuned tile count,
    on a target whose exact dot product is int16 pairs: with VNNI it keeps the direct form)."""
    tiles = (-(-hw // 2)) ** 2
    if (k, stride) != (3, 1) or c < 16 or tiles < target.tuning.int8_winograd_min_tiles \
            or choose_dot(target, False).kind != "avx2-wd":
        return None
    return 16 * tiles * c * m


def conv_session(target, c: int, hw: int, m: int, k: int, stride: int, pad: int, wmax: int):
    """One int8 QConv (u8 activations, per-channel weights in +-wmax), compiled and run once."""
    rng = np.random.default_rng(0)
    gb = GraphBuilder("qconv")
    x = gb.input("x", TensorType(DType.U8, (1, c, hw, hw)))
    w = gb.constant(rng.integers(-wmax, wmax + 1, (m, c, k, k)).astype(np.int8), "w")
    bias = gb.constant(rng.integers(-2000, 2000, m).astype(np.int32), "b")
    y = gb.add1("QConv", [x, w, bias], strides=[stride] * 2, pads=[pad] * 4, dilations=[1, 1], group=1, x_scale=0.05,
                x_zero_point=9, w_scale=np.linspace(0.004, 0.02, m).astype(np.float32), y_scale=0.3,
                y_zero_point=100, to=DType.U8, clamp=[0, 255])
    graph = gb.build([y])
    sess = compile_graph(graph, target=target, threads=1, use_cache=False)
    sess.run({graph.inputs[0]: rng.integers(0, 256, (1, c, hw, hw)).astype(np.uint8)})
    return sess


def timed(sessions: list, loops: dict, runs: int, slices: int = 5) -> tuple[list[float], dict[str, float]]:
    """Each session's least wall time (us) over ``runs`` runs, and each step's best rate, in turns (a
    busy machine, or a clock that moves, only ever slows them all)."""
    best, rates = [float("inf")] * len(sessions), dict.fromkeys(loops, 0.0)
    for _ in range(slices):
        for form, fn in loops.items():
            rates[form] = max(rates[form], products_per_us(fn, form))
        for i, sess in enumerate(sessions):
            for _ in range(max(1, runs // slices)):
                t0 = time.perf_counter_ns()
                sess.run_raw()
                best[i] = min(best[i], (time.perf_counter_ns() - t0) / 1e3)
    return best, rates


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="x86-avx2")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--against", metavar="FIELD=VALUE", help="also time each conv compiled with this tuning field "
                    "set (e.g. int8_direct_min_width=0: the im2col GEMM), in turns with the target's own")
    args = ap.parse_args()
    target = resolve_target(args.target)
    other = None
    if args.against:
        other = dataclasses.replace(target, tuning=target.tuning.replace(**parse_override(args.against)))
    loops = step_loops(target)
    print(f"target {target.name}; rates in products/us: wd = vpmaddwd + vpaddd (16 a step), ubsw = vpmaddubsw + "
          f"vpmaddwd + vpaddd (32){', dp = vpdpbusd zmm (64)' if 'dp' in loops else ''}")
    print(f"{'conv':20} {'weights':>7} {'us':>7} " + (f"{args.against + ' us':>28} " if other else "")
          + f"{'direct ceil':>11} {'wino ceil':>9} {'us / best ceil':>14} "
          + " ".join(f"{form + ' rate':>9}" for form in loops))
    totals = {127: [0.0, 0.0, 0.0], 63: [0.0, 0.0, 0.0]}
    for name, c, hw, m, k, stride, pad, count in CONVS:
        for wmax in (127, 63):
            sessions = [conv_session(t, c, hw, m, k, stride, pad, wmax) for t in (target, other) if t is not None]
            (us, *against), rate = timed(sessions, loops, args.runs)
            direct_rate = max(rate[form] for form in loops if form != "ubsw" or wmax == 63)  # ubsw: 7-bit only
            direct = direct_products(c, hw, m, k, stride, pad) / direct_rate
            wino = winograd_products(target, c, hw, m, k, stride)
            wino_us = wino / rate["wd"] if wino else None  # Winograd's transformed values are int16
            ceiling = min(direct, wino_us or direct)
            totals[wmax][0] += count * us
            totals[wmax][1] += count * ceiling
            totals[wmax][2] += count * sum(against)
            print(f"{name:20} {'8-bit' if wmax == 127 else '7-bit':>7} {us:7.1f} "
                  + "".join(f"{a:28.1f} " for a in against) + f"{direct:11.1f} "
                  f"{f'{wino_us:.1f}' if wino_us else '-':>9} {us / ceiling:14.2f} "
                  + " ".join(f"{rate[form]:9.0f}" for form in loops), flush=True)
    for wmax, (us, ceiling, against_us) in totals.items():
        print(f"ResNet-18 convs, {'8-bit' if wmax == 127 else '7-bit'} weights: {us / 1e3:.2f} ms measured"
              + (f" ({against_us / 1e3:.2f} ms with {args.against})" if other else "")
              + f", {ceiling / 1e3:.2f} ms at the ceiling")


if __name__ == "__main__":
    main()
