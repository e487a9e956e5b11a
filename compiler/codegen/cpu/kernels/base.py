"""The kernel table: op name -> KernelDef, filled by the family modules by convention.

A kernel is an internal LLVM function ``void k(out0*, ..., in0*, ...)`` over static shapes. Its
emitter writes the body through a :class:`KernelContext`; the lowering builds the function around
it, caches it by :class:`KernelKey` and calls it from the model's one entry point.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from llvmlite import ir

from ....errors import CompileError
from ....ir.types import TensorType
from ....target import Target
from ... import irhelpers as h


@dataclass(frozen=True)
class KernelKey:
    """Everything that decides a kernel's code: two nodes with equal keys share one function."""

    op: str
    attrs: tuple[tuple[str, Any], ...]
    in_types: tuple[TensorType, ...]
    out_types: tuple[TensorType, ...]
    alias: tuple[int | None, ...]  # per input: the output whose storage it shares (read through it)
    scalars: tuple[tuple[int, float | int], ...]  # per input index: a constant scalar folded in
    packed: tuple[str | None, ...]  # per input: the packed layout its weights were given, if any


@dataclass
class KernelContext:
    """What an emitter sees: the builder positioned in the body, typed pointers, static types."""

    b: ir.IRBuilder
    target: Target
    key: KernelKey
    ins: list[ir.Value | None]
    outs: list[ir.Value]
    scratch: ir.Value | None = None  # i8*, KernelDef.scratch(key, target) bytes, 64-byte aligned
    fault: ir.Value | None = None  # i32*, the model's fault word (OpDef.run_time_check)
    tables: dict[str, ir.Value] = field(default_factory=dict)  # what an emitter found in its packed constants

    @property
    def module(self) -> ir.Module:
        return self.b.module

    @property
    def name(self) -> str:
        return self.b.function.name

    @property
    def attrs(self) -> Mapping[str, Any]:
        return dict(self.key.attrs)

    @property
    def in_types(self) -> tuple[TensorType, ...]:
        return self.key.in_types

    @property
    def out_types(self) -> tuple[TensorType, ...]:
        return self.key.out_types

    def shape(self, i: int) -> tuple[int, ...]:
        return tuple(self.key.in_types[i].shape)  # type: ignore[arg-type]

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.key.out_types[0].shape)  # type: ignore[arg-type]

    def scalar(self, i: int) -> ir.Constant | None:
        for idx, v in self.key.scalars:
            if idx == i:
                return h.const(h.LLTYPE[self.in_types[i].dtype], v)
        return None

    def set_fault(self) -> None:
        """Record that this run's operands were invalid (the runtime raises after the run)."""
        h.store(self.b, ir.Constant(h.I32, 1), self.fault, 0)

    def read(self, i: int, index: ir.Value | int) -> ir.Value:
        """Element ``index`` of input ``i`` (a folded constant scalar needs no load)."""
        c = self.scalar(i)
        if c is not None:
            return c
        return h.load(self.b, self.ins[i], index)


Emitter = Callable[[KernelContext], None]
Packer = Callable[[KernelKey, int, np.ndarray, Target], "tuple[str, np.ndarray] | None"]
Scratch = Callable[[KernelKey, Target], int]
CodeKey = Callable[[KernelKey], KernelKey]


@dataclass(frozen=True)
class KernelDef:
    """How one op is lowered: backend facts only (what the op allows is its op-table entry's).

    ``pack(key, i, array, target)`` may return ``(layout, packed)`` for a constant input ``i`` to
    store it in the layout the emitter reads (``key.packed[i]`` then names it; the key passed to
    ``pack`` has empty alias/scalars fields and ``packed[i] == "const"`` for every constant input). ``scratch(key, target)``: bytes of temporary
    memory the kernel needs (the lowering shares one arena region among all kernels). ``scalars``: constant
    one-element inputs are folded into the code. Every emitter honours the op's in-place rule
    (``OpDef.shares``): an input the planner placed on the output arrives as ``key.alias``.
    ``code_key(key)``: the key the code depends on, where the packer carries some attributes in the
    packed constants instead (layers, and the parts of a split layer, that differ only there share
    one function).
    """

    emit: Emitter
    pack: Packer | None = None
    scratch: Scratch | None = None
    scalars: bool = False
    code_key: CodeKey | None = None

    def code_of(self, key: KernelKey) -> KernelKey:
        return key if self.code_key is None else self.code_key(key)


KERNELS: dict[str, KernelDef] = {}


def kernel(*ops: str, **options: Any) -> Callable[[Emitter], Emitter]:
    """Decorator: register ``fn`` as the emitter of ``ops``."""

    def deco(fn: Emitter) -> Emitter:
        for op in ops:
            if op in KERNELS:
                raise RuntimeError(f"kernel for {op} registered twice")
            KERNELS[op] = KernelDef(fn, **options)
        return fn

    return deco


def unsupported(op: str, why: str) -> CompileError:
    return CompileError(f"{op}: {why}")
