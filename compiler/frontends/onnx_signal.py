"""ONNX DFT and STFT. DFT is one MatMul with a constant matrix: the transform is linear in the signal's real and
imaginary parts along its axis, so the matrix's rows are NumPy's own transform (``np.fft``, the
reference's) of each basis signal; dft_length's truncation or zero padding, onesided and the
inverse's 1/n and Hermitian symmetry come with it. The axis is moved next to the complex dim,
(axis, complex) flattened, multiplied, and laid back. Shapes must be static.

ONNX's two inverse cases expect single-precision FFT noise (1e-7) where the exact result is 0 and
so fail at its absolute tolerance, as any accurate result would.
"""

from __future__ import annotations

import numpy as np

from .builder import Unsupported
from .onnx_node import NodeCtx, OnnxImportError
from .onnx_ops import check_size, translates


def dft_matrix(n: int, parts: int, length: int, inverse: bool, onesided: bool) -> np.ndarray:
    """(n * parts, k * parts_out): row t * parts + q holds the transform of the signal that is 1
    (q = 0) or i (q = 1) at t, as real then imaginary parts of each output position."""
    basis = [np.eye(n), 1j * np.eye(n)][:parts]
    if inverse and onesided:
        rows = [np.fft.irfft(e, n=length, axis=1)[..., None] for e in basis]
    else:
        rows = [(np.fft.ifft if inverse else np.fft.fft)(e, n=length, axis=1) for e in basis]
        if onesided:
            rows = [r[:, :length // 2 + 1] for r in rows]
        rows = [np.stack([r.real, r.imag], axis=-1) for r in rows]
    m = np.stack(rows, axis=1)  # (n, parts, k, parts_out)
    return m.reshape(n * parts, -1)


@translates(DFT=(17, 20))
def _dft(ctx: NodeCtx) -> list:
    t = ctx.type(0)
    shape, rank = t.shape, t.rank
    if not t.dtype.is_float:
        raise Unsupported(f"DFT of {t.dtype.value}")
    if not all(isinstance(d, int) for d in shape):
        ctx.batch_dependent("DFT's shape")
    axis = ctx.attr("axis", 1) if ctx.opset < 20 else int(ctx.scalar(2, -2))
    if rank < 3 or shape[-1] not in (1, 2) or not -rank <= axis < rank or axis % rank == rank - 1:
        raise OnnxImportError(f"node {ctx.name!r} (DFT): input {t} needs rank >= 3, a last dim of 1 or 2 and a "
                              f"signal axis before it, not {axis}")
    axis %= rank
    inverse, onesided = ctx.attr("inverse", 0), ctx.attr("onesided", 0)
    n, parts = shape[axis], shape[-1]
    length = int(ctx.scalar(1, 2 * (n - 1) if inverse and onesided else n))
    if length < 1:
        raise OnnxImportError(f"node {ctx.name!r} (DFT): dft_length {length} must be >= 1")
    check_size(ctx, [n * parts, length * 2])
    m = dft_matrix(n, parts, length, bool(inverse), bool(onesided))
    others = [d for d in range(rank - 1) if d != axis]
    perm = others + [axis, rank - 1]
    moved = ctx.tmp("Transpose", [ctx.x(0)], "moved", perm=perm)
    flat = ctx.tmp("Reshape", [moved], "flat", shape=[shape[d] for d in others] + [n * parts])
    w = ctx.constant(m.astype(t.dtype.numpy), f"{ctx.name}/dft")
    y = ctx.tmp("MatMul", [flat, w], "matmul")
    parts_out = 1 if inverse and onesided else 2
    y = ctx.tmp("Reshape", [y], "unflat", shape=[shape[d] for d in others] + [m.shape[1] // parts_out, parts_out])
    return [ctx.emit("Transpose", [y], perm=[int(i) for i in np.argsort(perm)])]


@translates(STFT=(17,))
def _stft(ctx: NodeCtx) -> list:
    """The frames gathered (a constant index table), times the window, then each frame's DFT as
    above; frame_step and frame_length must be constants, the window may be computed."""
    t = ctx.type(0)
    if not t.dtype.is_float:
        raise Unsupported(f"STFT of {t.dtype.value}")
    if t.rank != 3 or not all(isinstance(d, int) for d in t.shape) or t.shape[-1] not in (1, 2):
        raise OnnxImportError(f"node {ctx.name!r} (STFT): signal {t} must be static [batch, length, 1 or 2]")
    batch, n, parts = t.shape
    step = int(ctx.scalar(1, 0))
    width = ctx.type(2).shape[0] if ctx.has(2) else int(ctx.scalar(3, 0))
    if ctx.has(2) and ctx.has(3) and int(ctx.scalar(3, 0)) != width:
        raise OnnxImportError(f"node {ctx.name!r} (STFT): frame_length differs from the window's length {width}")
    if step < 1 or not isinstance(width, int) or not 1 <= width <= n:
        raise OnnxImportError(f"node {ctx.name!r} (STFT): frame_step {step} and frame length {width} do not fit {n}")
    frames = (n - width) // step + 1
    check_size(ctx, [frames, width, parts, 2])
    at = np.arange(frames)[:, None] * step + np.arange(width)[None, :]
    x = ctx.tmp("Gather", [ctx.x(0), ctx.constant(at.astype(np.int64), f"{ctx.name}/frames")], "frames", axis=1)
    if ctx.has(2):
        x = ctx.tmp("Mul", [x, ctx.tmp("Reshape", [ctx.x(2)], "window", shape=[1, 1, width, 1])], "windowed")
    x = ctx.tmp("Reshape", [x], "flat", shape=[batch, frames, width * parts])
    m = dft_matrix(width, parts, width, False, bool(ctx.attr("onesided", 1)))
    y = ctx.tmp("MatMul", [x, ctx.constant(m.astype(t.dtype.numpy), f"{ctx.name}/dft")], "matmul")
    return [ctx.emit("Reshape", [y], shape=[batch, frames, m.shape[1] // 2, 2])]
