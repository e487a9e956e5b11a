"""How layers split over threads: output-channel ranges of whole vectors or groups (int8 convs: of 8
channels), small Winograd convs by blocks of tile rows, big layers only."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from llvmlite import ir

from cuvil.compiler.codegen.cpu.conv.emit import emit_conv2d
from cuvil.compiler.codegen.cpu.conv.winograd_geometry import WinogradGeometry, row_split_bytes
from cuvil.compiler.codegen.cpu.kernels.base import KernelKey
from cuvil.compiler.codegen.cpu.kernels.conv import BLOCKS
from cuvil.compiler.codegen.cpu.kernels.split import (conv_parts, gemm_parts, matmul_parts, pool_parts, qconv_parts,
                                                     resize_parts, slice_constant)
from cuvil.compiler.ir.dtypes import DType
from cuvil.compiler.ir.types import TensorType
from cuvil.devices import resolve_target

AVX2 = resolve_target("x86-avx2")  # 8 lanes


def _key(c: int, oc: int, hw: int, k: int = 3, group: int = 1) -> KernelKey:
    attrs = (("dilations", (1, 1)), ("group", group), ("pads", (k // 2,) * 4), ("strides", (1, 1)))
    ins = (TensorType(DType.F32, (1, c, hw, hw)), TensorType(DType.F32, (oc, c // group, k, k)),
           TensorType(DType.F32, (oc,)))
    return KernelKey("Conv", attrs, ins, (TensorType(DType.F32, (1, oc, hw, hw)),), (), (), (None, "const", "const"))


def _target(threads: int, sync_us: float = 0.0, row_split_channels: int = 0):
    """A part must be worth one handoff of ``sync_us`` at 1,000 multiply-adds per microsecond; Winograd convs of
    at most ``row_split_channels`` output channels split by tile rows (default: none, all by channels)."""
    tuning = AVX2.tuning.replace(parallel_sync_us=sync_us, conv_macs_per_us=1000, parallel_sync_ratio=1.0,
                                 winograd_row_split_channels=row_split_channels)
    return dataclasses.replace(AVX2, threads=threads, tuning=tuning)


def test_channel_ranges_are_whole_vectors_and_cover_the_layer():
    parts = conv_parts(_key(32, 40, 16), _target(2))  # 5 vectors of 8 channels over 2 threads
    assert [p.rows for p in parts] == [(0, 24), (24, 40)]
    assert [p.out_offset for p in parts] == [0, 24 * 16 * 16 * 4]
    assert [p.key.out_types[0].shape for p in parts] == [(1, 24, 16, 16), (1, 16, 16, 16)]
    assert all(p.key.in_types[0].shape == (1, 32, 16, 16) for p in parts)  # every part reads all input channels


def test_a_partial_vector_of_channels_goes_to_the_last_part_with_the_fewer_whole_ones():
    assert [p.rows for p in conv_parts(_key(32, 20, 16), _target(2))] == [(0, 8), (8, 20)]  # 2.5 vectors of 8
    assert [p.rows for p in conv_parts(_key(32, 44, 16), _target(2))] == [(0, 24), (24, 44)]  # 5.5: 3 whole, 2 + the half
    loose = dataclasses.replace(_target(3), tuning=_target(3).tuning.replace(split_min_reuse=0))  # a 1x1: no copy
    assert [p.key.out_types[0].shape[1] for p in conv_parts(_key(32, 12, 16, k=1), loose)] == [8, 4]  # 1.5: two parts


def test_depthwise_splits_by_groups_and_moves_the_input():
    parts = conv_parts(_key(48, 48, 16, group=48), _target(3))
    assert [p.rows for p in parts] == [(0, 16), (16, 32), (32, 48)]
    assert [p.byte_offsets[0] for p in parts] == [0, 16 * 16 * 16 * 4, 32 * 16 * 16 * 4]
    assert all(dict(p.key.attrs)["group"] == 16 for p in parts)


def test_small_layers_one_thread_and_batch_one_only():
    assert conv_parts(_key(32, 40, 16), _target(1)) is None  # one thread
    assert conv_parts(_key(32, 40, 16), _target(2, sync_us=1e6)) is None  # too small to pay
    assert conv_parts(_key(32, 4, 2, k=1), _target(2)) is None  # one vector of channels, one of pixels
    key = _key(32, 40, 16)
    batch2 = dataclasses.replace(key, in_types=(TensorType(DType.F32, (2, 32, 16, 16)),) + key.in_types[1:])
    assert conv_parts(batch2, _target(2)) is None


def test_the_handoff_cost_decides_which_layers_split():
    macs = 40 * 16 * 16 * 32 * 9  # 2,949,120: two parts of 1,474,560
    assert len(conv_parts(_key(32, 40, 16), _target(2, sync_us=1400.0))) == 2
    assert conv_parts(_key(32, 40, 16), _target(2, sync_us=1500.0)) is None
    assert len(conv_parts(_key(32, 40, 16), _target(3, sync_us=macs / 3 / 1000))) == 3


def test_parts_keep_the_whole_layers_choice():
    whole = conv_parts(_key(64, 64, 32), _target(2))
    assert len({tuple(c for _, c in p.target.conv_choices) for p in whole}) == 1


def test_a_measured_part_count_overrides_the_cost_model():
    geom = (1, 64, 32, 32, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    three = _target(3)
    assert len(conv_parts(_key(64, 64, 32), three)) == 3  # the cost model: one part per thread
    measured = dataclasses.replace(three, conv_parts=((geom, 1),))
    assert conv_parts(_key(64, 64, 32), measured) is None
    assert len(conv_parts(_key(64, 64, 32), dataclasses.replace(three, conv_parts=((geom, 2),)))) == 2


def test_given_channel_ranges_are_taken_exactly_when_they_fit():
    depthwise = _key(48, 48, 16, group=48)
    assert [p.rows for p in conv_parts(depthwise, _target(2), rows=[(0, 40), (40, 48)])] == [(0, 40), (40, 48)]
    assert conv_parts(depthwise, _target(2), rows=[(0, 40), (40, 44)]) is None  # not all channels
    assert conv_parts(depthwise, _target(2), rows=[(0, 16), (16, 32), (32, 48)]) is None  # more parts than threads
    assert conv_parts(_key(32, 40, 16), _target(2), rows=[(0, 20), (20, 40)]) is None  # not whole vectors of 8


def test_a_layer_kept_whole_says_why():
    from cuvil.compiler.codegen.cpu.kernels.split import decide_split

    def why(c, oc, hw, threads=2, sync_us=0.0, group=1, k=3):
        return decide_split(_target(threads, sync_us), (1, c, hw, hw, oc, k, k, (1, 1), (k // 2,) * 4, (1, 1), group))[1]

    assert why(32, 40, 16) == ""  # split
    assert why(32, 40, 16, threads=1) == "one thread"
    assert why(32, 20, 16) == ""  # split: the last part takes the partial vector
    assert why(32, 8, 2, k=1) == "one 8-channel unit of output"  # and one vector of pixels
    assert why(32, 8, 16, k=1) == ""  # split by pixel vectors
    assert why(32, 8, 16) == ""  # a copied direct conv: split by bands of rows
    assert why(32, 40, 16, sync_us=2000.0) == "2.95M multiply-adds: under two parts of 2.00M"


def test_a_conv_whose_channel_parts_would_do_little_per_input_element_splits_by_pixels():
    """Every output-channel part reads the whole input, half of it from the other core's cache after a split
    producer: MobileNetV2's 1x1 convs to 24 channels at 24x24 ran 2.1-2.5x slower in parts of 16 and 8. Such an
    uncopied direct conv splits into ranges of its pixel vectors instead, as even as they go (a part may end in a
    tile of fewer than ``nv``), each part every channel of its pixels, marked to split only right after another
    job."""
    from cuvil.compiler.codegen.cpu.conv.plan import conv_plan
    from cuvil.compiler.codegen.cpu.kernels.split import decide_split

    def geom(oc, k):
        return (1, 144, 24, 24, oc, k, k, (1, 1), (k // 2,) * 4, (1, 1), 1)

    t = _target(2)
    whole = conv_plan(t, *geom(24, 1))
    assert whole.by_slots and whole.slots == 72
    ranges = decide_split(t, geom(24, 1))[0]
    assert [(r.rows, r.blocks) for r in ranges] == [((0, 24), (0, 36)), ((0, 24), (36, 72))]
    assert all(r.after_job_only for r in ranges)
    odd = (1, 144, 20, 20, 24, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)  # 50 slots in 25 tiles of 2: 25 slots a part
    assert conv_plan(t, *odd).by_slots and (conv_plan(t, *odd).slots, conv_plan(t, *odd).nv) == (50, 2)
    assert [r.blocks for r in decide_split(t, odd)[0]] == [(0, 25), (25, 50)]
    parts = conv_parts(_key(144, 24, 24, k=1), t)
    assert [dict(p.key.attrs)[BLOCKS] for p in parts] == [(0, 36), (36, 72)]
    assert all(p.after_job_only and p.axis == 2 for p in parts)
    assert decide_split(t, geom(64, 1))[0] is not None  # parts of 32 channels
    assert decide_split(t, geom(24, 3))[0] is not None  # parts of 16 and 8 channels, 9 taps each
    loose = dataclasses.replace(t, tuning=t.tuning.replace(split_min_reuse=0))
    assert sorted(hi - lo for lo, hi in (r.rows for r in decide_split(loose, geom(24, 1))[0])) == [8, 16]


def test_parts_of_a_packed_1x1_conv_pack_as_the_whole_layer_does():
    """A part with too few row blocks to pack its panel alone packs it all the same (the same K blocks, so the
    same order of partial sums): such layers of ResNet-50 and MobileNetV1 stayed whole before (ResNet-50 at 2
    threads on the Xeon: 1.35x -> 1.63x its 1 thread)."""
    from cuvil.compiler.codegen.cpu.conv.plan import conv_plan
    from cuvil.compiler.codegen.cpu.kernels.split import split_ranges

    t = _target(2)
    geom = (1, 256, 16, 16, 64, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    whole = conv_plan(t, *geom)
    assert whole.pack_b and -(-32 // whole.mr) < t.tuning.pack_min_row_blocks  # a 32-channel part alone would not pack
    parts = split_ranges(t, geom)
    assert [r.rows for r in parts] == [(0, 32), (32, 64)]
    assert all((p.pack_b, p.panel_k, p.mr, p.nv) == (True, whole.panel_k, whole.mr, whole.nv)
               for p in (conv_plan(r.target, *r.geometry) for r in parts))


def test_a_banded_direct_conv_splits_by_bands():
    """A direct conv whose input is copied band by band splits into ranges of bands, each part every output
    channel of its rows (parts of channels would each copy the whole input: ASPP's 32->64 stride-2 conv, two
    channel parts 1.23x the whole layer's time in turn; ASPP at 2 threads 1.71 -> 1.57 ms on the Xeon)."""
    from cuvil.compiler.codegen.cpu.conv.plan import conv_plan

    t = _target(2)
    geom = (1, 32, 128, 128, 64, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1)
    whole = conv_plan(t, *geom)
    assert whole.method == "direct" and whole.band < whole.OH
    parts = conv_parts(_key_of(geom), t)
    bands = -(-whole.OH // whole.band)
    (a, b), (c, d) = [p.rows for p in parts]  # two ranges of bands covering them all, as even as they go
    assert a == 0 and b == c and d == bands and abs((b - a) - (d - c)) <= 1 and all(p.axis == 2 for p in parts)
    assert [dict(p.key.attrs)[BLOCKS] for p in parts] == [p.rows for p in parts]


def test_bands_that_do_not_share_out_evenly_are_cut_finer():
    """seg_bilinear's 32->64 stride-2 conv at 64x64 made 3 bands, its parts 2 and 1 (1.42x at 2 threads): cut into
    4, each part takes 2, every band no taller than before."""
    from cuvil.compiler.codegen.cpu.conv.plan import conv_plan
    from cuvil.compiler.codegen.cpu.kernels.split import split_ranges

    t = dataclasses.replace(resolve_target("x86-avx512"), threads=2)
    geom = (1, 32, 64, 64, 64, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1)
    whole = conv_plan(t, *geom)
    assert whole.method == "direct" and -(-whole.OH // whole.band) == 3
    ranges = split_ranges(t, geom)
    assert [r.blocks for r in ranges] == [(0, 2), (2, 4)]
    assert all(conv_plan(r.target, *r.geometry).band == whole.OH // 4 for r in ranges)


def test_a_direct_conv_copied_whole_splits_into_a_band_per_part():
    """Its copy is cut into one band per part (the parts' tuning carries the cut), so no part copies the whole
    input and each writes its rows, as a row-split layer after it reads them; channel parts before (ResNet-18's
    stem, 3->64 at 32x32) or none at all where one vector of channels is the whole output (MobileNetV1's)."""
    from cuvil.compiler.codegen.cpu.conv.plan import conv_plan
    from cuvil.compiler.codegen.cpu.kernels.split import split_ranges

    for threads, geom in ((2, (1, 3, 32, 32, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1)),
                          (3, (1, 3, 97, 97, 16, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1))):  # 49 rows: 17, 17, 15
        t = _target(threads)
        whole = conv_plan(t, *geom)
        assert whole.method == "direct" and whole.copy and whole.band == whole.OH
        ranges = split_ranges(t, geom)
        assert [r.blocks for r in ranges] == [(i, i + 1) for i in range(threads)]
        plans = [conv_plan(r.target, *r.geometry) for r in ranges]
        assert all((p.method, p.mr, p.nv, p.band) == ("direct", whole.mr, whole.nv, -(-whole.OH // threads))
                   for p in plans)
        assert all(r.rows == (0, whole.OC) for r in ranges)
        assert whole.band_bytes_for(whole.OH + 1) is None  # more parts than rows
    one_row = conv_plan(_target(2), 1, 3, 2, 2, 8, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1)  # a single output row
    assert one_row.band_bytes_for(2) is None and split_ranges(_target(2), (1, 3, 2, 2, 8, 3, 3, (2, 2), (1, 1, 1, 1),
                                                                           (1, 1), 1)) is None


def _key_of(geom) -> KernelKey:
    n, c, h, w, oc, kh, kw, strides, pads, dil, group = geom
    oh, ow = (h + pads[0] + pads[2] - kh) // strides[0] + 1, (w + pads[1] + pads[3] - kw) // strides[1] + 1
    attrs = (("dilations", dil), ("group", group), ("pads", pads), ("strides", strides))
    ins = (TensorType(DType.F32, (n, c, h, w)), TensorType(DType.F32, (oc, c // group, kh, kw)),
           TensorType(DType.F32, (oc,)))
    return KernelKey("Conv", attrs, ins, (TensorType(DType.F32, (n, oc, oh, ow)),), (), (), (None, "const", "const"))


def _qkey(c: int, oc: int, hw: int, group: int = 1, per_channel: bool = True) -> KernelKey:
    w_scale = tuple(0.01 * (i + 1) for i in range(oc)) if per_channel else (0.5,)
    attrs = (("dilations", (1, 1)), ("group", group), ("pads", (1, 1, 1, 1)), ("strides", (1, 1)),
             ("w_scale", w_scale), ("x_scale", 0.1), ("x_zero_point", 128), ("y_scale", 0.2))
    ins = (TensorType(DType.U8, (1, c, hw, hw)), TensorType(DType.I8, (oc, c // group, 3, 3)),
           TensorType(DType.I32, (oc,)))
    return KernelKey("QConv", attrs, ins, (TensorType(DType.U8, (1, oc, hw, hw)),), (), (), (None, "const", "const"))


def test_an_int8_conv_splits_in_units_of_eight_channels_the_last_part_taking_the_rest():
    parts = qconv_parts(_qkey(32, 44, 16), _target(2))  # 5 units of 8 and 4 channels more
    assert [p.rows for p in parts] == [(0, 24), (24, 44)]
    assert [p.out_offset for p in parts] == [0, 24 * 16 * 16]  # one byte per output element
    assert [p.key.out_types[0].shape for p in parts] == [(1, 24, 16, 16), (1, 20, 16, 16)]
    assert [p.key.in_types[1].shape for p in parts] == [(24, 32, 3, 3), (20, 32, 3, 3)]
    assert all(p.key.in_types[0].shape == (1, 32, 16, 16) and p.byte_offsets[0] == 0 for p in parts)


def test_an_int8_parts_per_channel_scales_are_its_own_channels():
    key = _qkey(32, 44, 16)
    scales = dict(key.attrs)["w_scale"]
    parts = qconv_parts(key, _target(2))
    assert [dict(p.key.attrs)["w_scale"] for p in parts] == [scales[:24], scales[24:]]
    one_scale = qconv_parts(_qkey(32, 44, 16, per_channel=False), _target(2))
    assert [dict(p.key.attrs)["w_scale"] for p in one_scale] == [(0.5,), (0.5,)]


def test_an_int8_depthwise_conv_splits_by_channels_and_moves_the_input():
    parts = qconv_parts(_qkey(48, 48, 16, group=48), _target(3))
    assert [p.rows for p in parts] == [(0, 16), (16, 32), (32, 48)]
    assert [p.byte_offsets[0] for p in parts] == [0, 16 * 16 * 16, 32 * 16 * 16]
    assert all(dict(p.key.attrs)["group"] == 16 and p.key.in_types[0].shape == (1, 16, 16, 16) for p in parts)


def test_an_int8_im2col_conv_of_many_pixels_a_channel_splits_by_output_rows():
    """At x86-avx2 a 1x1 stride-2 conv runs on the im2col GEMM: at 32x32 outputs and 16 channels (64 pixels a
    channel) its parts are ranges of output rows over every channel, the whole layer's operands and output;
    at 8x8 (4 a channel, under ``int8_row_split_pixels_per_channel`` 8 here) ranges of channels."""
    def key(hw: int) -> KernelKey:
        attrs = (("dilations", (1, 1)), ("group", 1), ("pads", (0, 0, 0, 0)), ("strides", (2, 2)),
                 ("w_scale", (0.01,)), ("x_scale", 0.1), ("x_zero_point", 128), ("y_scale", 0.2))
        ins = (TensorType(DType.U8, (1, 16, 2 * hw, 2 * hw)), TensorType(DType.I8, (16, 16, 1, 1)))
        return KernelKey("QConv", attrs, ins, (TensorType(DType.U8, (1, 16, hw, hw)),), (), (), (None, "const"))

    t = _target(2)
    t = dataclasses.replace(t, tuning=t.tuning.replace(int8_row_split_pixels_per_channel=8))
    parts = qconv_parts(key(32), t)
    assert [(p.axis, p.rows, dict(p.key.attrs)[BLOCKS]) for p in parts] == [(2, (0, 16), (0, 16)), (2, (16, 32), (16, 32))]
    assert all(p.key.out_types == key(32).out_types and p.out_offset == 0 and p.byte_offsets == (0, 0) for p in parts)
    assert [(p.axis, p.rows) for p in qconv_parts(key(8), dataclasses.replace(t, tuning=t.tuning.replace(
        conv_macs_per_us=10)))] == [(1, (0, 8)), (1, (8, 16))]


def test_int8_convs_that_stay_whole():
    assert qconv_parts(_qkey(32, 44, 16), _target(1)) is None  # one thread
    assert qconv_parts(_qkey(32, 44, 16), _target(2, sync_us=1e6)) is None  # too small to pay
    assert qconv_parts(_qkey(32, 12, 16), _target(2)) is None  # one unit of 8 channels
    assert qconv_parts(_qkey(32, 32, 16, group=2), _target(2)) is None  # grouped, not depthwise
    key = _qkey(32, 44, 16)
    batch2 = dataclasses.replace(key, in_types=(TensorType(DType.U8, (2, 32, 16, 16)),) + key.in_types[1:])
    assert qconv_parts(batch2, _target(2)) is None
    computed = dataclasses.replace(key, packed=(None, None, "const"))  # weights computed at run time
    assert qconv_parts(computed, _target(2)) is None


def test_an_int8_depthwise_conv_takes_its_producers_ranges_when_they_fit():
    depthwise = _qkey(48, 48, 16, group=48)
    assert [p.rows for p in qconv_parts(depthwise, _target(2), rows=[(0, 24), (24, 48)])] == [(0, 24), (24, 48)]
    assert qconv_parts(depthwise, _target(2), rows=[(0, 20), (20, 48)]) is None  # not whole units of 8
    assert qconv_parts(depthwise, _target(2), rows=[(0, 16), (16, 32), (32, 48)]) is None  # more parts than threads


def _gemm_key(n: int, k: int, bias: tuple[int, ...] | None = (None,), op: str = "Gemm", trans_b: int = 1,
              m: int = 1) -> KernelKey:
    attrs = (("alpha", 1.0), ("beta", 1.0), ("transA", 0), ("transB", trans_b))
    ins = [TensorType(DType.F32, (m, k)), TensorType(DType.F32, (n, k) if trans_b else (k, n))]
    if bias is not None:
        ins.append(TensorType(DType.F32, (n,) if bias == (None,) else bias))
    if op == "FusedGemm":
        attrs += (("act_alpha", 0.0), ("act_beta", 0.0), ("activation", "Relu"), ("has_bias", int(bias is not None)),
                  ("has_residual", 1))
        ins.append(TensorType(DType.F32, (m, n)))
    packed = (None, "const") + ("const",) * (bias is not None) + (None,) * (op == "FusedGemm")
    return KernelKey(op, attrs, tuple(ins), (TensorType(DType.F32, (m, n)),), (), (), packed)


def test_a_fully_connected_layer_splits_into_column_ranges_of_whole_vectors():
    parts = gemm_parts(_gemm_key(44, 64), _target(2))  # 5 vectors of 8 columns and 4 more
    assert [p.rows for p in parts] == [(0, 24), (24, 44)]
    assert [p.out_offset for p in parts] == [0, 24 * 4]
    assert [p.key.in_types[1].shape for p in parts] == [(24, 64), (20, 64)]  # B's rows: [N, K] with transB
    assert [p.key.in_types[2].shape for p in parts] == [(24,), (20,)]
    assert all(p.key.in_types[0].shape == (1, 64) and p.byte_offsets[0] == 0 for p in parts)


def test_a_fused_layers_residual_is_sliced_as_its_output_and_one_bias_value_serves_all():
    parts = gemm_parts(_gemm_key(48, 64, bias=(1,), op="FusedGemm"), _target(2))
    assert [p.rows for p in parts] == [(0, 24), (24, 48)]
    assert [p.key.in_types[2].shape for p in parts] == [(1,), (1,)]
    assert [(p.key.in_types[3].shape, p.byte_offsets[3]) for p in parts] == [((1, 24), 0), ((1, 24), 24 * 4)]


def test_fully_connected_layers_that_stay_whole():
    assert gemm_parts(_gemm_key(44, 64), _target(1)) is None  # one thread
    assert gemm_parts(_gemm_key(44, 64, m=2), _target(2)) is None  # batch of two: a column is no contiguous range
    assert gemm_parts(_gemm_key(44, 64, trans_b=0), _target(2)) is None  # B [K, N]: its columns are no rows
    assert gemm_parts(_gemm_key(44, 64, bias=(1, 44)), _target(2)) is None  # a bias shaped like the output
    assert gemm_parts(_gemm_key(12, 64), _target(2)) is None  # one vector of columns
    assert gemm_parts(_gemm_key(44, 64), _target(2, sync_us=1e6)) is None  # too small to pay


def _qmatmul_key(n: int, k: int, m: int = 1, bias: bool = True) -> KernelKey:
    attrs = (("a_scale", 0.1), ("a_zero_point", 3), ("b_scale", tuple(0.01 * (j + 1) for j in range(n))),
             ("y_scale", 0.2), ("y_zero_point", 5))
    ins = (TensorType(DType.U8, (m, k)), TensorType(DType.I8, (k, n))) + ((TensorType(DType.I32, (n,)),) if bias else ())
    return KernelKey("QMatMul", attrs, ins, (TensorType(DType.U8, (m, n)),), (), (), (None, "const") + ("const",) * bias)


def test_an_int8_fully_connected_layer_splits_its_weights_by_columns():
    key = _qmatmul_key(44, 64)
    parts = matmul_parts(key, _target(2))
    assert [p.rows for p in parts] == [(0, 24), (24, 44)]
    assert [p.out_offset for p in parts] == [0, 24]  # one byte per output
    assert [p.key.in_types[1].shape for p in parts] == [(64, 24), (64, 20)]  # B is [K, N]: its columns
    assert [p.axes for p in parts] == [(None, 1, 0)] * 2
    scales = dict(key.attrs)["b_scale"]
    assert [dict(p.key.attrs)["b_scale"] for p in parts] == [scales[:24], scales[24:]]
    b = np.arange(64 * 44).reshape(64, 44)
    assert np.array_equal(slice_constant(b, parts[1], 1), b[:, 24:44])
    assert slice_constant(b, parts[1], 0) is b  # not sliced: the activations' input


def test_int8_fully_connected_layers_that_stay_whole():
    assert matmul_parts(_qmatmul_key(44, 64), _target(1)) is None
    assert matmul_parts(_qmatmul_key(44, 64, m=4), _target(2)) is None  # four rows: columns are no contiguous range
    assert matmul_parts(_qmatmul_key(12, 64), _target(2)) is None  # one vector of columns
    computed = dataclasses.replace(_qmatmul_key(44, 64), packed=(None, None, "const"))
    assert matmul_parts(computed, _target(2)) is None


def test_a_float_matmul_of_one_row_by_constant_weights_splits_by_columns():
    key = KernelKey("MatMul", (), (TensorType(DType.F32, (1, 64)), TensorType(DType.F32, (64, 44))),
                    (TensorType(DType.F32, (1, 44)),), (), (), (None, "const"))
    parts = matmul_parts(key, _target(2))
    assert [(p.rows, p.key.in_types[1].shape, p.out_offset) for p in parts] == [((0, 24), (64, 24), 0),
                                                                                ((24, 44), (64, 20), 96)]
    rows3 = dataclasses.replace(key, in_types=(TensorType(DType.F32, (1, 1, 64)), key.in_types[1]))
    assert matmul_parts(rows3, _target(2)) is None  # A of rank 3: whole


def _pool_key(c: int, hw: int, op: str = "MaxPool", batch: int = 1, outs: int = 1) -> KernelKey:
    attrs = (("kernel_shape", (2, 2)), ("pads", (0, 0, 0, 0)), ("strides", (2, 2)))
    out = TensorType(DType.F32, (batch, c, hw // 2, hw // 2))
    return KernelKey(op, attrs, (TensorType(DType.F32, (batch, c, hw, hw)),), (out,) * outs, (), (), (None,))


def _pool_target(threads: int, sync_us: float = 0.0, elements_per_us: int = 1000):
    """A part must be worth one handoff of ``sync_us``: pooling reads ``elements_per_us``."""
    return dataclasses.replace(_target(threads, sync_us), tuning=_target(threads, sync_us).tuning.replace(
        pool_elements_per_us=elements_per_us))


def test_a_pool_splits_by_channels_each_part_moving_its_input_and_output():
    parts = pool_parts(_pool_key(5, 16), _pool_target(2))
    assert [p.rows for p in parts] == [(0, 3), (3, 5)]  # any channel count: a plane is pooled alone
    assert [p.byte_offsets for p in parts] == [(0,), (3 * 16 * 16 * 4,)]
    assert [p.out_offset for p in parts] == [0, 3 * 8 * 8 * 4]
    assert [p.key.in_types[0].shape for p in parts] == [(1, 3, 16, 16), (1, 2, 16, 16)]
    assert [p.key.out_types[0].shape for p in parts] == [(1, 3, 8, 8), (1, 2, 8, 8)]
    assert all(p.key.attrs == _pool_key(5, 16).attrs for p in parts)
    assert len(pool_parts(_pool_key(5, 16, "AveragePool"), _pool_target(3))) == 3


def test_the_pools_input_size_and_the_handoff_decide_its_split():
    elements = 4 * 16 * 16  # 1,024 at 1,000 a microsecond: two parts of 0.512 us
    assert len(pool_parts(_pool_key(4, 16), _pool_target(2, sync_us=0.5))) == 2
    assert pool_parts(_pool_key(4, 16), _pool_target(2, sync_us=0.6)) is None
    assert pool_parts(_pool_key(4, 16), _pool_target(2, sync_us=0.5, elements_per_us=2 * elements)) is None


def test_pools_that_stay_whole():
    assert pool_parts(_pool_key(4, 16), _pool_target(1)) is None  # one thread
    assert pool_parts(_pool_key(4, 16, batch=2), _pool_target(2)) is None  # batch two
    assert pool_parts(_pool_key(4, 16, outs=2), _pool_target(2)) is None  # MaxPool's indices too
    assert pool_parts(_pool_key(1, 16), _pool_target(2)) is None  # one channel


def test_a_pool_takes_its_producers_channel_ranges():
    assert [p.rows for p in pool_parts(_pool_key(40, 16), _pool_target(2), [(0, 24), (24, 40)])] == [(0, 24), (24, 40)]
    assert pool_parts(_pool_key(40, 16), _pool_target(2), [(0, 24), (24, 32)]) is None  # not all of its channels


def _resize_key(c: int, sizes: tuple, scales: tuple, mode: str = "half_pixel") -> KernelKey:
    attrs = {"antialias": 0, "coordinate_transformation_mode": mode, "cubic_coeff_a": -0.75, "exclude_outside": 0,
             "extrapolation_value": 0.0, "mode": "linear", "nearest_mode": "floor",
             "roi": (0, 0, 0, 0, 1, 1, 1, 1) if mode == "tf_crop_and_resize" else (), "scales": scales, "sizes": sizes}
    out = TensorType(DType.F32, (1, c if sizes[1] == -1 else sizes[1], 32, 32))
    return KernelKey("Resize", tuple(sorted(attrs.items())), (TensorType(DType.F32, (1, c, 16, 16)),), (out,), (), (),
                     (None,))


def test_a_resize_keeping_its_channels_splits_by_them_each_part_sized_by_its_own():
    """The torch frontend gives axis 1's size (the layer's 21), which a part of 11 channels must not take."""
    for sizes in ((-1, -1, 32, 32), (1, 21, 32, 32)):
        parts = resize_parts(_resize_key(21, sizes, (1.0, 1.0, 2.0, 2.0)), _pool_target(2))
        assert [p.rows for p in parts] == [(0, 11), (11, 21)]
        assert [p.key.out_types[0].shape for p in parts] == [(1, 11, 32, 32), (1, 10, 32, 32)]
        assert all(dict(p.key.attrs)["sizes"] == (sizes[0], -1, 32, 32) for p in parts)
    assert resize_parts(_resize_key(21, (1, 42, 32, 32), (1.0, 2.0, 2.0, 2.0)), _pool_target(2)) is None  # resizes them
    assert resize_parts(_resize_key(21, (-1, -1, 32, 32), (1.0, 1.0, 2.0, 2.0), "tf_crop_and_resize"),
                        _pool_target(2)) is None  # a region of interest may cut axis 1


def test_small_winograd_convs_split_by_tile_rows():
    """64 channels at 32x32, F(4x4) on 8 lanes: 8 x 8 tiles, one block of all 8 tile rows whole; split, 2 or 3
    blocks (4 or 3 tile rows each, the last 2), one part each, each reading and writing the whole layer's tensors."""
    key = _key(64, 64, 32)
    for threads, blocks, rows in ((2, [(0, 1), (1, 2)], 4), (3, [(0, 1), (1, 2), (2, 3)], 3)):
        parts = conv_parts(key, _target(threads, row_split_channels=64))
        assert [p.rows for p in parts] == blocks and {p.axis for p in parts} == {2}
        assert [dict(p.key.attrs)[BLOCKS] for p in parts] == blocks
        assert all(p.out_offset == 0 and set(p.byte_offsets) == {0} and p.axes == (None, None, None) for p in parts)
        assert all(p.key.in_types == key.in_types and p.key.out_types == key.out_types for p in parts)
        geom = WinogradGeometry.of(8, 64, 32, 32, 64, (1, 1, 1, 1), 4, parts[0].target.tuning.winograd_block_bytes)
        assert (geom.nblk, geom.TRB) == (threads, rows)
    assert conv_parts(_key(64, 72, 32), _target(2, row_split_channels=64))[0].axis == 1  # more channels: by channels
    assert conv_parts(_key(64, 64, 32), _target(2))[0].axis == 1  # the profile's limit decides


def test_a_layer_of_few_tile_rows_splits_by_channels():
    """16x16 on 16 lanes (x86-avx512), F(4x4): 4 x 4 tiles, 4 tile rows to a vector: one block, no rows to cut."""
    avx512 = resolve_target("x86-avx512")
    target = dataclasses.replace(avx512, threads=2, tuning=avx512.tuning.replace(
        parallel_sync_us=0.0, conv_macs_per_us=1000, parallel_sync_ratio=1.0, winograd_row_split_channels=64))
    assert [p.rows for p in conv_parts(_key(64, 64, 16), target)] == [(0, 32), (32, 64)]
    assert row_split_bytes(16, 64, 16, 16, 64, (1, 1, 1, 1), 4, 4 << 20, 2) is None


def test_only_winograd_kernels_run_blocks_of_tile_rows():
    module = ir.Module()
    with pytest.raises(ValueError, match="Winograd"):  # a depthwise conv is never Winograd
        emit_conv2d(module, "k", AVX2, 1, 16, 8, 8, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 16, blocks=(0, 1))


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
def test_the_parts_of_a_layer_split_by_rows_call_one_body(profile):
    """A Winograd layer split by tile rows and a banded direct conv split by bands: their parts' kernels each
    call one body with their blocks as arguments, so a second part adds a call, not a second copy of the code
    (before: the parts' kernels differed only in two loop bounds, each printed and compiled whole)."""
    from cuvil.compiler.codegen.cpu.conv.choices import with_choices
    from cuvil.compiler.codegen.cpu.kernels.split import split_ranges
    from cuvil.compiler.codegen.irtext import module_text
    from cuvil.compiler.target import ConvChoice

    base = resolve_target(profile)
    base = dataclasses.replace(base, threads=2, tuning=base.tuning.replace(
        parallel_sync_us=0.0, conv_macs_per_us=1000, parallel_sync_ratio=1.0, winograd_row_split_channels=64,
        direct_band_bytes=4096))
    winograd = (1, 64, 32, 32, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    banded = (1, 3, 23, 40, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    for geom, choice in ((winograd, None), (banded, ConvChoice("direct", 4, 1, base.vector_floats))):
        target = with_choices(base, {geom: choice}) if choice else base
        ranges = split_ranges(target, geom)
        assert ranges is not None and len(ranges) == 2 and ranges[1].blocks[0] == ranges[0].blocks[1]
        module, sizes = ir.Module(name="parts"), []
        for i, r in enumerate(ranges):
            emit_conv2d(module, f"p{i}", r.target, *geom, bias=True, residual=True, activation="Relu", blocks=r.blocks)
            sizes.append(len(module_text(module)))
        bodies = [f for f in module.functions if f.name.startswith("conv_part_") and f.blocks]
        assert len(bodies) == 1
        for i, r in enumerate(ranges):
            text = str(module.get_global(f"p{i}"))
            assert f'@"{bodies[0].name}"' in text and f"i64 {r.blocks[0]}, i64 {r.blocks[1]}" in text
        assert sizes[1] - sizes[0] < 1000 < sizes[0]
