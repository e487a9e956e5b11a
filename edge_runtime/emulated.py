"""Emulated devices: compile a graph for a foreign profile exactly as the device would, link it into
the qemu harness of :mod:`cuvil.devices.emulation` once, and run many examples per qemu process.

Lives in the edge runtime (not in ``devices``) because it needs the native compiler (``jit``) and
imports point one way: ``compiler <- devices <- edge_runtime``. The linked executable is cached on
disk under the compile cache, keyed like compiled objects (graph content + target + batch +
compiler fingerprint) plus the harness version.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..compiler.codegen.lower import lower
from ..compiler.ir.graph import Graph
from ..compiler.target import Target
from ..devices.emulation import HARNESS_VERSION, emulation_banner, link_harness, run_harness, toolchain_for
from . import jit
from .cache import cache_key, default_dir, graph_digest


def _resolve(target: str | Target) -> Target:
    if isinstance(target, Target):
        return target
    from ..devices import resolve_target

    return resolve_target(target)


class EmulatedModel:
    """A graph compiled and linked once for ``target``; :meth:`run` many times, at any SVE length.

    ``content_hash`` (a bundle's hash) saves hashing the weights again for the cache key.
    """

    def __init__(self, graph: Graph, target: str | Target, batch: int = 1, *,
                 cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
                 content_hash: str | None = None, workdir: str | os.PathLike | None = None):
        self.target = _resolve(target)
        toolchain_for(self.target)  # fail before compiling when the architecture cannot be emulated
        self.batch = batch
        self.workdir = workdir
        self.lowered = lower(graph, self.target, batch)
        self._tmp: tempfile.TemporaryDirectory | None = None
        if use_cache:
            key = cache_key(f"{content_hash or graph_digest(graph)} emulated harness {HARNESS_VERSION}",
                            self.target, batch)
            self.dir = Path(cache_dir) if cache_dir is not None else default_dir()
            self.dir = self.dir / "emulated" / key
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="cuvil-harness-", dir=workdir)
            self.dir = Path(self._tmp.name) / "build"
        self.cache_hit = (self.dir / "harness").is_file() and (self.dir / "weights.bin").is_file()
        if not self.cache_hit:
            self._build()

    @property
    def executable(self) -> Path:
        return self.dir / "harness"

    @property
    def object_code(self) -> bytes:
        return (self.dir / "model.o").read_bytes()

    def _build(self) -> None:
        """Compile and link into a fresh directory, then publish it with one atomic rename."""
        obj = jit.emit_object(self.lowered.llvm_ir, self.target)
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".build-", dir=self.dir.parent))
        try:
            link_harness(self.lowered, obj, staging)
            try:
                os.rename(staging, self.dir)
            except OSError:  # another process published the same key first: use theirs
                if not (self.dir / "harness").is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def banner(self, sve_vector_bits: int | None = None) -> str:
        return emulation_banner(self.target, sve_vector_bits)

    def run(self, inputs: Sequence[Mapping[str, np.ndarray]], sve_vector_bits: int | None = None,
            timeout: float | None = 1800.0) -> list[dict[str, np.ndarray]]:
        """Outputs for every example (each a mapping of the compiled input shapes), in order."""
        return run_harness(self.executable, self.lowered, list(inputs), sve_vector_bits=sve_vector_bits,
                           workdir=self.workdir, timeout=timeout)

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def emulate(graph: Graph, target_or_profile: str | Target, inputs: Sequence[Mapping[str, np.ndarray]],
            batch: int = 1, sve_vector_bits: int | None = None, workdir: str | os.PathLike | None = None,
            cache_dir: str | os.PathLike | None = None) -> list[dict[str, np.ndarray]]:
    """Run ``inputs`` through ``graph`` as the device ``target_or_profile`` would, under qemu."""
    model = EmulatedModel(graph, target_or_profile, batch, cache_dir=cache_dir, workdir=workdir)
    return model.run(inputs, sve_vector_bits)
