"""Integer dot products of byte quads, one implementation per instruction set (pure ``llvmlite.ir``).

A step adds, to each of VL int32 lanes, the dot product of one 4-byte unit of one operand with one
unit of the other (``u`` and ``s``: two ``<4VL x i8>`` vectors, lane j's unit at bytes 4j..4j+3): four
bytes (a quad) for every variant but ``avx2-wd``, whose units are two int16.
Every variant is exact (int32 accumulation without saturation):

* ``vnni``: x86 ``vpdpbusd`` (AVX-512 VNNI at 512 or 256 bits, AVX-VNNI at 256): u8 x s8.
* ``amx``: the GEMMs on AMX-INT8 tiles (:mod:`.amx`), the same layouts as ``vnni`` at 512 bits,
  whose ``vpdpbusd`` steps any other loop.
* ``avx2-ubsw``: ``vpmaddubsw`` then ``vpmaddwd`` by ones, u8 x s8. ``vpmaddubsw`` saturates a pair
  sum to int16, so the weight packer chooses it only when every pair of weights has
  ``|w0| + |w1| <= 128`` (then ``255 * 128 < 2^15``). Two ``vpmaddubsw`` results cannot be added in
  int16 before the widening ``vpmaddwd``: ``2 * 255 * 128 = 65280 > 2^15 - 1``; that would need
  ``|w0| + |w1| <= 64`` (6-bit weights), which no quantizer here makes. On Zen 4 both instructions
  issue on the same two multiply pipes, so a step is 32 products per two multiply uops, as
  ``vpmaddwd`` on widened int16 pairs; its gain is fewer operand bytes, broadcasts and adds.
* ``avx2-wd``: ``vpmaddwd`` on int16 pairs, exact for any weights. Its operands' 4-byte units hold
  two int16 (``per_unit`` 2: the packers widen the bytes once, so the GEMM loop has no widening
  shuffles and each step is one ``vpmaddwd`` and one add into the VL lanes).
* ``sdot``: ARM ``sdot`` (NEON dotprod), s8 x s8: u8 activations are shifted by -128 when packed.
* ``sve-sdot``: the GEMMs on SVE ``sdot`` (:mod:`.sve_dot`, vector-length agnostic) for scalable
  targets without i8mm, the ``sdot`` layouts and encoding; NEON ``sdot`` steps any other loop.
* ``i8mm``: the GEMMs on ARM ``smmla`` 2x2 tiles (:mod:`.mmla`), the ``sdot`` layouts and encoding,
  whose ``sdot`` steps any other loop (an odd last row).
* ``generic``: widen to int32, multiply, add the quads (what any LLVM target can compile).

``Dot`` says which encoding the ``u`` operand needs (``u_signed``): the packers add 128 to (or
subtract it from) the activations and their zero point accordingly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from ...target import Target
from .. import irhelpers as h
from ..irhelpers import call_named

I16 = ir.IntType(16)
U8_BOUND = 128  # |w0| + |w1| at most this: vpmaddubsw cannot saturate with u8 activations


@dataclass(frozen=True)
class Dot:
    """One instruction set's quad dot product over VL int32 lanes."""

    kind: str
    vl: int  # int32 lanes per vector
    u_signed: bool = False  # the u operand is s8 (sdot) rather than u8

    @property
    def bytes_type(self) -> ir.VectorType:
        return ir.VectorType(h.I8, 4 * self.vl)

    @property
    def lanes_type(self) -> ir.VectorType:
        return ir.VectorType(h.I32, self.vl)

    @property
    def per_unit(self) -> int:
        """K elements in a 4-byte unit: 4 bytes, or 2 int16 for ``avx2-wd``."""
        return 2 if self.kind == "avx2-wd" else 4

    @property
    def unit_dtype(self) -> np.dtype:
        """The packed elements' NumPy type (little-endian, as the target stores them)."""
        return np.dtype("<i2") if self.per_unit == 2 else np.dtype(np.int8)

    def step(self, b: ir.IRBuilder, acc: ir.Value, u: ir.Value, s: ir.Value) -> ir.Value:
        return _STEPS[self.kind](self, b, acc, u, s)


def _mask(idx) -> ir.Constant:
    idx = list(idx)
    return h.vector(ir.VectorType(h.I32, len(idx)), idx)


def _as_i32(b: ir.IRBuilder, v: ir.Value, n: int) -> ir.Value:
    return b.bitcast(v, ir.VectorType(h.I32, n))


def _vnni(d: Dot, b, acc, u, s):
    name = f"llvm.x86.avx512.vpdpbusd.{32 * d.vl}"
    t = d.lanes_type
    return call_named(b, name, t, [acc, _as_i32(b, u, d.vl), _as_i32(b, s, d.vl)])


def _avx2_ubsw(d: Dot, b, acc, u, s):
    assert d.vl == 8
    i16 = ir.VectorType(I16, 16)
    pairs = call_named(b, "llvm.x86.avx2.pmadd.ub.sw", i16, [u, s])
    quads = call_named(b, "llvm.x86.avx2.pmadd.wd", d.lanes_type, [pairs, h.const(i16, 1)])
    return b.add(acc, quads)


def _avx2_wd(d: Dot, b, acc, u, s):
    """Each lane's two int16 pairs multiplied and summed (the packers widened them)."""
    assert d.vl == 8
    i16 = ir.VectorType(I16, 16)
    return b.add(acc, call_named(b, "llvm.x86.avx2.pmadd.wd", d.lanes_type, [b.bitcast(u, i16), b.bitcast(s, i16)]))


def _sdot(d: Dot, b, acc, u, s):
    return call_named(b, f"llvm.aarch64.neon.sdot.v{d.vl}i32.v{4 * d.vl}i8", d.lanes_type, [acc, u, s])


def _generic(d: Dot, b, acc, u, s):
    wide = ir.VectorType(h.I32, 4 * d.vl)
    uw = b.sext(u, wide) if d.u_signed else b.zext(u, wide)
    prod = b.mul(uw, b.sext(s, wide))
    total = acc
    for t in range(4):
        total = b.add(total, b.shuffle_vector(prod, prod, _mask(range(t, 4 * d.vl, 4))))
    return total


_STEPS = {"vnni": _vnni, "amx": _vnni, "avx2-ubsw": _avx2_ubsw, "avx2-wd": _avx2_wd, "sdot": _sdot, "i8mm": _sdot,
          "sve-sdot": _sdot, "generic": _generic}


def is_x86(target: Target) -> bool:
    return target.triple.startswith("x86_64")


def choose_dot(target: Target, bounded_pairs: bool, tiles: bool = True) -> Dot:
    """The fastest exact variant ``target`` can run; ``bounded_pairs``: the weights allow vpmaddubsw;
    ``tiles``: AMX may serve (a matmul of at least ``Tuning.amx_min_rows`` rows, a conv summing at least
    ``Tuning.amx_min_depth`` weights per output)."""
    bits = target.vector_bits or 128
    if is_x86(target):
        if tiles and target.has("amx-int8") and target.has("avx512vnni") and bits == 512:
            return Dot("amx", 16)  # GEMMs on tiles (int_gemm -> amx), other loops by vpdpbusd zmm
        if target.has("avx512vnni") and bits == 512:
            return Dot("vnni", 16)
        if (target.has("avx512vnni") and target.has("avx512vl")) or target.has("avxvnni"):
            return Dot("vnni", 8)
        if target.has("avx2"):
            return Dot("avx2-ubsw" if bounded_pairs else "avx2-wd", 8)
        return Dot("generic", 4)
    if target.triple.startswith("aarch64") and target.has("dotprod"):
        if target.has("i8mm"):
            return Dot("i8mm", 4, u_signed=True)
        return Dot("sve-sdot" if target.scalable and target.has("sve") else "sdot", 4, u_signed=True)
    return Dot("generic", 4)


def pairs_bounded(w_rows) -> bool:
    """True when every pair of weights (k = 2j, 2j+1) of every row has |w0| + |w1| <= U8_BOUND."""
    w = np.asarray(w_rows, dtype=np.int32)
    k = w.shape[-1] + (w.shape[-1] % 2)
    padded = np.zeros(w.shape[:-1] + (k,), np.int32)
    padded[..., : w.shape[-1]] = np.abs(w)
    return bool((padded[..., 0::2] + padded[..., 1::2] <= U8_BOUND).all())
