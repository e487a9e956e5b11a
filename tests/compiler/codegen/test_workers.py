"""The worker pool's code: only multi-threaded modules create threads; thread counts are checked."""

from __future__ import annotations

import dataclasses

import pytest

from cuvil.compiler.codegen.cpu.workers import MAX_THREADS, check_threads
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


@pytest.mark.parametrize("threads", [0, -1, MAX_THREADS + 1, 2.0, True, "2"])
def test_bad_thread_counts_are_compile_errors(threads):
    with pytest.raises(CompileError, match="threads must be an integer"):
        check_threads(dataclasses.replace(resolve_target("rpi5"), threads=threads))


def test_an_architecture_without_futex_numbers_stays_single_threaded():
    riscv = dataclasses.replace(resolve_target("rpi5"), triple="riscv64-unknown-linux-gnu", threads=2)
    with pytest.raises(CompileError, match="not available"):
        check_threads(riscv)
    check_threads(dataclasses.replace(riscv, threads=1))
