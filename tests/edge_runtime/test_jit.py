"""The JIT loads only code it can link: a call to a routine this process lacks is a CompileError,
never a null call that crashes; libc and libm calls resolve."""

from __future__ import annotations

import pytest

from cuvil.compiler.errors import CompileError
from cuvil.edge_runtime import jit
from cuvil.edge_runtime.elf import global_names

_IR = """
declare double @{callee}(double)
define void @entry(i8* %a, i8* %w) {{
  %p = bitcast i8* %a to double*
  %x = load double, double* %p
  %y = call double @{callee}(double %x)
  store double %y, double* %p
  ret void
}}
define void @entry_bind(i8* %a, i8* %w) {{
  ret void
}}
define void @entry_bound() {{
  ret void
}}
"""


def _object(callee: str) -> bytes:
    target = jit.host_target()
    return jit.emit_object(_IR.format(callee=callee), target, jit=True)


def test_symbols_of_an_object_file():
    defined, used = global_names(_object("exp"))
    assert {"entry", "entry_bind", "entry_bound"} <= defined
    assert used == {"exp"}


def test_symbols_of_a_damaged_object_file_are_none_never_an_error():
    """Truncated or garbled files (LLVM writes the section headers last) give no names."""
    obj = _object("exp")
    for bad in (b"", obj[:64], obj[:len(obj) // 2], obj[:-8], b"\x7fELF\x02\x01" + bytes(200), b"\xff" * 200):
        defined, used = global_names(bad)
        assert not defined and not used


def test_a_call_to_a_missing_routine_is_a_compile_error():
    with pytest.raises(CompileError, match="__cuvil_no_such_routine"):
        jit.load_object(_object("__cuvil_no_such_routine"), "entry", jit.host_target())


def test_libm_calls_resolve():
    code = jit.load_object(_object("exp"), "entry", jit.host_target())
    assert code.address and code.bind and code.bound


def test_amx_tile_state_is_requested_or_refused_with_a_typed_error():
    """Hosts with AMX-INT8 get the tile state (AMX code then runs); others get a CompileError, never SIGILL."""
    from cuvil.devices import resolve_target
    from cuvil.edge_runtime.compile import runnable_here

    if runnable_here(resolve_target("x86-amx")):
        jit.request_amx()
        jit.request_amx()  # idempotent
    else:
        with pytest.raises(CompileError, match="AMX"):
            jit.request_amx()
