"""Kernel emitters by op family; importing this package fills :data:`KERNELS`."""

from . import conv, elementwise, gathers, linalg, norm, pool, quant, quant_elementwise, quant_matmul, reduce, resize, shape  # noqa: F401  (each registers its kernels)
from .base import KERNELS, KernelContext, KernelDef, KernelKey, kernel

__all__ = ["KERNELS", "KernelContext", "KernelDef", "KernelKey", "kernel"]
