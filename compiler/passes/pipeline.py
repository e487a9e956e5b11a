"""The pass pipeline: a visible tuple of pure ``Graph -> Graph`` functions, run in order.

Order matters: folding constants first exposes constant BN parameters, and identical constants it
made (or the exporter wrote) become one; simplify turns no-op
casts and expands into views before fusion looks at who reads what; BN folds into Conv/Gemm
before fusion so the fused kernels see one bias; QDQ patterns become integer ops before
float fusion could take their Conv/Gemm apart from the QuantizeLinear, and the weights no integer op
took are dequantized once, here, so the float passes see constants; ConvTranspose becomes Conv
before fusion so its activation fuses, and its kernel is cropped like any Conv's (crop_taps: taps
that read only padding); int8 convs of wide groups split into a conv a group once their weights
are integers (split_groups); dce last drops the weights folding and cropping replaced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..errors import VerifyError
from ..ir.graph import Graph
from ..ir.verify import verify
from .conv_transpose import conv_transpose
from .crop_taps import crop_taps
from .dce import dce
from .fold_batchnorm import fold_batchnorm
from .fold_constants import fold_constants, fold_dequantized_weights
from .fuse import fuse
from .fuse_qdq import fuse_qdq
from .rewrite import owned_constants
from .share_constants import share_constants
from .simplify import simplify
from .split_groups import split_groups

Pass = Callable[[Graph], Graph]
DEFAULT_PIPELINE: tuple[Pass, ...] = (fold_constants, share_constants, simplify, fold_batchnorm, fuse_qdq, fold_dequantized_weights,
                                     conv_transpose, crop_taps, split_groups, fuse, dce)


def optimize(graph: Graph, passes: Sequence[Pass] = DEFAULT_PIPELINE, verify_each: bool = False) -> Graph:
    """Run ``passes`` in order; with ``verify_each`` the verifier runs before and after every pass. The
    result owns its constants (:func:`.rewrite.owned_constants`): once the input graph goes, so do
    the buffers it was read from."""
    if verify_each:
        verify(graph)
    if not passes:
        return graph
    for p in passes:
        graph = p(graph)
        if verify_each:
            try:
                verify(graph)
            except VerifyError as e:
                raise VerifyError(f"after pass {p.__name__}: {e}") from None
    return owned_constants(graph)
