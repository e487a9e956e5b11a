"""The worker pool's code: only multi-threaded modules create threads; thread counts are checked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cuvil.compiler.codegen.cpu.threads import MAX_THREADS, check_threads
from cuvil.compiler.codegen.lower import lower
from cuvil.compiler.errors import CompileError
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.ir.types import TensorType
from cuvil.devices import resolve_target


def _graph():
    b = GraphBuilder("tiny")
    x = b.input("x", TensorType.parse("f32[1,4]"))
    return b.build([b.add1("Relu", [x])])


@pytest.mark.parametrize("profile,futex", [("x86-avx512", "i64 202"), ("rpi5", "i64 98"), ("arm64-sve2", "i64 98")])
def test_threads_bring_a_pool_and_one_thread_none(profile, futex):
    target = resolve_target(profile)
    one = lower(_graph(), target).llvm_ir
    assert "pthread_create" not in one and "syscall" not in one
    many = lower(_graph(), dataclasses.replace(target, threads=3)).llvm_ir
    assert "pthread_create" in many and "pthread_join" in many and f"@\"syscall\"({futex}" in many


@pytest.mark.parametrize("profile,calls", [("x86-avx512", ("i64 204", "i64 203")), ("rpi5", ("i64 123", "i64 122")),
                                           ("arm64-sve2", ("i64 123", "i64 122"))])
def test_workers_bind_themselves_to_a_cpu_unless_the_profile_says_not(profile, calls):
    """sched_getaffinity, then sched_setaffinity, by the architecture's numbers; neither with pool_pin off."""
    target = dataclasses.replace(resolve_target(profile), threads=2)
    pinned = lower(_graph(), target).llvm_ir
    assert all(f'@"syscall"({c}' in pinned for c in calls)
    free = lower(_graph(), dataclasses.replace(target, tuning=target.tuning.replace(pool_pin=False))).llvm_ir
    assert "pthread_create" in free and not any(f'@"syscall"({c}' in free for c in calls)


@pytest.mark.parametrize("threads", [0, -1, MAX_THREADS + 1, 2.0, True, "2"])
def test_bad_thread_counts_are_compile_errors(threads):
    with pytest.raises(CompileError, match="threads must be an integer"):
        check_threads(dataclasses.replace(resolve_target("rpi5"), threads=threads))


def test_an_architecture_without_futex_numbers_stays_single_threaded():
    riscv = dataclasses.replace(resolve_target("rpi5"), triple="riscv64-unknown-linux-gnu", threads=2)
    with pytest.raises(CompileError, match="not available"):
        check_threads(riscv)
    check_threads(dataclasses.replace(riscv, threads=1))


def _conv_after_relu():
    """Relu (code of its own), then a conv every thread count splits, then a Softmax (never split)."""
    b = GraphBuilder("nudged")
    x = b.input("x", TensorType.parse("f32[1,8,8,8]"))
    w = b.constant(np.ones((16, 8, 3, 3), np.float32), "w")
    y = b.add1("Conv", [b.add1("Relu", [x]), w], pads=(1, 1, 1, 1), strides=(1, 1),
               dilations=(1, 1), group=1)
    return b.build([b.add1("Softmax", [y], axis=1)])


@pytest.mark.parametrize("threads", [1, 2])
def test_workers_are_nudged_one_layer_before_a_job(threads):
    """The caller wakes sleeping workers before the layer that precedes a job, so the job finds them
    spinning; the layer after the job needs no nudge, and one thread has no pool to nudge."""
    avx2 = resolve_target("x86-avx2")
    target = dataclasses.replace(avx2, threads=threads,
                                 tuning=avx2.tuning.replace(parallel_sync_ratio=0.0, split_min_reuse=0))
    low = lower(_conv_after_relu(), target, optimize=False)
    entry = low.llvm_ir.split(f'define void @"{low.entry}"(')[1].split("\n}")[0]
    calls = [line.split("@")[1].split("(")[0].strip('"') for line in entry.splitlines() if "call " in line]
    if threads == 1:
        assert not any(c.endswith("_nudge") or c.endswith("_par") for c in calls)
        return
    assert [c.rsplit("_", 1)[-1] for c in calls] == ["nudge", "Relu", "par", "Softmax"]


def _thin_projection(first: str):
    """``first`` (a 3x3 Conv every thread count splits, or a Softmax that never splits), then a 1x1 conv to
    8 channels that splits only by pixel vectors."""
    b = GraphBuilder("projection")
    x = b.input("x", TensorType.parse("f32[1,48,16,16]"))
    if first == "Conv":
        w = b.constant(np.ones((48, 48, 3, 3), np.float32), "w3")
        x = b.add1("Conv", [x, w], pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=1)
    else:
        x = b.add1("Softmax", [x], axis=1)
    w = b.constant(np.ones((8, 48, 1, 1), np.float32), "w1")
    return b.build([b.add1("Conv", [x, w], pads=(0, 0, 0, 0), strides=(1, 1), dilations=(1, 1), group=1)])


def test_parts_of_pixel_vectors_run_only_right_after_a_job():
    """Split by pixel vectors, a conv reads half its input from the other core unless a job just wrote it
    spread over both (after a whole layer, ShuffleNetV2 ran 7% slower so): after the Softmax it stays whole."""
    from cuvil.compiler.codegen.cpu.kernels.split import split_ranges

    avx2 = resolve_target("x86-avx2")
    target = dataclasses.replace(avx2, threads=2, tuning=avx2.tuning.replace(parallel_sync_ratio=0.0))
    ranges = split_ranges(target, (1, 48, 16, 16, 8, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1))
    assert len(ranges) == 2 and all(r.after_job_only for r in ranges)  # the projection alone would split
    assert lower(_thin_projection("Softmax"), target, optimize=False).split_nodes == 0
    assert lower(_thin_projection("Conv"), target, optimize=False).split_nodes == 2


def test_the_caller_runs_each_jobs_first_part():
    """The caller takes part 0 before the workers see the job and runs it itself, so a layer's first part runs
    on the core that ran the first part of the layer before it; the worker takes the other part when awake in
    time. Each part of 3,000 two-part jobs (the second twice as long) records the thread that ran it."""
    import ctypes
    import threading

    import llvmlite.binding as llvm
    from llvmlite import ir

    from cuvil.compiler.codegen.cpu.workers import JOB_TYPE, Pool
    from cuvil.compiler.codegen.irhelpers import I64

    from ...hosts import executable
    from .kernel_jit import target_machine

    t = executable("x86-avx2")
    t = dataclasses.replace(t, threads=2, tuning=t.tuning.replace(pool_pin=False))
    module = ir.Module(name="pool")
    module.triple = t.triple
    Pool(module, "m", t, {})
    job = ir.Function(module, JOB_TYPE, "job")
    b = ir.IRBuilder(job.append_basic_block())
    arena, _, part = job.args
    syscall = module.globals.get("syscall") or ir.Function(module, ir.FunctionType(I64, [I64], var_arg=True), "syscall")
    tid = b.call(syscall, [ir.Constant(I64, 186)])  # gettid
    slot = b.gep(b.bitcast(arena, I64.as_pointer()), [b.zext(part, I64)])
    b.store(tid, slot)
    spin = b.alloca(I64)  # work: the second part twice the first's, so the worker ends last
    b.store(ir.Constant(I64, 0), spin)
    loop, done = job.append_basic_block("loop"), job.append_basic_block("done")
    b.branch(loop)
    b.position_at_end(loop)
    n = b.add(b.load(spin, name="n"), ir.Constant(I64, 1))
    n_inst = b.store(n, spin)
    n_inst.volatile = True
    limit = b.mul(b.zext(b.add(part, ir.Constant(part.type, 1)), I64), ir.Constant(I64, 20000))
    b.cbranch(b.icmp_unsigned("<", n, limit), loop, done)
    b.position_at_end(done)
    b.ret_void()
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(module)), target_machine(t))
    engine.finalize_object()
    fn = ctypes.CFUNCTYPE(None)
    start, stop = fn(engine.get_function_address("m_start")), fn(engine.get_function_address("m_stop"))
    par = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(
        engine.get_function_address("m_par"))
    ran = np.zeros(2, np.int64)
    start()
    try:
        firsts, seconds = set(), set()
        for _ in range(3000):
            ran[:] = 0
            par(engine.get_function_address("job"), ran.ctypes.data, None, 2)
            firsts.add(int(ran[0]))
            seconds.add(int(ran[1]))
    finally:
        stop()
    assert firsts == {threading.get_native_id()}
    assert seconds - {threading.get_native_id()}  # the worker took the second part at times
