"""Named functions of host object files, linked into this process for the compile's own timing (the
tuner's candidates, the pool probe): by Cuvil's loader (:mod:`.objload`), as the model's code is, and
by llvmlite's MCJIT only where that loader raises :class:`~.objload.UnsupportedObjectError`. MCJIT
here would load LLVM into a compiling process whose LLVM work runs in helper processes (~40 MiB of
its code pages at a cold compile's peak)."""

from __future__ import annotations

from ..compiler.target import Target
from .objload import UnsupportedObjectError, request_amx
from .objload import load as load_image


def load_functions(objs: list[bytes], names: list[str], target: Target) -> tuple[object, tuple[int, ...]]:
    """(what keeps the code mapped, the address of each of ``names``; 0: absent)."""
    if target.has("amx-tile"):
        request_amx()
    try:
        return load_image(objs, names)
    except UnsupportedObjectError:
        from . import jit

        code = jit.load_functions(objs, names, target)
        return code, code.addresses
