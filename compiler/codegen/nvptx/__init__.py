"""NVPTX (NVIDIA GPU, Jetson) lowering: one ``ptx_kernel`` per op, grid-stride loops, a launch plan."""

from .module import Arg, GpuProgram, Launch, gpu_target, lower_ptx

__all__ = ["Arg", "GpuProgram", "Launch", "gpu_target", "lower_ptx"]
