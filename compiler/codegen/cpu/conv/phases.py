"""Which images a Winograd conv transforms: the input itself, or a dilated conv's phase planes.

Why apart from :mod:`.plan`: the phase-plane geometry is shared by the plan (scratch, cost model),
the packer and the dilated conv's code (:mod:`.dilated`), and is pure arithmetic on shapes.
"""

from __future__ import annotations

from typing import NamedTuple

from ....tuning import Tuning


def phase_plane(H: int, W: int, pads, dilations) -> tuple[int, int, tuple[int, int, int, int]] | None:
    """(H, W, pads) of the phase planes of a conv dilated d in both axes ("space to batch", as atrous
    convs are run elsewhere): output pixel (oh, ow) reads only input pixels of its phase (oh % d, ow % d),
    so plane X[ph::d, pw::d], zero-filled to ceil(H/d) x ceil(W/d), is an undilated conv with pads / d;
    d = 1 gives the input's own. None where d differs between the axes or does not divide the pads."""
    d = dilations[0]
    if dilations[1] != d or any(p % d for p in pads):
        return None
    return -(-H // d), -(-W // d), tuple(p // d for p in pads)


class WinogradImages(NamedTuple):
    """The images (``count`` per input image, H x W, ``pads``) a Winograd conv transforms. Dilated d:
    the d x d phase planes (``plane``: H x W, pads / d), a batch of d*d images, or tiled into one image
    ``pitch`` rows and columns apart (zero rows and columns between them: the planes' own padding)."""

    count: int
    H: int
    W: int
    pads: tuple[int, int, int, int]
    d: int = 1
    plane: tuple[int, int] = (0, 0)
    pitch: tuple[int, int] = (0, 0)  # (0, 0): a batch of planes

    def origin(self, ph: int, pw: int) -> tuple[int, int, int]:
        """(image, row, column) where phase plane (ph, pw) starts."""
        if self.pitch == (0, 0):
            return ph * self.d + pw, 0, 0
        return 0, ph * self.pitch[0], pw * self.pitch[1]


def winograd_images(H: int, W: int, pads, dilations, t: Tuning) -> WinogradImages | None:
    """The images a 3x3 stride-1 conv's Winograd transforms: the input itself; a dilated conv's phase
    planes (:func:`phase_plane`) as a batch where each takes F(4x4) (``winograd_f4_min_pixels``); else
    tiled into one d x d image, max(pads / d) zero rows and columns between planes, whose tiles fill
    vectors where small planes' do not (ASPP on Zen 4, 64 channels at 32x32: rate 4's 8x8 planes as one
    35x35 image 313 us against 417 as a batch, rate 6's 6x6 as 41x41 460 us against 676 direct)."""
    d = dilations[0]
    sub = phase_plane(H, W, pads, dilations)
    if sub is None:
        return None
    Hs, Ws, sp = sub
    if d == 1:
        return WinogradImages(1, H, W, tuple(pads))
    if (Hs + sp[0] + sp[2] - 2) * (Ws + sp[1] + sp[3] - 2) >= t.winograd_f4_min_pixels:
        return WinogradImages(d * d, Hs, Ws, sp, d, (Hs, Ws))
    gap = max(sp)
    return WinogradImages(1, d * Hs + (d - 1) * gap, d * Ws + (d - 1) * gap, sp, d, (Hs, Ws), (Hs + gap, Ws + gap))
