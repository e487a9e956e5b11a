"""Tuning: the machine facts and measured choices code generation reads, as one frozen record.

Every value the emitters used to keep in module constants lives here, on the :class:`~.target.Target`,
so a profile (its ``[tuning]`` table), host detection or an autotuner can set it, tests build
targets instead of patching the compiler, and the compile-cache key (which hashes the target)
covers it. Defaults are the values measured on AMD Zen 3 (AVX2, one thread); a field's comment says
what it decides (512-bit choices: AMD Zen 4; where cores issue two 512-bit FMAs a cycle: Zen 5).
:func:`default_tuning` fills the ISA facts (registers, masked-store policy, ``FULL_RATE_512_CPUS``); an
on-device tuner adds measured conv choices beside it (``Target.conv_choices``).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

KIB = 1024


@dataclass(frozen=True)
class Tuning:
    """What code generation may tune per target. Sizes in bytes, widths in bits."""

    vector_registers: int = 16  # architectural vector registers (16 ymm, 32 zmm, 32 on AArch64)
    reserved_registers: int = 1  # left free by a GEMM tile: x86 FMAs read B from memory, AArch64 keeps it
    masked_stores: bool = True  # False: constant-mask tail stores go lane by lane (microcoded VMASKMOVPS, NEON)
    l1d_bytes: int = 32 * KIB
    l2_bytes: int = 512 * KIB
    l3_bytes: int = 0
    l2_budget_bytes: int = 768 * KIB  # weights up to this size stay cache resident across pixel tiles
    panel_bytes: int = 16 * KIB  # packed 1x1-conv B panel (K block x NV vectors): half of L1 (512 bits: PANEL_512)
    pack_min_row_blocks: int = 12  # fewer row blocks don't amortise the panel copy (MobileNetV2's 192->32)
    winograd_widths: tuple[int, ...] = (256, 512)  # vector widths where Winograd was measured to win (znver3, znver4)
    winograd_min_pixels: int = 64  # 512x4x4 (4 tiles): the 16/9x larger transformed weights dominate, 0.8x
    winograd_f4: int = 4  # large-tile m; F(4x4) errs up to ~2e-5 x max|output| per layer, 2 keeps F(2x2)
    winograd_f4_min_pixels: int = 196  # F(4x4) from 14x14 outputs up (0.57-0.61x F(2x2)'s time at 512 bits, 0.66-0.84x at 256, Zen 4; 12x12: 0.86-1.12x); at 8x8 (4 tiles) F(2x2) is 1.4x faster
    winograd_block_bytes: int = 1 << 20  # V + M of a block of tile rows, so both stay in L2 while the point GEMMs read them (Xeon, one 3x3 conv alone, 1 MiB against 4 MiB: 64x112x112 2.54 -> 2.02 ms, 64x56x56 0.63 -> 0.58, 128x56x56 2.04 -> 1.84; U-Net 0.504 -> 0.457 ms; 4 MiB was 1.25x faster than whole on 64x112x112)
    winograd_block_weight_ratio: float = 2.5  # but no more blocks than make every block's read of the weights U, together, this many times V + M's bytes: each block reads all of U (256x28x28, U 9.4 MB: 1 MiB blocks 3.30 ms, one block 1.79); 0: the budget is exact (a part of a layer split by rows)
    winograd_whole_l2s: float = 1.25  # a layer whose V + M take at most this many times the L2 stays one block (Xeon, 2 MiB L2: ASPP's rate-6 branch, V + M 2.3 MB and U 0.6 MB, made the model 2.7% slower in four 1 MiB blocks; 64x56x56, V + M 3.6 MB, ran 0.66 -> 0.60 ms in four)
    winograd_small_weights: int = 8  # unless its U is under 1/8 of V + M: then 1 MiB blocks cost nothing and gain (U-Net's 16-channel 64x64 convs, U 37 KB)
    split_min_reuse: int = 32  # a conv (one group) splits into output-channel parts only where each part does this many multiply-adds or more per input element (its channels x taps): every part reads the whole input, half of it from the other core's cache after a split layer (Xeon, MobileNetV2's 1x1 convs to 24 channels at 24x24, parts of 16 and 8: 2.1-2.5x slower split than whole)
    winograd_row_split_channels: int = 64  # a Winograd conv of at most this many output channels splits over threads by tile rows, not channels
    winograd_prefetch_bytes: int = 2048  # how far ahead the point GEMMs prefetch U (best of 1-8 KiB)
    direct_prefetch_bytes: int = 0  # direct / im2col conv tiles whose weights outgrow l2_budget_bytes prefetch their packed weight panel this far ahead; 0: none. x86 sets DIRECT_PREFETCH_BYTES
    direct_row_pad: float = 0.0  # a strided direct conv's phase-plane rows are padded to whole vectors where that adds at most this fraction (conv/layout.py ConvPlan.Wq); 0: never. x86 at 512 bits sets DIRECT_ROW_PAD
    direct_band_bytes: int = 256 * KIB  # a direct conv's zero-bordered phase copy is made this much at a time, band of output rows by band, and read by the tiles while it is still in L2 (ASPP's 32->64 3x3 stride-2 conv at 128x128, 2.1 MB copied whole: see conv/direct.py); 0: whole
    rows_widths: tuple[int, ...] = (256, 512)  # vector widths where the 'rows' conv was measured to win
    rows_kernels: tuple[int, ...] = (3,)  # square kernel sizes it applies to
    rows_min_channels: int = 16  # C and OC (ResNet-18's 64..512-channel 3x3 layers, then down to 16 on planes Winograd does not take, Zen 4, us rows / next best: x86-avx2 48->192 at 6x6 60 / 73, 24->96 at 6x6 15.8 / 19.2, 32->128 at 4x4 12.4 / 13.7, 16->16 at 6x6 2.1 / 2.6, but 16->24 at 7x7 5.7 / 4.8; x86-avx512 48->192 at 6x6 52 / 73, 64->16 at 7x7 7.0 / 14.7)
    rows_max_pixels: int = 64  # up to 8x8 outputs; 16x16 (a 64->128 stride-2 conv) only matched direct
    rows_whole_row_max: int = 0  # a 'rows' conv's tile takes its whole output row where that is at most this wide (else 4 pixels or more); 0: never. x86 at 512 bits sets ROWS_WHOLE_ROW_MAX
    rows_channel_block: int = 16  # channels per block: 13.8 KB of a 3-vector tile's 3x3 weights stay in L1
    rows_prefetch_blocks: int = 2  # how many blocks ahead the weights are prefetched (4: no better)
    rows_prefetch_locality: int = 2  # prefetcht1 (t0: no different)
    depthwise_lanes_max_ow: int = 10  # f32 depthwise 3x3 up to this output width keep channels in lanes (Zen 4, x86-avx512 vs rows in ymm: 64x25x5 0.94x, 960x7x7 0.6x, 160x10x10 0.8x, 576x14x14 1.5x; x86-avx2 64x25x5 0.4x)
    dwflat_max_vectors: int = 0  # f32 depthwise stride-1 convs read each channel's plane flat with masked tap loads (conv/dwflat.py) where at most this many of its output vectors are unrolled (the rest loop over row periods); 0: never (masked loads are scalarized on NEON). x86 sets DWFLAT_MAX_VECTORS
    dwflat_min_vectors: int = 3  # the cost model takes it from this many vectors' worth of output pixels and up to 3x3 kernels (Xeon Emerald Rapids, each conv alone: DWFLAT_MAX_VECTORS)
    tall_1x1_min_pixels: int = 0  # 1x1 convs over this many pixels or more take a tall tile (conv/rules.py TALL_MIN_ROWS x 1 vector); 0: never. TALL_1X1_MIN_PIXELS (not on FULL_RATE_512_CPUS)
    tall_1x1_min_channels: int = 64  # and with this many channels in and out (32 -> 64 at 64x64: 0.94-1.06x)
    tall_1x1_deep_min_pixels: int = 0  # deep 1x1 convs (tall_1x1_deep_channels in and out) take the tall tile from this many pixels; 0: never. TALL_1X1_DEEP_MIN_PIXELS
    tall_1x1_deep_channels: int = 256
    short_1x1_max_k: int = 0  # 1x1 convs over at most this many input channels and short_1x1_min_pixels or more take tiles of short_1x1_rows rows, wide along the pixels; 0: never. SHORT_1X1_MAX_K (FULL_RATE_512_CPUS: SHORT_1X1_MAX_K_FULL_RATE)
    short_1x1_min_pixels: int = 900  # measured from 30x30 up
    short_1x1_rows: int = 4  # 4x6 at 512 bits (3x7: 0.93-1.0 of the wide tile's time where 4x6 took 0.92-0.95)
    aliased_1x1_im2col_max_k: int = 0  # 1x1 convs over at most this many input channels whose channel planes lie a multiple of 4 KiB apart take im2col's packed panels, not direct; 0: never. ALIASED_1X1_MAX_K
    strided_im2col_max_vectors: int = 0  # ungrouped strided convs of more than one tap whose output rows take at most this many vectors, the last partial, go through im2col, not direct's phase copy; 0: never. STRIDED_IM2COL_MAX_VECTORS
    dwstride2_widths: tuple[int, ...] = (256, 512)  # stride-2 3x3 depthwise read in place (conv/dwstride2.py; Zen 4)
    half_width_depthwise_max_ow: int = 24  # 512-bit targets: depthwise convs up to this output width use ymm
    half_width_pool_max_ow: int = 7  # 512-bit targets: f32 pools up to this output width use ymm, rows a zmm would leave under half full and scalar (Xeon, SqueezeNet's 3x3/2 max pool of 256x13x13: 43 -> 12 us; 13-wide rows no faster)
    amx_min_rows: int = 16  # int8 matmuls of fewer rows keep to vpdpbusd where AMX is: a tile holds 16 rows, and at batch 1 the wide MLP's 1024x2048 layers ran 1.8x slower on tiles (Xeon Emerald Rapids)
    amx_min_depth: int = 96  # int8 convs whose GEMM sums fewer weight bytes per output (channels x taps) keep to vpdpbusd where AMX is: a tile row holds 64, and below it the accumulators' trip through memory to the epilogue costs more than the tile saves (Xeon Emerald Rapids, MobileNetV2's 1x1 convs: K 16 1.9x, K 24-32 1.4-1.7x slower on tiles, K 64 even, K 96 1.15x faster)
    int8_row_split_pixels_per_channel: int = 4  # an int8 conv on the im2col GEMM splits by output rows where it has this many output pixels per output channel (each part builds its rows' im2col), else by channels (each part reads half the weights). Xeon, ResNet-18 int8 at 2 threads on AMX: 64 channels at 32x32 (16 a channel) 0.8-1.3x -> 1.4-1.7x its 1-thread speed by rows; 128 at 16x16 (2) 1.3-1.4x by channels, 1.1x by rows
    int8_rows_max_pixels: int = 64  # int8 convs up to 8x8 outputs with channels in lanes and pixels broadcast (no padding products; Zen 4) (FULL_RATE_512_CPUS: INT8_ROWS_MAX_PIXELS_FULL_RATE)
    int8_rows_1x1_max_fill: float = 0.0  # and 1x1 int8 convs whose output pixels would fill at most this share of the im2col GEMM's pixel vectors (MobileNetV2's 3x3 planes: 9 pixels in 16 lanes); 0: never. x86 sets it by vector width (ROWS_1X1_MAX_FILL)
    int8_direct_min_width: int = 16  # VNNI int8 convs (kxk, a quad of channels or more) with output rows this wide or wider read their taps in place, output columns in lanes (quant_direct.py), rather than through an im2col; 0: never
    int8_direct_min_lane_use: float = 1.0  # and whose rows fill at least this share of their vectors' lanes (1: whole vectors; Zen 4, in place / im2col: 32- and 80-wide rows 0.84-0.92x, 40-wide (83%) 1.11x, 20-wide (62.5%) 1.46x)
    int8_dwrows_min_pixels: int = 9  # int8 depthwise by window-row quads above this many outputs (byte-quad targets; 3x3 planes keep channels in lanes)
    int8_depthwise_lanes_max_pixels: int = 64  # int8 depthwise with channels in lanes up to 8x8 outputs; larger planes stream rows (faster there, Zen 4)
    int8_depthwise_lanes_max_width: int = 0  # and, where the window-row quads cannot take it (no byte-quad dot product: AVX2, AVX-512 without VNNI; 5x5 windows), at stride 1 with outputs up to this wide; 0: never. x86 sets it by vector width (default_tuning)
    int8_depthwise_lanes_max_width_strided: int = 0  # the same at stride 2 and more; 0: never (x86: 32)
    int8_winograd_min_tiles: int = 16  # int8 3x3 convs on AVX2 int16 pairs take Winograd F(2x2,3x3) from 16 output tiles (8x8), checked before int8_rows_max_pixels (the packer tries Winograd first); fewer re-read 3.6x the weight bytes for little work
    int8_winograd_prefetch_blocks: int = 1  # int8 Winograd's GEMMs prefetch their weights' next column block (ResNet-18's 8x8 convs at x86-avx2, Zen 4: 1.15 -> 0.66-0.69 M cycles; 2 ahead 0.71-0.76, 4: 0.85; the other int8 GEMMs: none, it slowed the MLP's QMatMul 1.5x)
    int8_prefetch_weight_rows: bool = False  # int8 conv GEMMs (weights broadcast, MR rows a tile) prefetch the next tile's weight rows a line at a time: ResNet-50 int8's stage-4 convs at 4x4 read 1-2 MiB of weights a layer as MR short streams the hardware prefetcher follows late (Zen 4, interleaved, with / without: ResNet-50 int8 7.02 / 7.60 ms, 0.87 / 0.94x ORT; MobileNetV1 0.379 / 0.395, AlexNet-LRN 1.80 / 1.86, ResNeXt-tiny 9.63 / 9.85; x86-avx2 ResNet-50 15.7 / 16.7; the zoo even); x86 sets it, never timed on Arm
    int8_winograd_block_bytes: int = 128 * 1024  # int8 Winograd: a block of tiles' M, with its transformed input and the weights, within L2 (ResNet-18's 64-channel 32x32 convs at x86-avx2, Zen 4: 771 -> 713 k cycles)
    autotune: bool = True  # time conv candidates on the device at compile time (cuvil compile --tune)
    autotune_fraction: float = 0.5  # tuning may add at most this fraction of the untuned compile time
    autotune_budget_s: float = 2.0  # and never more than this many seconds
    autotune_max_work: float = 2.0  # candidates doing more than this many times the cost model's choice's multiplies are not timed (0: none pruned)
    max_threads: int = 8  # the default thread count: the device's cores, at most this many
    parallel_sync_us: float = 5.0  # handing a layer's parts to the workers and waiting for them; the tuner measures it (pool_probe)
    conv_macs_per_us: int = 100_000  # one core's conv speed the split model assumes (Zen 4: 480k on ResNet-18's, 57k on MobileNetV2's)
    gemm_macs_per_us: int = 50_000  # one core's speed on a GEMM by packed weights the split model assumes, rows by rows (Zen 4: 57k on the tiny transformer's 32x64 by 64x192 and smaller, and on ViT-tiny's 3.2M-multiply-add projections: near its FMA peak, where conv_macs_per_us counts Winograd's saved multiplies)
    pool_elements_per_us: int = 10_000  # one core's pooling speed the split model assumes, input elements per us (Zen 4, Tiny-YOLO's 2x2 max pools: 9.3k over 16x160x160, 14-17k over 32x80x80 and 64x40x40, 1.4k over 256x10x10, where each plane's start dominates)
    elementwise_elements_per_us: int = 10_000  # one core's elementwise speed the split model assumes, output elements per us (Zen 4: Add, Mul, Relu 11-14k; Sigmoid, Gelu, Erf 2.5-4k, which it underrates: they stay whole more often than they would pay)
    follower_awake_us: float = 20.0  # a pool, Resize or elementwise layer splits on its own (not only right after another job) while the serial layers since the last job come to at most this many us by the rates above: the workers still spin (pool_spin: ~300 us), where after longer ones they may sleep (seg_bilinear's 8x bilinear upsample after its 3-us 1x1 class conv, Zen 4: 0.77 -> 1.47-1.77x its 1-thread speed)
    parallel_sync_ratio: float = 2.0  # a part must be worth this many handoffs: min multiply-adds per part = ratio x sync x speed
    pool_pin: bool = True  # worker i runs only on the i-th CPU the process may use (the caller keeps the first); see docs/threads.md
    worker_watch_s: float = 10.0  # a split session times itself with and without its workers this often and keeps the faster way (0: never); the host may move its cores apart (edge_runtime/worker_watch.py)
    worker_watch_runs: int = 8  # the session's own runs timed each way, after one that settles the change
    pool_spin: int = 4096  # rounds a waiting worker or caller spins before it sleeps on a futex (~300 us of x86 pause on Zen 4: on quiet cores 256 rounds made ResNet-18 at 2 threads 1.57x faster than 1 thread instead of 1.84x, MobileNetV2 0.95x instead of 1.06x)

    def replace(self, **changes: Any) -> Tuning:
        return dataclasses.replace(self, **changes)


FIELDS: Mapping[str, type] = {f.name: f.type for f in dataclasses.fields(Tuning)}  # type: ignore[misc]

BOUNDS: Mapping[str, tuple[int, int]] = {
    "vector_registers": (8, 64), "reserved_registers": (0, 4), "winograd_f4": (2, 4), "rows_channel_block": (1, 4096),
    "rows_prefetch_locality": (0, 3), "rows_prefetch_blocks": (0, 64), "pack_min_row_blocks": (0, 1 << 20),
    "max_threads": (1, 64), "pool_elements_per_us": (1, 1 << 40), "gemm_macs_per_us": (1, 1 << 40), "elementwise_elements_per_us": (1, 1 << 40), "pool_spin": (0, 1 << 24), "worker_watch_runs": (1, 1000), "int8_winograd_prefetch_blocks": (0, 64),
}
"""Integer fields with a narrower range than 0..2^40 (code generation needs them there)."""
CHOICES: Mapping[str, tuple[int, ...]] = {"winograd_f4": (2, 4)}

_X86 = ("x86_64", "i686", "i386")
MICROCODED_MASKED_STORES = ("znver", "bdver", "btver")
"""CPU-name prefixes whose masked vector stores are microcoded (AMD: over 10 cycles each; measured
1.4x on small-image depthwise convs when stored lane by lane instead)."""


PANEL_512 = 32 * KIB
"""panel_bytes at 512 bits: a 2-zmm column tile takes 128 B a channel, so 16 KiB K-blocked MobileNetV1's
256-channel 8x8 1x1 convs into two panels; one whole 256-channel panel (or none: these planes don't alias)
ran 1.7% fewer cycles on each (Zen 4, x86-avx512 host; the model 1.3%, MobileNetV2 and ResNet-18 unchanged)."""


TALL_1X1_MIN_PIXELS = 3136
"""x86 512-bit: 1x1 convs over 56x56 pixels or more take a tall tile (each weight feeds one FMA, as a
{1to16} memory operand, and the pixels stream one vector at a time). Zen 4, x86-avx512, each conv alone
against the cost model's 11-14 x 2 tiles: 64->128 at 64x64 0.70-0.73x, 64->256 0.75-0.79x, 128->256
0.83-0.88x, 256->256 0.84-0.96x, 64->256 at 56x56 0.77-0.89x, 256->64 0.78-0.92x; at 48x48 0.96-1.02x
and at 32x32 0.91-1.05x, so smaller planes keep the wide tile (the tuner times both)."""


TALL_1X1_DEEP_MIN_PIXELS = 1024
"""x86 512-bit: 1x1 convs with 256 channels or more in and out take the tall tile from 32x32 pixels
(their weights, 0.5-1 MiB, stream past one pixel vector at a time). Zen 4, x86-avx512, each conv alone,
untuned, 7 interleaved rounds, time against the wide 14x2 tile: ResNeXt-tiny's 512->512 at 32x32
0.964-0.967, 256->512 at 32x32 0.950-0.951; at 16x16 (512->1024) 0.994-1.003, so not there; 64 channels
at 32x32 stay wide (TALL_1X1_MIN_PIXELS)."""


SHORT_1X1_MAX_K = 32
"""x86 512-bit: 1x1 convs over 32 input channels or fewer take 4-row tiles (4x6 at 512 bits) instead of the
cost model's 11-14 x 2. Zen 4, x86-avx512, each conv alone, untuned, 7-9 interleaved rounds, time
against 13x2 / 11x2: 16->32 at 64x64 0.80, 16->32 at 60x60 0.93, 32->64 at 32x32 0.84, 32->64 at 30x30
0.98, 32->64 at 64x64 0.90, 24->144 at 56x56 0.95, 16->96 at 112x112 0.89; over 64 channels no gain
(64->64 at 32x32 1.01, 64->128 and 128->128 at 16x16 1.00-1.05)."""


FULL_RATE_512_CPUS = ("znver5",)
"""CPU-name prefixes whose cores issue two 512-bit FMAs a cycle and were measured to lose with the tall 1x1 tile
(``TALL_1X1_MIN_PIXELS``): each of its FMAs loads its weight (a ``{1to16}`` operand), which Zen 4's one zmm FMA a
cycle leaves room for and two a cycle do not. There the same convs take short 4-row tiles (4x6: 10 loads to 24
FMAs, the wide 13x2 15 to 26) from ``Tuning.short_1x1_min_pixels`` up to ``SHORT_1X1_MAX_K_FULL_RATE`` channels
in. Zen 5 (EPYC, `znver5`, 233 GFLOP/s from zmm FMAs alone against 115 from ymm), each conv alone, us, tall /
wide / 4x6: 256->256 at 64x64 3,237 / 2,966 / 2,732, 64->128 at 64x64 397 / 326 / 310, 64->256 770 / 654,
128->256 1,586 / 1,331, 64->256 at 56x56 576 / 479, 256->64 at 56x56 531 / 455, 512->512 at 32x32 3,745 / 2,701 /
2,633, 256->512 at 32x32 1,594 / 1,261; at 32x32 and 30x30 4x6 / wide 0.91 (64->64) to 1.00 (256->64); at 16x16
and 24x24 even or slower (kept wide); 3x3 convs keep their tiles (4x6 1.04-1.11x on strided ones). ResNeXt-tiny,
interleaved (`tuning_ab.py`): 0.88x the tall tiles' time. The Xeon (Emerald Rapids, two zmm FMAs) kept the tall
tile, never timed against these: the tuner times both there. Their int8 convs keep channels in lanes only to 6x6
outputs (``INT8_ROWS_MAX_PIXELS_FULL_RATE``)."""
SHORT_1X1_MAX_K_FULL_RATE = 512  # the deepest 1x1 conv measured (512->512 at 32x32)
INT8_ROWS_MAX_PIXELS_FULL_RATE = 36
"""FULL_RATE_512_CPUS: int8 kxk convs keep channels in lanes (``Tuning.int8_rows_max_pixels``) up to 6x6 outputs,
not 8x8: there each pixel's broadcast feeds fewer ``vpdpbusd`` than the im2col GEMM's tiles, which two a cycle
outrun. Zen 5, each model against 64 (`int8_bench.py --against int8_rows_max_pixels=64`): ResNet-18 0.92-0.95x
its time (its 8x8 convs 99-101 us against 114-125, ORT 115-117; the stride-2 128->256 to 8x8 56 against 84-100,
ORT 64-67), ResNet-50 0.90-0.96x, VGG-small 0.97x. At 16 (4x4) Tiny-YOLO's 5x5 convs ran 87 us against 57 in
lanes (the model 1.00-1.06x), hence 36; 6x6 not measured; 7x7 (ResNet-18-ImageNet) 0.97-1.00x."""


ALIASED_1X1_MAX_K = 32
"""x86 256-bit: a 1x1 conv read in place with its planes a multiple of 4 KiB apart (32x32, 64x64 images)
loads the same L1 sets on every input channel of a direct tile. Zen 4, x86-avx2, each conv alone, direct /
im2col: over 8 to 32 input channels and 16 to 128 outputs at 32x32 and 64x64 im2col won all 24 shapes
(1.0-3.0x; MobileNetV1's 16->32 at 64x64 103 / 52 us, 32->64 at 32x32 82 / 44), at 56x56 and 112x112 direct
won 15 of 24; from 64 input channels direct wins or ties at every size. 512-bit tiles (short_1x1) do not
show it (16->32 at 64x64: 43 / 49)."""


PACK_MIN_ROW_BLOCKS_512 = 8
"""x86 512-bit: a 1x1 conv read in place whose planes alias (``ConvPlan.pack_b``) packs its column tiles from 8 row
blocks on, not 12. The tall tile (``TALL_1X1_MIN_PIXELS``) leaves ResNeXt-tiny's 256-output convs at 64x64 10 row
blocks, so each re-read its 256 channel lines, 16 KiB apart (the same L1 and few L2 sets), from L3. Xeon Emerald
Rapids, x86-avx512 host, each conv alone, us, unpacked / packed: 256->256 at 64x64 9,912 / 4,867 (ORT 5,835-6,567),
128->256 4,583 / 2,550, MobileNetV1's 16->32 at 64x64 (4x6, 8 row blocks) 49.4-50.7 / 45.5-47.1; at 5 row blocks
packing loses (ResNet-50's 256->64 at 32x32, 14x2: 327-335 / 386-403). On Zen 4 the same convs packed from 4 row
blocks read 0.97-1.03x: noise either way."""


STRIDED_IM2COL_MAX_VECTORS = 1
"""x86 512-bit: ungrouped strided convs of more than one tap whose output rows are one partial vector (under 16
wide) take im2col, not direct's phase copy, though the cost model's lane use differs by less than its 0.1. Xeon
Emerald Rapids, ResNet-18-ImageNet's 3x3 stride-2 64->128 conv to 14x14, in the model (profiled, two runs each
way): 248-257 us against direct's 338-410 (ORT 206-212); alone 218-304 against 252-291. Rows of one whole vector
(16 wide) measured both ways by the host's stretch: in a slow one im2col ran 5-27% faster in 6 of 8 shapes
(32->64 from 32x32 95 / 112 us), in a fast one direct 1-7% faster in 3 of 5 (32->64 66-67 / 71-72), so they keep
direct. 1x1 stride-2 convs keep direct (64->128, 128->256, 256->512 from 32x32: 29 / 32, 106 / 111, 424 / 441);
grouped convs not measured."""


ROWS_1X1_MAX_FILL = {256: 0.6, 512: 0.5}
"""x86, by vector bits: 1x1 int8 convs on planes that fill at most this share of the GEMM's pixel vectors run
transposed (output channels in lanes, pixels broadcast: no lane computes a missing pixel). Xeon Emerald Rapids,
each conv alone, fewest cycles transposed / GEMM over 320->320, 96->576 and 960->160 channels: at x86-avx2
(8 lanes) 2x2 0.63-0.78, 3x3 0.62-0.82 (56% full), 4x4 1.18-1.52 (full), 5x5 0.92-1.05 (78%), 6x6-8x8
1.03-1.30; at x86-avx512-vnni (16 lanes) 2x2 0.57-0.73 (25% full), 3x3 0.69-1.25, 4x4 and up 1.03-2.25."""


DWFLAT_MAX_VECTORS = 40
"""x86: f32 depthwise 3x3 stride-1 convs from 3 vectors' worth of output pixels read each plane flat
(``conv/dwflat.py``), where at most this many output vectors are unrolled (the rest loop over row periods). Xeon
Emerald Rapids, each conv alone, us, flat vs the cost model's method before: x86-avx512 64x25x5 2.04 vs 2.84
(dwlanes), 256x8x8 2.96 vs 3.70, 128x16x16 3.84 vs 11.07 (depthwise in ymm; in zmm 6.65), 192x12x12 5.56 vs 8.71,
144x24x24 15.1 vs 20.0, 32x48x48 11.9 vs 12.4, 16x64x64 10.8 vs 12.1, 96x56x56 60 vs 73, 32x112x112 89 vs 119, 64x32x32
and 144x28x28 even; x86-avx2 64x25x5 3.11 vs 3.79, 256x8x8 3.76 vs 5.16, 128x16x16 7.97 vs 10.24, 144x24x24 18.5 vs
23.6, 32x48x48 15.6 vs 21.5, 16x64x64 13.9 vs 21.4, 32x112x112 89 vs 149. Slower: one-vector planes (512x4x4 at 512
bits 2.55 vs 2.11, 960x3x3 4.09 vs 3.19), 4x4 at 256 bits (2.85 vs 2.66), 5x5 kernels (120x7x7 3.90 vs 3.24,
72x28x28 35.8 vs 23.4): those keep their methods."""
DW_LANES_MAX_WIDTH = {256: 14, 512: 5}
"""int8 depthwise at stride 1 with channels in lanes up to this output width where the window-row
quads cannot take it, by vector bits (Zen 4, k cycles, lanes vs row loops: at 256 bits 25x5 60 -> 22,
12x12 193 -> 54, 14x14 70 -> 24, but 16x16 68 vs 46 and 64x64 372 vs 89; at 512 bits without VNNI
25x5 30 -> 20, but 12x12 74 vs 49 and 14x14 27 vs 14). Zen 3, x86-avx2 host, MobileNetV2 int8 at 96x96, each
layer's fewest cycles in the model, lanes copied by channel groups (quant_depthwise.py): 192x12x12 58 k lanes, 67-87
by row loops; 144x24x24 129 k by row loops, 1.14x that by lanes)."""
DIRECT_PREFETCH_BYTES = 8 * KIB
"""x86: how far ahead a direct or im2col conv tile prefetches its weights where they outgrow the L2 budget
(ResNet-50's 1x1 convs at 8x8 and 4x4 stream 1-8 MB each from DRAM per inference; the hardware prefetcher
alone left them at ORT's speed or 10% over it). Xeon Emerald Rapids, ResNet-50 untuned, each against none
in the same process (`tuning_ab.py`): 4 KiB 0.94x (x86-avx2 0.92x), 8 KiB 0.94-0.95x, 16 KiB 0.96x (x86-avx2
0.98x); prefetching every direct conv's weights, not only these: ResNet-50 8 KiB 0.91-0.92x, 16 and 32 KiB
0.92x, and ASPP, ResNet-18, MobileNetV1 and V2, SqueezeNet, ResNeXt-tiny, the small CNN 0.98-1.02x, no gain
there. Never timed on Arm."""
DIRECT_ROW_PAD = 0.25
"""x86 at 512 bits: the most a strided direct conv's phase-plane rows grow when padded to whole vectors (Xeon
Emerald Rapids, the kernel against ORT in the same rounds, `micro_gemm_conv.py --conv`, two runs each:
32->64 3x3 stride 2 at 128x128, rows 65 -> 80, 0.93 and 1.20 -> 0.87 and 0.86; 64->128 at 128x128 0.96 and
1.03 -> 0.94 and 0.95; 3->32 at 256x256, 129 -> 144, 0.54 and 0.63 -> 0.54 and 0.53). 64x64 inputs, whose
33-element rows would grow to 48, were level either way, so they stay tight. At 256 bits (x86-avx2 code on
the same host) nothing moved: 0 there. Never timed on Arm."""
ROWS_WHOLE_ROW_MAX = 8
"""x86 at 512 bits: 'rows' convs whose output rows are at most this wide take a whole row per tile, not
4-pixel pieces of it (Xeon Emerald Rapids, each conv alone, medians of 400 interleaved runs, two runs:
128->256 stride 2 at 8x8 out, 4x6 -> 8x2 431 -> 369 and 291 -> 263 us; 256->256 at 7x7 4x6 -> 7x2 554 -> 431
and 365 -> 326; 48->192 at 6x6 4x6 -> 6x2 50.2 -> 41.1; whole rows with 3 or 4 vectors were as fast or
slightly slower). At 256 bits (x86-avx2 code on the same host) the whole rows were slower (8x8: 4x3 708,
8x1 757; 7x7: 4x3 738, 7x1 833): 0 there. Never timed on Arm."""
DW_LANES_MAX_WIDTH_STRIDED = 32
"""The same at stride 2 (Zen 4, both widths: 24x24 from 48x48 178 -> 114 and 155 -> 130 k cycles,
12x12 from 24x24 220 -> 53, 16x16 from 32x32 100 -> 39 at 512 bits; 28x28 from 56x56 0.95-1.1x). Zen 3, x86-avx2
host, as above: 96 channels 24x24 from 48x48 111 k lanes, 1.62x that by row loops (1.19x before the lanes copied by
channel groups)."""


def default_tuning(triple: str, cpu: str, vector_bits: int | None) -> Tuning:
    """The ISA facts of a target, other fields at their defaults."""
    x86 = triple.startswith(_X86)
    x512 = x86 and vector_bits == 512
    full_rate = x512 and cpu.startswith(FULL_RATE_512_CPUS)
    tall = x512 and not full_rate
    return Tuning(
        tall_1x1_min_pixels=TALL_1X1_MIN_PIXELS if tall else 0,
        tall_1x1_deep_min_pixels=TALL_1X1_DEEP_MIN_PIXELS if tall else 0,
        short_1x1_max_k=SHORT_1X1_MAX_K_FULL_RATE if full_rate else SHORT_1X1_MAX_K if x512 else 0,
        vector_registers=(32 if vector_bits == 512 else 16) if x86 else 32,
        panel_bytes=PANEL_512 if vector_bits == 512 else Tuning.panel_bytes,
        pack_min_row_blocks=PACK_MIN_ROW_BLOCKS_512 if x512 else Tuning.pack_min_row_blocks,
        strided_im2col_max_vectors=STRIDED_IM2COL_MAX_VECTORS if x512 else 0,
        reserved_registers=1 if x86 else 2,
        masked_stores=triple.startswith("x86_64") and not cpu.startswith(MICROCODED_MASKED_STORES),
        int8_depthwise_lanes_max_width=(DW_LANES_MAX_WIDTH.get(vector_bits, 0) if x86 else 0),
        aliased_1x1_im2col_max_k=ALIASED_1X1_MAX_K if x86 and vector_bits == 256 else 0,
        dwflat_max_vectors=DWFLAT_MAX_VECTORS if x86 else 0,
        int8_prefetch_weight_rows=x86,
        direct_prefetch_bytes=DIRECT_PREFETCH_BYTES if x86 else 0,
        direct_row_pad=DIRECT_ROW_PAD if x512 else 0.0,
        rows_whole_row_max=ROWS_WHOLE_ROW_MAX if x512 else 0,
        int8_depthwise_lanes_max_width_strided=DW_LANES_MAX_WIDTH_STRIDED if x86 else 0,
        int8_rows_1x1_max_fill=ROWS_1X1_MAX_FILL.get(vector_bits, 0.0) if x86 else 0.0,
        int8_rows_max_pixels=INT8_ROWS_MAX_PIXELS_FULL_RATE if full_rate else Tuning.int8_rows_max_pixels,
    )


def check_overrides(values: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a ``[tuning]`` table: known fields, right types, sizes not negative; ValueError names the field."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        kind = FIELDS.get(key)
        if kind is None:
            raise ValueError(f"unknown tuning field {key!r} (known: {', '.join(FIELDS)})")
        if kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"tuning field {key!r} must be true or false")
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 3600:
                raise ValueError(f"tuning field {key!r} must be a number from 0 to 3600")
            value = float(value)
        elif kind == "int":
            lo, hi = BOUNDS.get(key, (0, 1 << 40))
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"tuning field {key!r} must be a whole number from {lo} to {hi}")
            if key in CHOICES and value not in CHOICES[key]:
                raise ValueError(f"tuning field {key!r} must be one of {', '.join(map(str, CHOICES[key]))}")
        else:  # tuple of ints
            if not isinstance(value, (list, tuple)) or len(value) > 16 or not all(
                    isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 4096 for v in value):
                raise ValueError(f"tuning field {key!r} must be a list of up to 16 whole numbers from 1 to 4096")
            value = tuple(value)
        out[key] = value
    return out


def parse_override(text: str) -> dict[str, Any]:
    """One ``FIELD=VALUE`` of a command line (``int8_direct_min_width=0``, ``winograd_widths=[256]``), checked."""
    field, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"a tuning override is FIELD=VALUE, got {text!r}")
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise ValueError(f"tuning field {field!r}: {value!r} is not a Python literal") from None
    return check_overrides({field.strip(): parsed})


def parse_overrides(texts: Iterable[str]) -> dict[str, Any]:
    """Several ``FIELD=VALUE`` of a command line, each as :func:`parse_override` (a later one of a field wins)."""
    return {k: v for text in texts for k, v in parse_override(text).items()}
