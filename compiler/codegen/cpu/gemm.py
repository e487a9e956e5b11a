"""Register-blocked GEMM for a Target: C[M,N] = act(A[M,K] @ B + bias (+ residual)), B pre-packed.

Pure ``llvmlite.ir``. The micro-kernel keeps an MR x NV tile of C in vector registers (VL =
``target.vector_floats`` lanes each), broadcasts one A element per row and loads one B vector per
column block every k step, then adds bias and residual and applies the activation in registers
before one store per vector. ``conv/direct.py`` reuses :func:`emit_tile` and :func:`tile_grid` with the
packed weights as A and pixel vectors as B.

``emit_gemm(module, name, target, M, N, K, *, a_layout="row", b_layout="packed", bias=None,
residual=False, activation="none", act_alpha=0.0, act_beta=0.0) -> ir.Function`` defines::

    void name(float* noalias A, float* noalias Bpacked, float* noalias bias_or_null,
              float* residual_or_null, float* C, float* noalias scratch_unused)

* A: ``a_layout="row"``: [M, K] row-major; ``"col"``: stored [K, M] (ONNX transA=1).
* Bpacked: ``tiles.pack_gemm_b(W, target)`` (alpha and transB are folded in there); with
  ``b_layout="row"`` instead a plain row-major [K, N] B (an activation, as in attention's MatMul);
  ``"wide"``: ``tiles.pack_gemv_b``, panels as wide as a GEMV's (M = 1) tile, read as one stream each.
* bias: None (pass null), ``"n"`` [N], ``"m"`` [M], ``"mn"`` [M, N] (fold beta and any scalar or
  other broadcast into this array at pack time).
* residual: [M, N] when ``residual=True`` (else pass null). C: [M, N]. Order: acc + bias +
  residual, then activation (as FusedGemm). C must not alias A, B or bias; it may alias residual
  (each element of residual is read before the same element of C is written).
* activation: a key of ``ops.fused.ACTIVATIONS`` (the FusedGemm names), or ``"none"``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llvmlite import ir

from ...digest import short_hex
from ...target import Target
from ..activations import apply_activation
from ..irhelpers import F32, I8P, I64, for_range, i64, prefetch, vector
from ..mathfns import fma
from .tiles import gemm_tile
from .vecops import F32P, broadcast, define_kernel, lane_mask, load_vec, store_vec, vec_type
from ..irhelpers import gep

LOOPED_EPILOGUE = frozenset({"Sigmoid", "Tanh", "SiLU", "Gelu", "GeluTanh"})  # long polynomial bodies
UNROLL = 4  # k steps per loop iteration when a step is a single k (GEMM, im2col, 1x1 conv)


# --- the micro-kernel -----------------------------------------------------------------------------
@dataclass(frozen=True)
class KPlan:
    """The k walk: ``n_outer`` loop iterations of the unrolled ``body`` steps (a_off, b_off), the
    bases advancing by (a_step, b_step) per iteration, then the ``rem`` steps (absolute offsets).

    With ``taps`` (conv), each outer iteration instead runs an inner loop over the B offsets in
    ``taps`` (a constant table), A advancing by ``a_tap`` per tap: one tap of IR instead of KH*KW
    unrolled copies keeps compile time down at no measurable run-time cost.
    """

    n_outer: int
    a_step: int
    b_step: int
    body: tuple[tuple[int, int], ...]
    rem: tuple[tuple[int, int], ...] = ()
    taps: tuple[int, ...] = ()
    a_tap: int = 0
    a_prefetch: int = 0  # bytes: each outer iteration prefetches the A it will read this far ahead (0: none)

    @staticmethod
    def linear(K: int, a_k: int, b_k: int, unroll: int = UNROLL) -> KPlan:
        n = K // unroll
        body = tuple((u * a_k, u * b_k) for u in range(unroll)) if n else ()
        rem = tuple(((n * unroll + u) * a_k, (n * unroll + u) * b_k) for u in range(K % unroll))
        return KPlan(n, unroll * a_k, unroll * b_k, body, rem)


@dataclass
class Out:
    """Where the tile's rows go and what the epilogue adds: element (r, v) lives at
    ``c + r*ldc + c_offs[v]`` (same for residual and 'full' bias), masked by ``masks[v]``."""

    c: ir.Value
    ldc: int
    c_offs: Sequence[ir.Value]
    masks: Sequence[ir.Value | None]
    bias: str | None = None  # None | "row" (bias[r]) | "col" (bias[c_off]) | "full"
    bias_ptr: ir.Value | None = None  # already offset to row 0 of the tile
    residual: ir.Value | None = None  # already offset to row 0 of the tile
    activation: str = "none"
    act_alpha: float = 0.0
    act_beta: float = 0.0
    lane_stride: int = 0  # transposed: lane l of vector v is element (c_offs[v] + l) * lane_stride
    lanes: Sequence[int] = ()  # transposed: valid lanes per vector (all when empty)
    scalar_tails: bool = False  # constant-mask stores as scalar stores (Tuning.masked_stores off)


def emit_tile(b: ir.IRBuilder, vl: int, mr: int, a_ptr: ir.Value, a_rs: int, b_ptrs: Sequence[ir.Value],
              kp: KPlan, out: Out, b_masks: Sequence[ir.Value | None] | None = None) -> None:
    """acc[r][v] = sum_k A[r*a_rs + a(k)] * B_v[b(k) : b(k)+vl]; then the epilogue and stores.
    ``b_masks[v]`` masks the B loads of vector v (unpacked B whose last vector ends mid-row)."""
    nv = len(b_ptrs)
    b_masks = b_masks or [None] * nv
    zero = vector(vec_type(vl), None)  # zeroinitializer: short IR text, fast to print and parse
    acc = [[zero] * nv for _ in range(mr)]

    def step(acc, a_base, b_bases, a_off, b_off):
        bv = [load_vec(b, gep(b, bb, b_off), vl, m) for bb, m in zip(b_bases, b_masks)]
        new = []
        for r in range(mr):
            a = broadcast(b, b.load(gep(b, a_base, r * a_rs + a_off), align=4), vl)
            new.append([fma(b, a, bv[v], acc[r][v]) for v in range(nv)])
        return new

    if kp.n_outer and kp.taps:
        table = tap_table(b.module, kp.taps)

        def per_channel(c, acc):
            a_c = b.gep(a_ptr, [b.mul(c, i64(kp.a_step))], inbounds=True)
            _prefetch_ahead(b, a_c, kp)
            b_c = [b.gep(bb, [b.mul(c, i64(kp.b_step))], inbounds=True) for bb in b_ptrs]

            def per_tap(t, acc):
                off = b.load(b.gep(table, [i64(0), t], inbounds=True))
                a_t = b.gep(a_c, [b.mul(t, i64(kp.a_tap))], inbounds=True)
                return step(acc, a_t, [b.gep(bb, [off], inbounds=True) for bb in b_c], 0, 0)
            return acc_loop(b, len(kp.taps), acc, per_tap, "tap")
        acc = acc_loop(b, kp.n_outer, acc, per_channel, "kc")
    elif kp.n_outer:
        def per_iter(i, acc):
            a_base = b.gep(a_ptr, [b.mul(i, i64(kp.a_step))], inbounds=True)
            b_bases = [b.gep(bb, [b.mul(i, i64(kp.b_step))], inbounds=True) for bb in b_ptrs]
            _prefetch_ahead(b, a_base, kp)
            for a_off, b_off in kp.body:
                acc = step(acc, a_base, b_bases, a_off, b_off)
            return acc
        acc = acc_loop(b, kp.n_outer, acc, per_iter, "k")
    for a_off, b_off in kp.rem:
        acc = step(acc, a_ptr, b_ptrs, a_off, b_off)
    epilogue(b, vl, acc, out)


def _prefetch_ahead(b: ir.IRBuilder, a: ir.Value, kp: KPlan) -> None:
    """Prefetch the lines of one outer iteration's A, ``kp.a_prefetch`` bytes ahead of ``a``."""
    if kp.a_prefetch:
        for off in range(0, max(4 * kp.a_step, 64), 64):
            prefetch(b, b.gep(b.bitcast(a, I8P), [i64(kp.a_prefetch + off)]), 3)


def acc_loop(b: ir.IRBuilder, count: int, acc, body, name: str):
    """A do-while loop of ``count`` (>= 1) iterations carrying the accumulators in phis."""
    pre = b.block
    loop = b.append_basic_block(f"{name}.loop")
    after = b.append_basic_block(f"{name}.end")
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(I64, name)
    i.add_incoming(i64(0), pre)
    phis = [[b.phi(x.type) for x in row] for row in acc]
    for prow, row in zip(phis, acc):
        for ph, x in zip(prow, row):
            ph.add_incoming(x, pre)
    cur = body(i, phis)
    nxt = b.add(i, i64(1))
    end = b.block
    i.add_incoming(nxt, end)
    for prow, row in zip(phis, cur):
        for ph, x in zip(prow, row):
            ph.add_incoming(x, end)
    b.cbranch(b.icmp_unsigned("<", nxt, i64(count)), loop, after)
    b.position_at_end(after)
    return cur


def tap_table(module: ir.Module, taps: Sequence[int]) -> ir.GlobalVariable:
    """A private constant i64 array of tap offsets, shared by every kernel that needs the same one."""
    name = "cuvil.taps." + short_hex(repr(tuple(taps)), 16)
    if name in module.globals:
        return module.globals[name]
    ty = ir.ArrayType(I64, len(taps))
    g = ir.GlobalVariable(module, ty, name)
    g.initializer = ir.Constant(ty, [i64(t) for t in taps])
    g.global_constant = True
    g.linkage = "private"
    g.unnamed_addr = True
    return g


def epilogue(b: ir.IRBuilder, vl: int, acc, out: Out) -> None:
    """bias, residual, activation in registers; one (masked) store per vector. With a costly
    activation a multi-row tile spills its accumulators and runs the epilogue as a loop over rows:
    one copy of the polynomial per vector column instead of per accumulator (measured: 2.6x less
    compile time for SiLU; the two extra L1 accesses per vector vanish next to the polynomial)."""
    if out.lane_stride:
        return _transposed_epilogue(b, vl, acc, out)
    mr, nv = len(acc), len(acc[0])
    if mr < 2 or out.activation not in LOOPED_EPILOGUE:
        for r, row in enumerate(acc):
            for v, x in enumerate(row):
                _epilogue_vec(b, vl, x, out, i64(r), v)
        return
    tmp = _stack_tile(b, mr * nv * vl)
    for r, row in enumerate(acc):
        for v, x in enumerate(row):
            store_vec(b, x, gep(b, tmp, (r * nv + v) * vl))
    with for_range(b, mr, name="er") as r:
        src = b.gep(tmp, [b.mul(r, i64(nv * vl))], inbounds=True)
        for v in range(nv):
            _epilogue_vec(b, vl, load_vec(b, gep(b, src, v * vl), vl), out, r, v)


def _epilogue_vec(b: ir.IRBuilder, vl: int, x: ir.Value, out: Out, r: ir.Value, v: int) -> None:
    off = b.add(b.mul(r, i64(out.ldc)), out.c_offs[v])
    mask = out.masks[v]
    if out.bias == "row":
        x = b.fadd(x, broadcast(b, b.load(b.gep(out.bias_ptr, [r], inbounds=True), align=4), vl))
    elif out.bias == "col":
        x = b.fadd(x, load_vec(b, gep(b, out.bias_ptr, out.c_offs[v]), vl, mask))
    elif out.bias == "full":
        x = b.fadd(x, load_vec(b, gep(b, out.bias_ptr, off), vl, mask))
    if out.residual is not None:
        x = b.fadd(x, load_vec(b, gep(b, out.residual, off), vl, mask))
    x = apply_activation(b, x, out.activation, out.act_alpha, out.act_beta)
    store_vec(b, x, gep(b, out.c, off), mask, out.scalar_tails)


def _stack_tile(b: ir.IRBuilder, nfloats: int) -> ir.Value:
    """A float[nfloats] stack buffer allocated in the entry block (never inside a loop)."""
    here = b.block
    b.position_at_start(b.function.entry_basic_block)
    tmp = b.alloca(ir.ArrayType(F32, nfloats))
    b.position_at_end(here)
    return b.bitcast(tmp, F32P)


def _transposed_epilogue(b: ir.IRBuilder, vl: int, acc, out: Out) -> None:
    """Row r, lane l of vector v goes to ``c + r*ldc + (c_offs[v] + l) * lane_stride`` (NCHW output of
    a GEMM whose vectors run along channels). Bias (per lane) and, without a residual, the
    activation are applied to the vectors; they are spilled to a stack tile, and a loop over lanes
    writes each lane's MR contiguous outputs (adding the residual and activating one by one):
    compact code, where unrolled extracts cost seconds of compile time."""
    mr, nv, ls = len(acc), len(acc[0]), out.lane_stride
    tmp = _stack_tile(b, mr * nv * vl)
    lanes = out.lanes or [vl] * nv
    for v in range(nv):
        n = lanes[v]
        bias = None
        if out.bias == "col":
            bias = load_vec(b, gep(b, out.bias_ptr, out.c_offs[v]), vl, lane_mask(vl, n) if n < vl else None)
        for r in range(mr):
            x = acc[r][v] if bias is None else b.fadd(acc[r][v], bias)
            if out.residual is None:
                x = apply_activation(b, x, out.activation, out.act_alpha, out.act_beta)
            store_vec(b, x, gep(b, tmp, (v * mr + r) * vl))
    for v in range(nv):
        with for_range(b, lanes[v], name="lane") as lane:
            col = b.mul(b.add(out.c_offs[v], lane), i64(ls))
            src = b.gep(tmp, [b.add(lane, i64(v * mr * vl))], inbounds=True)
            c_col, r_col = gep(b, out.c, col), gep(b, out.residual, col) if out.residual is not None else None
            for r in range(mr):
                x = b.load(gep(b, src, r * vl), align=4)
                if r_col is not None:
                    x = b.fadd(x, b.load(gep(b, r_col, r * out.ldc), align=4))
                    x = apply_activation(b, x, out.activation, out.act_alpha, out.act_beta)
                b.store(x, gep(b, c_col, r * out.ldc), align=4)


SlotFn = Callable[[ir.IRBuilder, ir.Value, bool], tuple[ir.Value, ir.Value, ir.Value | None]]
TileFn = Callable[[ir.IRBuilder, ir.Value, int, list], None]


def tile_grid(b: ir.IRBuilder, rows: int, mr: int, n_slots: int, partial: bool, nv: int,
              slot_fn: SlotFn, tile_fn: TileFn, rows_outer: bool = False, s_base: ir.Value | None = None) -> None:
    """Loop over column tiles of ``nv`` slots and row blocks of ``mr``, one micro-kernel per tile.

    ``n_slots`` whole slots, then one ``partial`` slot (always in the last, tail, tile so its mask
    is a constant). ``slot_fn(b, s, is_partial) -> (b_ptr, c_off, mask)`` describes slot s;
    ``tile_fn(b, row0, mr_eff, slots)`` emits one micro-kernel. Columns outer (default) keeps a B
    column tile in L1 across all row blocks (A re-read from L2); ``rows_outer`` keeps an MR x K
    block of A hot instead, for when A is too big for L2 but B is not. Slots count from ``s_base``.
    """
    full_tiles, tail = divmod(n_slots, nv)
    full_rb, rt = divmod(rows, mr)

    def slots_of(s0: ir.Value, count: int, with_partial: bool) -> list:
        if s_base is not None:
            s0 = b.add(s_base, s0)
        slots = [slot_fn(b, b.add(s0, i64(v)), False) for v in range(count)]
        if with_partial:
            slots.append(slot_fn(b, b.add(s0, i64(count)), True))
        return slots

    def columns(emit_one) -> None:
        if full_tiles:
            with for_range(b, full_tiles, name="ct") as jt:
                emit_one(b.mul(jt, i64(nv)), nv, False)
        if tail or partial:
            emit_one(i64(full_tiles * nv), tail, partial)

    def row_blocks(emit_one) -> None:
        if full_rb:
            with for_range(b, full_rb, name="rb") as ib:
                emit_one(b.mul(ib, i64(mr)), mr)
        if rt:
            emit_one(i64(full_rb * mr), rt)

    if rows_outer:
        def per_row_block(row0, m):
            columns(lambda s0, n, pt: tile_fn(b, row0, m, slots_of(s0, n, pt)))
        row_blocks(per_row_block)
    else:
        def per_column_tile(s0, n, pt):
            slots = slots_of(s0, n, pt)  # pointers computed once, reused by every row block
            row_blocks(lambda row0, m: tile_fn(b, row0, m, slots))
        columns(per_column_tile)


# --- GEMM -----------------------------------------------------------------------------------------
def emit_gemm(module: ir.Module, name: str, target: Target, M: int, N: int, K: int, *, a_layout: str = "row",
              b_layout: str = "packed", bias: str | None = None, residual: bool = False, activation: str = "none",
              act_alpha: float = 0.0, act_beta: float = 0.0) -> ir.Function:
    """Define ``name`` in ``module`` (signature in the module docstring) and return it."""
    if a_layout not in ("row", "col"):
        raise ValueError(f"emit_gemm: a_layout must be 'row' or 'col', got {a_layout!r}")
    if b_layout not in ("packed", "row", "wide"):
        raise ValueError(f"emit_gemm: b_layout must be 'packed', 'row' or 'wide', got {b_layout!r}")
    if bias not in (None, "n", "m", "mn"):
        raise ValueError(f"emit_gemm: bias must be None, 'n', 'm' or 'mn', got {bias!r}")
    vl = target.vector_floats
    mr, nv = gemm_tile(target, M, N, wide=b_layout == "wide")
    fn = define_kernel(module, name, target)
    A, Bp, bias_p, res_p, C, _ = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    a_rs, a_k = (K, 1) if a_layout == "row" else (1, M)
    kp = KPlan.linear(K, a_k, vl if b_layout == "packed" else N)

    def slot_fn(b, s, is_partial):
        mask = lane_mask(vl, N % vl) if is_partial else None
        col = b.mul(s, i64(vl))
        if b_layout == "wide":  # panel s // nv (K rows of nv vectors, the last narrower), vector s % nv of its row
            tile, v = b.udiv(s, i64(nv)), b.urem(s, i64(nv))
            return gep(b, Bp, b.add(b.mul(tile, i64(nv * K * vl)), b.mul(v, i64(vl)))), col, mask
        return gep(b, Bp, b.mul(s, i64(K * vl)) if b_layout == "packed" else col), col, mask

    def tile_fn(b, row0, mr_eff, slots):
        a_ptr = gep(b, A, b.mul(row0, i64(a_rs)))
        crow = b.mul(row0, i64(N))
        out = Out(gep(b, C, crow), N, [s[1] for s in slots], [s[2] for s in slots], activation=activation,
                  act_alpha=act_alpha, act_beta=act_beta, scalar_tails=not target.tuning.masked_stores)
        if bias:
            out.bias = {"n": "col", "m": "row", "mn": "full"}[bias]
            out.bias_ptr = {"n": bias_p, "m": gep(b, bias_p, row0), "mn": gep(b, bias_p, crow)}[bias]
        if residual:
            out.residual = gep(b, res_p, crow)
        kp_t = KPlan.linear(K, a_k, len(slots) * vl) if b_layout == "wide" else kp  # a panel row: the tile's vectors
        emit_tile(b, vl, mr_eff, a_ptr, a_rs, [s[0] for s in slots], kp_t, out, out.masks if b_layout == "row" else None)

    a_bytes, b_bytes, n_slots = 4 * M * K, 4 * K * N, N // vl
    budget = target.tuning.l2_budget_bytes
    chunk = max(nv, budget // (4 * max(K, 1) * vl) // nv * nv)  # B slots per L2-resident chunk
    if a_bytes > budget and b_bytes > budget and n_slots > chunk:
        n_chunks, rest = divmod(n_slots, chunk)  # both big: N chunks of B stay in L2, rows outer
        with for_range(b, n_chunks, name="nc") as c:
            tile_grid(b, M, mr, chunk, False, nv, slot_fn, tile_fn, True, b.mul(c, i64(chunk)))
        if rest or N % vl:
            tile_grid(b, M, mr, rest, N % vl != 0, nv, slot_fn, tile_fn, True, i64(n_chunks * chunk))
    else:
        rows_outer = a_bytes > budget >= b_bytes
        tile_grid(b, M, mr, n_slots, N % vl != 0, nv, slot_fn, tile_fn, rows_outer)
    b.ret_void()
    return fn
