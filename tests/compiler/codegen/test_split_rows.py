"""Layers split along rows: elementwise ops over axis 1, GEMMs of several rows, attention's heads."""

from __future__ import annotations

import dataclasses

from cuvil.compiler.codegen.cpu.kernels.base import KernelKey
from cuvil.compiler.codegen.cpu.kernels.split import elementwise_parts, gemm_parts, matmul_parts
from cuvil.compiler.codegen.cpu.tiles import gemm_tile
from cuvil.compiler.ir.dtypes import DType
from cuvil.compiler.ir.types import TensorType
from cuvil.devices import resolve_target

AVX2 = resolve_target("x86-avx2")  # 8 lanes


def _target(threads: int, sync_us: float = 0.0, elements_per_us: int = 1000, gemm_macs_per_us: int = 1000):
    """A part must be worth one handoff of ``sync_us`` at 1,000 multiply-adds (elements) per microsecond."""
    tuning = AVX2.tuning.replace(parallel_sync_us=sync_us, conv_macs_per_us=1000, parallel_sync_ratio=1.0,
                                 elementwise_elements_per_us=elements_per_us, gemm_macs_per_us=gemm_macs_per_us)
    return dataclasses.replace(AVX2, threads=threads, tuning=tuning)


def _f32(*shape: int) -> TensorType:
    return TensorType(DType.F32, shape)


def _key(op: str, ins: list[TensorType], out: TensorType, consts=(), attrs=()) -> KernelKey:
    packed = tuple("const" if i in consts else None for i in range(len(ins)))
    return KernelKey(op, tuple(attrs), tuple(ins), (out,), (), (), packed)


def test_an_elementwise_op_splits_over_axis_one_and_each_operand_as_it_broadcasts():
    key = _key("Add", [_f32(1, 65, 384), _f32(384)], _f32(1, 65, 384), consts=(1,))  # tokens plus a bias
    parts = elementwise_parts(key, _target(2))
    assert [p.rows for p in parts] == [(0, 33), (33, 65)]
    assert [p.out_offset for p in parts] == [0, 33 * 384 * 4]
    assert [p.byte_offsets for p in parts] == [(0, 0), (33 * 384 * 4, 0)]
    assert [p.key.in_types for p in parts] == [(_f32(1, 33, 384), _f32(384)), (_f32(1, 32, 384), _f32(384))]
    assert all(p.axes == (None, None) and p.axis == 1 for p in parts)  # the bias: whole in every part


def test_a_per_channel_constant_is_sliced_and_a_per_pixel_operand_read_whole():
    key = _key("Mul", [_f32(1, 24, 8, 8), _f32(24, 1, 1), _f32(1, 1, 8, 8)], _f32(1, 24, 8, 8), consts=(1,))
    parts = elementwise_parts(key, _target(3))
    assert [p.rows for p in parts] == [(0, 8), (8, 16), (16, 24)]
    assert [p.axes for p in parts] == [(None, 0, None)] * 3  # the scale: its own channels, on its axis 0
    assert [p.key.in_types[1:] for p in parts] == [(_f32(8, 1, 1), _f32(1, 1, 8, 8))] * 3
    assert [p.byte_offsets[0] for p in parts] == [0, 8 * 64 * 4, 16 * 64 * 4]
    assert [p.byte_offsets[2] for p in parts] == [0, 0, 0]


def test_short_rows_split_on_cache_lines():
    parts = elementwise_parts(_key("Relu", [_f32(1, 1000)], _f32(1, 1000)), _target(3))
    assert [p.rows for p in parts] == [(0, 336), (336, 672), (672, 1000)]  # whole 16-float lines, the last the rest


def test_elementwise_ops_that_stay_whole_or_take_given_ranges():
    key = _key("Relu", [_f32(1, 24, 8, 8)], _f32(1, 24, 8, 8))
    assert elementwise_parts(key, _target(1)) is None  # one thread
    assert elementwise_parts(key, _target(2, sync_us=1e6)) is None  # too small to pay
    assert elementwise_parts(_key("Relu", [_f32(2, 24, 8, 8)], _f32(2, 24, 8, 8)), _target(2)) is None  # batch 2
    assert elementwise_parts(_key("Relu", [_f32(24)], _f32(24)), _target(2)) is None  # no axis 1
    assert [p.rows for p in elementwise_parts(key, _target(2, sync_us=1e6), rows=[(0, 16), (16, 24)])] == \
        [(0, 16), (16, 24)]  # a producer's ranges: taken whatever the cost model says
    assert elementwise_parts(key, _target(2), rows=[(0, 16), (16, 20)]) is None  # not every channel


def test_a_matmul_of_several_rows_splits_into_even_ranges_of_rows_sharing_its_weights():
    """Even rows, not whole register tiles: a part's time goes with its rows (ViT-tiny's 65 tokens made 39 and 26
    in 13-row tiles)."""
    key = _key("MatMul", [_f32(1, 65, 128), _f32(128, 384)], _f32(1, 65, 384), consts=(1,))
    assert 65 % gemm_tile(_target(2), 65, 384)[0]  # whole tiles could not share 65 rows out evenly
    parts = matmul_parts(key, _target(2))
    half = 33
    assert [p.rows for p in parts] == [(0, half), (half, 65)]
    assert [p.key.in_types for p in parts] == [(_f32(half, 128), _f32(128, 384)), (_f32(65 - half, 128), _f32(128, 384))]
    assert [p.byte_offsets[0] for p in parts] == [0, half * 128 * 4]
    assert [p.out_offset for p in parts] == [0, half * 384 * 4]
    assert all(p.axes == (None, None) and p.axis == 1 for p in parts)  # B whole; rows are the tokens, axis 1


def test_a_gemm_of_several_rows_slices_its_per_row_bias_and_residual():
    attrs = (("activation", "none"), ("alpha", 1.0), ("beta", 1.0), ("has_bias", 1), ("has_residual", 1),
             ("transA", 0), ("transB", 1))
    key = _key("FusedGemm", [_f32(64, 96), _f32(128, 96), _f32(64, 1), _f32(64, 128)], _f32(64, 128), consts=(1, 2),
               attrs=attrs)
    parts = gemm_parts(key, _target(2))
    lo = 32
    assert [p.rows for p in parts] == [(0, lo), (lo, 64)]
    assert parts[1].key.in_types == (_f32(64 - lo, 96), _f32(128, 96), _f32(64 - lo, 1), _f32(64 - lo, 128))
    assert parts[1].byte_offsets == (lo * 96 * 4, 0, lo * 4, lo * 128 * 4)
    assert parts[1].axes == (None, None, 0, None)  # the bias: its rows; the weights whole
    assert all(p.axis == 0 for p in parts)  # rows of a 2-D output: no follower shares them
    assert gemm_parts(dataclasses.replace(key, attrs=tuple((k, 1 if k == "transA" else v) for k, v in attrs)),
                      _target(2)) is None


def test_gemms_that_stay_whole():
    key = _key("MatMul", [_f32(1, 3, 128), _f32(128, 384)], _f32(1, 3, 384), consts=(1,))
    assert matmul_parts(key, _target(2)) is None  # three rows: under two register tiles of rows
    wide = _key("MatMul", [_f32(1, 4, 1024), _f32(1024, 2048)], _f32(1, 4, 2048), consts=(1,))  # 8.4M multiply-adds
    mr = gemm_tile(_target(2), 4, 2048)[0]
    assert mr > 2 and matmul_parts(wide, _target(2)) is None  # two rows a part, each streaming all 8 MiB of B
    big = _key("MatMul", [_f32(1, 65, 128), _f32(128, 384)], _f32(1, 65, 384), consts=(1,))
    assert matmul_parts(big, _target(1)) is None
    assert matmul_parts(big, _target(2, sync_us=1e7)) is None
    q = _key("MatMul", [TensorType(DType.I32, (1, 65, 128)), TensorType(DType.I32, (128, 384))],
             TensorType(DType.I32, (1, 65, 384)), consts=(1,))
    assert matmul_parts(q, _target(2)) is None  # float only


def test_a_gemm_is_costed_at_the_gemm_speed_not_the_conv_speed():
    key = _key("MatMul", [_f32(1, 64, 128), _f32(128, 384)], _f32(1, 64, 384), consts=(1,))  # 3.1M multiply-adds
    assert len(matmul_parts(key, _target(2, sync_us=1000, gemm_macs_per_us=1000))) == 2  # 3.1 ms: parts worth 1 ms
    assert matmul_parts(key, _target(2, sync_us=1000, gemm_macs_per_us=4000)) is None  # 0.8 ms: not worth one
    heads = _key("MatMul", [_f32(1, 4, 64, 32), _f32(1, 4, 32, 64)], _f32(1, 4, 64, 64))  # 0.5M multiply-adds
    assert len(matmul_parts(heads, _target(2, sync_us=200, gemm_macs_per_us=1000))) == 2
    assert matmul_parts(heads, _target(2, sync_us=200, gemm_macs_per_us=4000)) is None


def test_attention_splits_by_heads_and_a_shared_operand_is_read_whole():
    key = _key("MatMul", [_f32(1, 4, 65, 32), _f32(1, 4, 32, 65)], _f32(1, 4, 65, 65))
    parts = matmul_parts(key, _target(3))
    assert [p.rows for p in parts] == [(0, 2), (2, 3), (3, 4)]
    assert [p.byte_offsets for p in parts] == [(0, 0), (2 * 65 * 32 * 4, 2 * 32 * 65 * 4), (3 * 65 * 32 * 4, 3 * 32 * 65 * 4)]
    assert [p.out_offset for p in parts] == [0, 2 * 65 * 65 * 4, 3 * 65 * 65 * 4]
    shared = _key("MatMul", [_f32(1, 4, 65, 32), _f32(1, 1, 32, 65)], _f32(1, 4, 65, 65))
    assert [p.byte_offsets[1] for p in matmul_parts(shared, _target(2))] == [0, 0]
    assert [p.key.in_types[1] for p in matmul_parts(shared, _target(2))] == [_f32(1, 1, 32, 65)] * 2
    assert matmul_parts(_key("MatMul", [_f32(4, 65, 32), _f32(4, 32, 65)], _f32(4, 65, 65)), _target(2)) is None  # no batch one
