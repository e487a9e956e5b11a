"""Guard-page mode: the arena and weights between inaccessible pages, so an access outside them faults."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal

import numpy as np
import pytest
from cuvil.compiler.codegen.lowered import LoweredModel
from cuvil.compiler.memory.plan import MemoryPlan
from cuvil.edge_runtime import jit
from cuvil.edge_runtime.compile import compile_graph, resolve
from cuvil.edge_runtime.guard import PAGE, guarded, make_read_only
from cuvil.edge_runtime.session import CompileStats, Session

from .test_session import _check, mlp_graph


def _in_child(fn) -> int | None:
    """Run ``fn`` in a forked child: None when it returned, else the signal that killed it."""
    pid = os.fork()
    if pid == 0:
        faulthandler.disable()  # the fault is the expected outcome, not worth a traceback
        try:
            fn()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else None


def _peek(address: int) -> int:
    return ctypes.c_uint8.from_address(address).value


def test_a_guarded_buffer_faults_one_byte_past_either_end():
    for n in (1, 64, 100, PAGE, 3 * PAGE + 5):
        buf = guarded(n)
        assert len(buf) == n and buf.ctypes.data % 64 == 0 and not buf.any()
        buf[:] = 7  # every byte of it is usable
    buf = guarded(PAGE - 64)
    end = buf.ctypes.data + len(buf)
    assert end % PAGE == 0 and _peek(end - 1) == 0  # ends exactly at the upper guard page
    assert _in_child(lambda: _peek(end)) == signal.SIGSEGV
    low = guarded(100, at_end=False)
    assert low.ctypes.data % PAGE == 0
    assert _in_child(lambda: _peek(low.ctypes.data - 1)) == signal.SIGSEGV


def test_read_only_weights_fault_on_a_write():
    w = guarded(200)
    w[:] = 3
    make_read_only(w)
    assert not w.flags.writeable and int(w.sum()) == 600
    address = w.ctypes.data
    assert _in_child(lambda: ctypes.memset(address, 0, 1)) == signal.SIGSEGV


def _reader(offset: int) -> jit.LoadedCode:
    """Code whose entry reads the arena byte at ``offset`` (past the end for a bad one) and stores it at 0."""
    ir_text = f"""
@arena = internal global i8* null
@weights = internal global i8* null
define void @e(i8* %a, i8* %w) {{
  %p = getelementptr i8, i8* %a, i64 {offset}
  %v = load volatile i8, i8* %p
  store volatile i8 %v, i8* %a
  ret void
}}
define void @e_bind(i8* %a, i8* %w) {{ store i8* %a, i8** @arena  store i8* %w, i8** @weights  ret void }}
define void @e_bound() {{
  %a = load i8*, i8** @arena
  %w = load i8*, i8** @weights
  call void @e(i8* %a, i8* %w)
  ret void
}}
"""
    return jit.load_object(jit.emit_object(ir_text, resolve("host"), jit=True), "e", resolve("host"))


def _session(arena_bytes: int, code: jit.LoadedCode, guard_pages: bool) -> Session:
    plan = MemoryPlan(1, {}, {}, arena_bytes, arena_bytes, arena_bytes, 64, {})
    lowered = LoweredModel("", "e", b"", plan, arena_bytes, (), (), 1, resolve("host"), 1, 1)
    return Session(lowered, code, CompileStats(0, 0, 0, False, 1, 1, 0), guard_pages=guard_pages)


@pytest.mark.parametrize("arena_bytes", [64, 4096, 10_000 + 48])
def test_the_session_catches_code_that_reads_past_its_arena(arena_bytes):
    inside, past = _reader(arena_bytes - 1), _reader(arena_bytes + (-arena_bytes % 64))
    assert _in_child(lambda: _session(arena_bytes, inside, True).run({})) is None
    assert _in_child(lambda: _session(arena_bytes, past, True).run({})) == signal.SIGSEGV
    assert _in_child(lambda: _session(arena_bytes, past, False).run({})) is None  # unguarded, nothing notices


def test_guarded_sessions_compute_the_same_outputs(tmp_path):
    graph = mlp_graph()
    for cache in (None, tmp_path / "cache"):  # a fresh compile, then a cache hit (mapped weights are copied)
        sess = compile_graph(graph, cache_dir=cache, use_cache=cache is not None, guard_pages=True)
        _check(graph, {"x": np.ones((1, 37), np.float32)}, sess)
    assert compile_graph(graph, cache_dir=tmp_path / "cache", guard_pages=True).stats.cache_hit
