"""How a layer is split over threads, decided at compile time from its size.

A packed f32 convolution of batch one is cut into output-channel ranges (whole groups for grouped
and depthwise convs), each a convolution of its own over the same input: its weights and bias are
the slice's, its output and residual start at the slice's first channel. Every part keeps the
method and tile the whole layer got (cost model or tuner), so each output element is computed by
the same instructions in the same order as at one thread: the answer does not depend on the
thread count. Ranges are whole vectors of channels, the last taking the whole layer's partial vector
where it has one, so no part adds a tail the whole layer lacks.
A Winograd conv of few output channels and a direct conv whose input is copied (band by band, or whole:
then cut into a band per part) split into ranges of output rows instead (blocks of tile rows, bands), each
part every channel of its rows, so no part repeats another's input transform or copy; an uncopied direct
conv of too few channels for channel parts, into ranges of its pixel vectors.
How many parts is the cost model's choice unless the on-device tuner measured the layer
(``Target.conv_parts``: the split's slowest part plus ``Tuning.parallel_sync_us`` against the whole).
The model gives a part only to work worth ``parallel_sync_ratio`` handoffs (``min_part_macs``), so a
small layer stays on one thread; the handoff's cost is the device's, measured by the tuner.

An int8 conv (QConv, one group or depthwise) splits the same way, in units of 8 output channels
(``qconv_parts``): its sums are integers, exact in any order, so each part simply gets the kernel its
own shape gets, and its packed weights carry its own requantization multipliers, so equal parts
share one function. A fully connected layer of batch one (Gemm or FusedGemm, A of one row, B the
[N, K] weights of ``transB``; a MatMul or QMatMul of one row by constant [K, N] weights) splits into
column ranges of whole vectors (``gemm_parts``, ``matmul_parts``): the micro-kernel sums each output
over K in order, one accumulator, whatever the columns around it. Pools, resizes, elementwise ops and
GEMMs of several rows split along their output's axis 1 or rows instead (``split_rows.py``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ....ir.dtypes import DType
from ....ir.types import TensorType
from ....ops import OP_TABLE
from ....target import Target
from ..conv.choices import choice_of, with_choices
from ..conv.plan import conv_plan
from ..conv.winograd_geometry import block_budget, row_split_bytes
from .base import KernelKey
from .conv import BLOCKS, geometry
from .quant import im2col_rows_ok
from .parts import Part, cost_model_ranges, covers, even_ranges, min_part_macs, slice_constant  # noqa: F401  (slice_constant: the lowering's)
from .split_rows import ROWWISE, elementwise_parts, gemm_row_parts, heads_parts, pool_parts, resize_parts, rowwise_parts


@dataclass(frozen=True)
class Range:
    """One part of a split conv, from its geometry alone (the tuner times these)."""

    rows: tuple[int, int]  # output channels (all of them for a part of output rows)
    geometry: tuple  # the part's conv_plan arguments
    target: Target  # the whole layer's choice fixed for the part's geometry
    blocks: tuple[int, int] | None = None  # a conv split by rows: its blocks of tile rows (Winograd), bands or pixel-vector slots (direct)
    after_job_only: bool = False  # see ``Part.after_job_only``


def split_ranges(target: Target, geom: tuple, parts: int | None = None,
                 rows: list[tuple[int, int]] | None = None) -> list[Range] | None:
    """The parts of a batch-one conv of geometry ``geom`` (``conv_plan``'s arguments), or None when it
    stays on one thread. ``parts``: at most this many (default: the tuner's measured count for this
    geometry, else the cost model's: one per ``min_part_macs``, at most ``threads``). ``rows``: exactly
    these output-channel ranges (a layer sharing its producer's parts), or None when they do not fit."""
    return decide_split(target, geom, parts, rows)[0]


def decide_split(target: Target, geom: tuple, parts: int | None = None,
                 rows: list[tuple[int, int]] | None = None) -> tuple[list[Range] | None, str]:
    """``split_ranges`` and, when it keeps the layer whole, why (for ``benchmarks/thread_layers.py``)."""
    n, c, hh, ww, oc, kh, kw, strides, pads, dilations, group = geom
    if target.threads < 2 or n != 1:
        return None, "one thread" if target.threads < 2 else "batch above one"
    plan = conv_plan(target, *geom)
    macs = oc * plan.OH * plan.OW * (c // group) * kh * kw
    if group == 1:
        unit = plan.vl
        units = -(-oc // unit)  # the last part takes the whole layer's partial vector, if it has one
    else:
        unit, units = oc // group, group
    if rows is not None:
        if not covers(rows, oc, unit, target.threads):
            return None, "the producer's channel ranges do not fit"
        found = _split(target, plan, geom, unit, rows)
        return found, "" if found else "a part would sum in another order"
    measured = target.split_parts(geom) if parts is None else None
    if parts is None:
        parts = measured
    if parts is None:
        parts = int(macs // max(1.0, min_part_macs(target)))
    if plan.method == "winograd" and plan.dh == 1 and oc <= target.tuning.winograd_row_split_channels:
        for k in range(min(target.threads, parts), 1, -1):
            found = _row_split(target, plan, geom, k)
            if found is not None:
                return found, ""
    if plan.method == "direct" and plan.copy and group == 1 and min(target.threads, parts) > 1:
        found = _band_split(target, plan, geom, min(target.threads, parts))
        if found is not None:
            return found, ""
    reuse, thin = target.tuning.split_min_reuse, False
    for k in range(min(target.threads, units, parts), 1, -1):  # the most parts that sum in the whole layer's order
        ranges = _channel_ranges(oc, units, k, unit)
        if group == 1 and min(hi - lo for lo, hi in ranges) * kh * kw < reuse:
            thin = True  # each part reads the whole input, much of it from other cores' caches, for little work
            continue
        found = _split(target, plan, geom, unit, ranges)
        if found is not None:
            return found, ""
    if plan.by_slots and (thin or units < 2):
        k = min(target.threads, parts, -(-plan.slots // plan.nv))
        if k > 1:
            return _slot_split(target, plan, geom, k), ""
    if units < 2:
        return None, f"one {unit}-channel unit of output"
    if thin:
        return None, f"parts of under {reuse} multiply-adds per input element they read"
    if measured is not None:
        return None, "the tuner measured it faster whole"
    if parts < 2:
        return None, f"{macs / 1e6:.2f}M multiply-adds: under two parts of {min_part_macs(target) / 1e6:.2f}M"
    return None, "a part would sum in another order"


def _channel_ranges(oc: int, units: int, parts: int, unit: int) -> list[tuple[int, int]]:
    """``parts`` ranges of whole ``unit``s over ``oc`` channels; where ``oc`` ends in a partial unit, the last
    range ends there, and the ranges holding more units come last (it is the short one)."""
    sizes = [hi - lo for lo, hi in even_ranges(units, parts, unit)]
    if oc % unit:
        sizes.reverse()
    ends = [sum(sizes[:i + 1]) for i in range(parts)]
    return [(lo, min(hi, oc)) for lo, hi in zip([0] + ends[:-1], ends)]


def _row_split(target: Target, plan, geom: tuple, parts: int) -> list[Range] | None:
    """``parts`` ranges of a Winograd conv's blocks of tile rows, or None when its tile rows do not make that
    many blocks. Each part reads the whole input and weights and writes its own output rows, so no part repeats
    another's input transform, as parts of output channels do (ResNet-18's 64-channel 32x32 convs on the Zen 4,
    the parts run in turn on one core: 1.06-1.07x the whole layer's time in 2 channel parts, 1.30-1.35x in 4;
    0.94-1.02x in 2 or 4 parts of tile rows). Every tile is computed by the same code in any block, so the answer
    does not depend on the split: blocks only bound how much of V and M is live at once."""
    im = plan.winograd_images
    budget = block_budget(target.tuning, plan.vl, plan.C, im.H, im.W, plan.OC, im.pads, plan.mr)
    found = row_split_bytes(plan.vl, plan.C, im.H, im.W, plan.OC, im.pads, plan.mr, budget, parts)
    if found is None:
        return None
    cut, nblk = found
    exact = target.tuning.replace(winograd_block_bytes=cut, winograd_block_weight_ratio=0.0)  # the cut, as found
    sub = with_choices(dataclasses.replace(target, tuning=exact), {geom: choice_of(plan)})
    return [Range((0, plan.OC), geom, sub, (lo, hi)) for lo, hi in even_ranges(nblk, parts, 1)]


def _band_split(target: Target, plan, geom: tuple, parts: int) -> list[Range] | None:
    """At most ``parts`` ranges of a copied direct conv's bands (:mod:`..conv.direct`), or None when it has too
    few rows. Each part copies and reads only its own bands' input rows and computes every output channel of
    them, where parts of output channels would each copy the whole input (ASPP's 32->64 stride-2 conv at 128x128
    on the Xeon: two channel parts ran 1.23x the whole layer's time one after the other). A conv whose copy is
    made whole is cut into one band per part (its parts' tuning carries the cut): the stems and stride-2 1x1
    convs this takes from channel parts, or from staying whole, write their outputs by rows, as the row-split
    layers after them read them (2 threads on the Xeon, interleaved, a 1 us handoff: MobileNetV1 0.476 ->
    0.458 ms, MobileNetV3-ish 0.422 -> 0.413, MobileNetV2 0.645 -> 0.635, ResNet-18 1.783 -> 1.765; ResNet-50,
    SqueezeNet even). Bands that do not share out evenly are cut finer, into a multiple of ``parts`` (ASPP's and
    the segmentation trunk's 32->64 stride-2 conv at 64x64 made 3 bands, its parts 2 and 1: 1.42x its 1-thread
    speed). Every output is computed by the same code in any band."""
    sub = with_choices(target, {geom: choice_of(plan)})
    bands = -(-plan.OH // plan.band)
    if bands % parts:
        cut = plan.band_bytes_for(parts * -(-bands // parts))
        if cut is not None:
            sub = dataclasses.replace(sub, tuning=sub.tuning.replace(direct_band_bytes=cut))
            plan = conv_plan(sub, *geom)
            bands = -(-plan.OH // plan.band)
    if min(parts, bands) < 2:
        return None
    return [Range((0, plan.OC), geom, sub, (lo, hi)) for lo, hi in even_ranges(bands, min(parts, bands), 1)]


def _slot_split(target: Target, plan, geom: tuple, parts: int) -> list[Range]:
    """``parts`` ranges of an uncopied direct conv's pixel-vector slots, as even as they go, for a conv of
    too few output channels for channel parts worth their reads (MobileNetV2's 1x1 projections to 24 and 32
    channels): each part reads only its pixels of the input and computes every output channel of them. Kept
    whole at 2 threads, those layers ran 1.1-1.6x their 1-thread time, reading half their input from the other
    core's cache after a split layer; after a whole one their input lies in the caller's cache, and a worker's
    part would fetch it (ShuffleNetV2 7% slower split so), so these parts run only right after a job
    (``after_job_only``). Xeon, 2 threads, interleaved, a 1 us handoff: MobileNetV2 0.612-0.616 -> 0.591-0.593
    ms; ShuffleNetV2, MobileNetV1, MobileNetV3-ish, KWS DS-CNN even. A part may end in a tile of fewer slots:
    in whole tiles, MobileNetV2's 9-slot projections split 6 and 3 (1.40-1.43x their 1-thread speed; even, 5
    and 4: 1.62-1.66x, Zen 4). Every output is computed alike in a tile of any width (its own sum over K)."""
    sub = with_choices(target, {geom: choice_of(plan)})
    return [Range((0, plan.OC), geom, sub, (lo, hi), after_job_only=True) for lo, hi in even_ranges(plan.slots, parts, 1)]


def conv_parts(key: KernelKey, target: Target, rows: list[tuple[int, int]] | None = None) -> list[Part] | None:
    """The parts of a conv (``key`` as packers see it), or None when it stays on one thread.
    ``rows``: exactly these output-channel ranges (see ``split_ranges``)."""
    if target.threads < 2 or key.packed[1:2] != ("const",):
        return None
    g = geometry(key)
    if g is None:
        return None
    oc, group = g["w_shape"][0], g["group"]
    geom = (*g["in_shape"], oc, *g["w_shape"][2:], g["strides"], g["pads"], g["dilations"], group)
    ranges = split_ranges(target, geom, rows=rows)
    if ranges is None:
        return None
    if ranges[0].blocks is not None:
        return [_row_part(key, r.blocks, r.target, r.after_job_only) for r in ranges]
    return _parts(key, [(r.rows, r.target) for r in ranges])


def _row_part(key: KernelKey, blocks: tuple[int, int], target: Target, after_job_only: bool = False) -> Part:
    """A part of output rows (``_row_split``, ``_band_split``, an int8 conv's rows): the whole layer's operands and
    output, its blocks in its key."""
    sub = dataclasses.replace(key, attrs=key.attrs + ((BLOCKS, blocks),))
    none = (None,) * len(key.in_types)
    return Part(sub, target, (0,) * len(key.in_types), 0, blocks, none, axis=2, after_job_only=after_job_only)


QCONV_UNIT = 8
"""Output channels per unit of a split int8 conv: the integer GEMM's register tiles are at most 8 rows
high, so parts of whole units keep the whole layer's full tiles (the last part takes the rest)."""


def qconv_parts(key: KernelKey, target: Target, rows: list[tuple[int, int]] | None = None) -> list[Part] | None:
    """The parts of an int8 conv of batch one (one group, or depthwise), or None when it stays on one
    thread. Its sums are integers, exact in any order, so any ranges give the same bits; each channel
    part's kernel is chosen for its own shape like any layer's. An im2col GEMM with many output pixels a
    channel (``quant.im2col_rows_ok``, ``Tuning.int8_row_split_pixels_per_channel``) takes ranges of output
    rows: as parts of channels each built the whole im2col (590 KB for ResNet-18's 64-channel layers on AMX,
    which then ran 0.8-1.3x their 1-thread speed at 2 threads) and read half its input from the other core.
    ``rows``: as for ``conv_parts``."""
    if target.threads < 2 or key.packed[1:2] != ("const",):
        return None
    n, c = key.in_types[0].shape[:2]
    oc, cg, kh, kw = key.in_types[1].shape
    group = dict(key.attrs)["group"]
    if n != 1 or not (group == 1 or group == c == oc):
        return None
    oh, ow = key.out_types[0].shape[2:]
    if rows is None:
        rows = cost_model_ranges(target, oc, QCONV_UNIT, oc * oh * ow * cg * kh * kw)
        if rows and oh >= len(rows) and oh * ow >= oc * target.tuning.int8_row_split_pixels_per_channel \
                and im2col_rows_ok(key, target):
            return [_row_part(key, r, target) for r in even_ranges(oh, len(rows), 1)]
    elif not covers(rows, oc, QCONV_UNIT, target.threads):
        return None
    return _parts(key, [(r, target) for r in rows]) if rows else None


def gemm_parts(key: KernelKey, target: Target, rows: list[tuple[int, int]] | None = None) -> list[Part] | None:
    """The column ranges of a fully connected layer of batch one, or None when it stays on one thread:
    A [1, K], constant B [N, K] (``transB``), no ``transA`` (a bias: see ``_parts``). An A of several
    rows splits by rows (``split_rows.gemm_row_parts``)."""
    a = dict(key.attrs)
    if target.threads < 2 or rows is not None or a["transA"] or key.packed[1] != "const" or key.in_types[0].dtype is not DType.F32:
        return None
    if key.out_types[0].shape[0] != 1:
        return gemm_row_parts(key, target)
    if not a["transB"]:
        return None
    n, k = key.in_types[1].shape
    ranges = cost_model_ranges(target, n, target.vector_floats, n * k)
    return _parts(key, [(r, target) for r in ranges]) if ranges else None


def matmul_parts(key: KernelKey, target: Target, rows: list[tuple[int, int]] | None = None) -> list[Part] | None:
    """The column ranges of a float or int8 (QMatMul, with its bias) MatMul of one row by constant
    weights, A [1, K] by B [K, N], or None when it stays on one thread. Each output sums over K in
    order in one accumulator (float), or exactly (integers): any ranges give the same bits. A float
    MatMul of several rows splits by rows, one of two computed operands by heads (``split_rows``)."""
    if target.threads < 2 or (key.op == "MatMul" and key.in_types[0].dtype is not DType.F32):
        return None
    if key.op == "MatMul" and key.packed[1] != "const":
        return heads_parts(key, target, rows)
    if rows is not None:
        return None
    if key.op == "MatMul" and math.prod(key.in_types[0].shape[:-1]) > 1:
        return gemm_row_parts(key, target)
    if key.packed[1] != "const" or len(key.in_types[0].shape) != 2:
        return None
    if key.in_types[0].shape[0] != 1 or len(key.in_types[1].shape) != 2 or any(p != "const" for p in key.packed[2:]):
        return None
    k, n = key.in_types[1].shape
    ranges = cost_model_ranges(target, n, target.vector_floats, n * k)  # int32 sums: as many lanes as floats
    return _parts(key, [(r, target) for r in ranges]) if ranges else None


PER_CHANNEL_ATTRS = {"QConv": ("w_scale",), "QMatMul": ("b_scale",)}
"""op -> its attributes that hold one value per output channel (a part takes its range's values)."""
CHANNEL_AXIS = {"QMatMul": {1: 1}, "MatMul": {1: 1}}
"""op -> {input: the axis of its output channels} where that is not axis 0 (a MatMul's B is [K, N])."""


def _parts(key: KernelKey, ranges: list[tuple[tuple[int, int], Target]]) -> list[Part] | None:
    """Each output-channel range of the layer ``key`` as a layer of its own, compiled for its target:
    the slices of its constants, its input channels (whole groups) and its output's offset; None when
    an input is none of those (a constant neither per channel nor one value, a tensor computed at run
    time that is not shaped like the output)."""
    x_t, out_t = key.in_types[0], key.out_types[0]
    oc, cg = out_t.shape[1], key.in_types[1].shape[1]
    group = dict(key.attrs).get("group", 1)
    channel_axis = CHANNEL_AXIS.get(key.op, {})
    plane_out = math.prod(out_t.shape[2:]) * out_t.dtype.itemsize
    plane_in = math.prod(x_t.shape[2:]) * x_t.dtype.itemsize
    sliced = PER_CHANNEL_ATTRS.get(key.op, ())
    found = []
    for (lo, hi), sub_target in ranges:
        m = hi - lo
        sub_group = 1 if group == 1 else m // (oc // group)
        sub_c = x_t.shape[1] if group == 1 else sub_group * cg
        x_off = 0 if group == 1 else (lo // (oc // group)) * cg * plane_in
        attrs = tuple((k, sub_group if k == "group" else v[lo:hi] if k in sliced and len(v) == oc else v)
                      for k, v in key.attrs)
        ins, offs, axes = [], [], []
        for i, t in enumerate(key.in_types):
            axis = channel_axis.get(i, 0)
            axes.append(None)
            if i == 0:
                ins.append(TensorType(t.dtype, (1, sub_c, *t.shape[2:])))
                offs.append(x_off)
            elif key.packed[i] != "const" and tuple(t.shape) == tuple(out_t.shape):  # a residual: sliced as the output
                ins.append(TensorType(t.dtype, (1, m, *t.shape[2:])))
                offs.append(lo * plane_out)
            elif key.packed[i] == "const" and len(t.shape) > axis and t.shape[axis] == oc:  # weights, bias
                ins.append(TensorType(t.dtype, t.shape[:axis] + (m,) + t.shape[axis + 1:]))
                offs.append(0)
                axes[-1] = axis
            elif key.packed[i] == "const" and math.prod(t.shape) == 1:  # one value for every channel
                ins.append(t)
                offs.append(0)
            else:
                return None
        outs = (TensorType(out_t.dtype, (1, m, *out_t.shape[2:])),)
        sub = KernelKey(key.op, attrs, tuple(ins), outs, key.alias, key.scalars, key.packed)
        found.append(Part(sub, sub_target, tuple(offs), lo * plane_out, (lo, hi), tuple(axes)))
    return found


def _arithmetic(plan) -> tuple:
    """What decides the order a plan sums in, beyond its method and tile: a K-blocked packed panel
    stores partial sums between blocks (the direct 1x1 kernel packs only with enough row blocks)."""
    return (plan.pack_b, plan.panel_k if plan.pack_b else 0)


def _split(target: Target, plan, geom, unit: int, rows: list[tuple[int, int]]) -> list[Range] | None:
    n, c, hh, ww, oc, kh, kw, strides, pads, dilations, group = geom
    cg = c // group
    choice = choice_of(plan)
    found = []
    for lo, hi in rows:
        m = hi - lo
        sub_group = 1 if group == 1 else m // unit
        sub_c = c if group == 1 else sub_group * cg
        sub_geom = (n, sub_c, hh, ww, m, kh, kw, strides, pads, dilations, sub_group)
        sub_target = with_choices(target, {sub_geom: choice})
        sub_plan = conv_plan(sub_target, *sub_geom)
        if plan.pack_b and not sub_plan.pack_b:  # too few row blocks to pack alone: pack as the whole layer does
            sub_target = dataclasses.replace(sub_target, tuning=sub_target.tuning.replace(pack_min_row_blocks=0))
            sub_plan = conv_plan(sub_target, *sub_geom)
        if _arithmetic(sub_plan) != _arithmetic(plan):
            return None
        found.append(Range((lo, hi), sub_geom, sub_target))
    return found


CONVS = ("Conv", "FusedConv", "QConv")
"""Ops the conv splitters take (their weights: input 1, [O, I/group, *kernel])."""
POOLS = ("MaxPool", "AveragePool")
CHANNELWISE = (*POOLS, "Resize")
"""Ops whose every output channel reads only the same input channel (depthwise convs too; a Resize keeping axis 1)."""
ELEMENTWISE = tuple(sorted(op for op, d in OP_TABLE.items() if d.elementwise and not d.view))
"""Ops whose every output element reads only the same element of each operand (broadcast)."""
FOLLOWERS = CHANNELWISE + ELEMENTWISE + ROWWISE
"""Ops that split on their own only while the workers still spin (``jobs.own_jobs``) and may join the
job of the layer before them, range by range."""
SPLITTERS = {"Conv": conv_parts, "FusedConv": conv_parts, "QConv": qconv_parts, "Gemm": gemm_parts,
             "FusedGemm": gemm_parts, "MatMul": matmul_parts, "QMatMul": matmul_parts,
             **dict.fromkeys(POOLS, pool_parts), "Resize": resize_parts, **dict.fromkeys(ELEMENTWISE, elementwise_parts),
             **dict.fromkeys(ROWWISE, rowwise_parts)}
"""op -> how its layers split (ops not named here always run on one thread)."""
