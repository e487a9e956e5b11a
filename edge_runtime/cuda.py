"""Run a model on an NVIDIA GPU through the CUDA driver API (ctypes to ``libcuda``), no toolkit needed.

The graph is lowered to NVPTX (``compiler.codegen.nvptx``), LLVM emits PTX, and the driver
JIT-compiles it for the GPU at hand (PTX for sm_87 runs on any newer GPU). The arena and the
weights live in device memory: weights are uploaded once, each run copies the inputs in, launches
every kernel of the plan on the default stream with pointer arguments prepared at load time,
synchronizes, and copies the outputs out. Without a driver, :class:`CudaUnavailable` says so.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Mapping

import numpy as np

from ..compiler.codegen.nvptx import GpuProgram, gpu_target, lower_ptx
from ..compiler.errors import CuvilError, InterpreterError, RunTimeCheckError
from ..compiler.ir.dtypes import clean_bools
from ..compiler.ir.graph import Graph
from ..compiler.target import Target, TargetKind
from . import jit

LIBCUDA_NAMES = ("libcuda.so.1", "libcuda.so", "libcuda.dylib", "nvcuda.dll")
_CU = ctypes.c_int  # CUresult
_PTR, _DEV = ctypes.c_void_p, ctypes.c_uint64  # opaque handles, CUdeviceptr
SIGNATURES = {
    "cuInit": (ctypes.c_uint,),
    "cuDeviceGetCount": (ctypes.POINTER(ctypes.c_int),),
    "cuDeviceGet": (ctypes.POINTER(ctypes.c_int), ctypes.c_int),
    "cuDeviceGetName": (ctypes.c_char_p, ctypes.c_int, ctypes.c_int),
    "cuDeviceGetAttribute": (ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int),
    "cuDevicePrimaryCtxRetain": (ctypes.POINTER(_PTR), ctypes.c_int),
    "cuDevicePrimaryCtxRelease_v2": (ctypes.c_int,),
    "cuCtxSetCurrent": (_PTR,),
    "cuCtxSynchronize": (),
    "cuModuleLoadDataEx": (ctypes.POINTER(_PTR), ctypes.c_char_p, ctypes.c_uint, ctypes.POINTER(ctypes.c_int),
                           ctypes.POINTER(_PTR)),
    "cuModuleGetFunction": (ctypes.POINTER(_PTR), _PTR, ctypes.c_char_p),
    "cuModuleUnload": (_PTR,),
    "cuMemAlloc_v2": (ctypes.POINTER(_DEV), ctypes.c_size_t),
    "cuMemFree_v2": (_DEV,),
    "cuMemsetD8_v2": (_DEV, ctypes.c_ubyte, ctypes.c_size_t),
    "cuMemcpyHtoD_v2": (_DEV, _PTR, ctypes.c_size_t),
    "cuMemcpyDtoH_v2": (_PTR, _DEV, ctypes.c_size_t),
    "cuLaunchKernel": (_PTR, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                       ctypes.c_uint, _PTR, ctypes.POINTER(_PTR), ctypes.POINTER(_PTR)),
    "cuGetErrorString": (_CU, ctypes.POINTER(ctypes.c_char_p)),
}
"""Every driver entry point used, with its argument types (all return CUresult)."""
CC_MAJOR, CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
JIT_ERROR_LOG, JIT_ERROR_LOG_SIZE = 5, 6  # CU_JIT_ERROR_LOG_BUFFER / _SIZE_BYTES
DEFAULT_PROFILE = "jetson-orin"


class CudaError(CuvilError):
    """A CUDA driver call failed (the message names the call and the driver's reason)."""


class CudaUnavailable(CudaError):
    """No CUDA driver (libcuda) or no GPU on this machine."""


class Driver:
    """The loaded ``libcuda`` with checked calls: ``drv.cuInit(0)`` raises CudaError on failure."""

    def __init__(self) -> None:
        self.lib = None
        for name in LIBCUDA_NAMES:
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if self.lib is None:
            raise CudaUnavailable("the NVIDIA driver library (libcuda) is not installed; GPU execution needs an "
                                  "NVIDIA GPU and its driver (the CUDA toolkit is not needed)")
        for fn, argtypes in SIGNATURES.items():
            f = getattr(self.lib, fn)
            f.argtypes, f.restype = list(argtypes), _CU

    def __getattr__(self, name: str):
        f = getattr(self.lib, name)

        def call(*args):
            rc = f(*args)
            if rc != 0:
                raise (CudaUnavailable if rc in (100, 35) else CudaError)(f"{name} failed: {self.error_string(rc)}")

        return call

    def error_string(self, rc: int) -> str:
        text = ctypes.c_char_p()
        if self.lib.cuGetErrorString(rc, ctypes.byref(text)) == 0 and text.value:
            return f"{text.value.decode()} (CUresult {rc})"
        return f"CUresult {rc}"


def gpu_target_for(profile: str | Target | None = None) -> Target:
    """The NVPTX target of a profile's GPU (default Jetson Orin, sm_87: PTX that any newer GPU runs)."""
    from ..devices import ProfileError, load_profile

    if isinstance(profile, Target):
        if profile.kind is TargetKind.GPU:
            return profile
        if profile.gpu_arch is None:
            raise CudaError(f"profile {profile.name!r} has no GPU")
        try:  # the profile file holds the GPU's PTX version
            return gpu_target_for(load_profile(profile.name).name)
        except ProfileError:
            return gpu_target(profile.name, profile.gpu_arch)
    p = load_profile(profile or DEFAULT_PROFILE)
    if p.gpu_arch is None:
        raise CudaError(f"profile {p.name!r} has no GPU")
    return gpu_target(p.name, p.gpu_arch, p.gpu_features or ("+ptx78",))


def gpu_available() -> bool:
    """True when a driver and at least one GPU are present (what GPU tests skip on)."""
    try:
        drv = Driver()
        drv.cuInit(0)
        n = ctypes.c_int()
        drv.cuDeviceGetCount(ctypes.byref(n))
        return n.value > 0
    except CudaError:
        return False


class CudaModel:
    """A graph compiled to PTX, loaded on GPU ``device`` with its arena and weights in device memory."""

    def __init__(self, graph: Graph, target: str | Target | None = None, batch: int = 1, device: int = 0):
        t0 = time.perf_counter()
        self.program: GpuProgram = lower_ptx(graph, gpu_target_for(target), batch)
        self.ptx = jit.emit_assembly(self.program.llvm_ir, self.program.target)
        self.compile_ms = (time.perf_counter() - t0) * 1e3
        self.drv = Driver()
        self.drv.cuInit(0)
        dev = ctypes.c_int()
        self.drv.cuDeviceGet(ctypes.byref(dev), device)
        self.device = dev.value
        self.ctx = _PTR()
        self.drv.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.device)
        self.drv.cuCtxSetCurrent(self.ctx)
        self._buffers: list[int] = []
        self.module = self._load_module()
        self.functions = {}
        for name in self.program.kernels:
            fn = _PTR()
            self.drv.cuModuleGetFunction(ctypes.byref(fn), self.module, name.encode())
            self.functions[name] = fn
        self.arena = self._alloc(self.program.arena_bytes)
        self.drv.cuMemsetD8_v2(self.arena, 0, self.program.arena_bytes)
        self.weights = self._alloc(max(len(self.program.weights), 64))
        if self.program.weights:  # uploaded once; every run reuses them
            host = np.frombuffer(self.program.weights, np.uint8)
            self.drv.cuMemcpyHtoD_v2(self.weights, host.ctypes.data, host.nbytes)
        self._launches = [self._prepare(launch) for launch in self.program.launches]
        self.load_ms = (time.perf_counter() - t0) * 1e3 - self.compile_ms

    @property
    def device_name(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self.drv.cuDeviceGetName(buf, 256, self.device)
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.drv.cuDeviceGetAttribute(ctypes.byref(major), CC_MAJOR, self.device)
        self.drv.cuDeviceGetAttribute(ctypes.byref(minor), CC_MINOR, self.device)
        return f"{buf.value.decode()} (sm_{major.value}{minor.value})"

    def _load_module(self) -> _PTR:
        log = ctypes.create_string_buffer(8192)
        opts = (ctypes.c_int * 2)(JIT_ERROR_LOG, JIT_ERROR_LOG_SIZE)
        vals = (_PTR * 2)(ctypes.cast(log, _PTR), _PTR(8192))
        module = _PTR()
        try:
            self.drv.cuModuleLoadDataEx(ctypes.byref(module), self.ptx.encode(), 2, opts, vals)
        except CudaError as e:
            raise CudaError(f"{e}: {log.value.decode(errors='replace').strip()}") from None
        return module

    def _alloc(self, nbytes: int) -> int:
        ptr = _DEV()
        self.drv.cuMemAlloc_v2(ctypes.byref(ptr), nbytes)
        self._buffers.append(ptr.value)
        return ptr.value

    def _prepare(self, launch):
        """Argument values and the void** array cuLaunchKernel reads, built once."""
        base = {"arena": self.arena, "weights": self.weights}
        values = [_DEV(base[a.space] + a.offset) for a in launch.args]
        params = (_PTR * len(values))(*[ctypes.cast(ctypes.byref(v), _PTR) for v in values])
        return self.functions[launch.kernel], launch.grid, launch.block, values, params

    def run_raw(self) -> None:
        """Every kernel of the plan on the current arena, then wait (what latency measures)."""
        for fn, grid, block, _values, params in self._launches:
            self.drv.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, None, params, None)
        self.drv.cuCtxSynchronize()

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        for spec in self.program.inputs:
            if spec.name not in inputs:
                names = [s.name for s in self.program.inputs]
                raise InterpreterError(f"missing input {spec.name!r}; the model takes {names}")
            x = clean_bools(np.ascontiguousarray(inputs[spec.name], dtype=spec.dtype.numpy))
            if x.shape != spec.shape:
                raise InterpreterError(f"input {spec.name!r} has shape {x.shape}, the model wants {spec.shape}")
            self.drv.cuMemcpyHtoD_v2(self.arena + spec.offset, x.ctypes.data, spec.nbytes)
        self.run_raw()
        self._check_fault()
        outputs = {}
        for spec in self.program.outputs:
            y = np.empty(spec.nbytes if spec.bounded else spec.shape, np.uint8 if spec.bounded else spec.dtype.numpy)
            self.drv.cuMemcpyDtoH_v2(y.ctypes.data, self.arena + spec.offset, spec.nbytes)
            outputs[spec.name] = spec.take(y) if spec.bounded else y  # bounded: its valid rows
        return outputs

    def _check_fault(self) -> None:
        """Raise (and clear the word) when a run-time check of the model refused its inputs."""
        at = self.program.fault_offset
        if at is None:
            return
        word = np.zeros(1, np.int32)
        self.drv.cuMemcpyDtoH_v2(word.ctypes.data, self.arena + at, 4)
        if word[0]:
            self.drv.cuMemsetD8_v2(self.arena + at, 0, 4)
            raise RunTimeCheckError()

    def latency_ms(self, iterations: int = 50, warmup: int = 5) -> list[float]:
        """Wall time of ``run_raw`` per iteration, after ``warmup`` runs."""
        for _ in range(warmup):
            self.run_raw()
        times = []
        for _ in range(iterations):
            t = time.perf_counter()
            self.run_raw()
            times.append((time.perf_counter() - t) * 1e3)
        return times

    def close(self) -> None:
        if getattr(self, "drv", None) is None:
            return
        for ptr in self._buffers:
            self.drv.cuMemFree_v2(ptr)
        self._buffers = []
        if getattr(self, "module", None):
            self.drv.cuModuleUnload(self.module)
            self.module = None
        self.drv.cuDevicePrimaryCtxRelease_v2(self.device)
        self.drv = None

    def __enter__(self) -> CudaModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
