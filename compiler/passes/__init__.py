"""Target-free graph passes: each a pure ``Graph -> Graph`` function, one concept per module."""

from .conv_transpose import conv_transpose
from .crop_taps import crop_taps
from .dce import dce
from .fold_batchnorm import fold_batchnorm
from .fold_constants import fold_constants, fold_dequantized_weights
from .fuse import fuse
from .fuse_qdq import fuse_qdq
from .pipeline import DEFAULT_PIPELINE, optimize
from .share_constants import share_constants
from .simplify import simplify
from .split_groups import split_groups

__all__ = ["DEFAULT_PIPELINE", "conv_transpose", "crop_taps", "dce", "fold_batchnorm", "fold_constants", "fold_dequantized_weights", "fuse", "fuse_qdq", "optimize", "share_constants", "simplify", "split_groups"]
