"""Emulated devices: compile a graph for a foreign profile exactly as the device would, link it into
the qemu harness of :mod:`cuvil.devices.emulation` once, and run many examples per qemu process.

Lives in the edge runtime (not in ``devices``) because it needs the native compiler (``jit``) and
imports point one way: ``compiler <- devices <- edge_runtime``. The linked harness, its object file
and the packed weights are cached as one sealed file (:mod:`.sealed`) under the compile cache,
keyed like compiled objects (graph content + target + batch + compiler fingerprint) plus the
harness version. A damaged, replaced or swapped entry fails its MAC and is rebuilt. qemu never
runs what sits in the cache: the checked bytes are written into a private 0700 directory of this
model, and that copy runs.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..compiler.codegen.lower import lower
from ..compiler.ir.graph import Graph
from ..compiler.target import Target
from ..devices.emulation import HARNESS_VERSION, emulation_banner, link_harness, run_harness, toolchain_for
from . import jit
from .cache import cache_key, device_sealer, graph_digest
from .cache_settings import default_dir
from .private import private_dir
from .sealed import Sealer, SealError

log = logging.getLogger(__name__)
FORMAT = "cuvil emulated harness 1"
SUFFIX = ".cuvil-emu"
_FILES = ("harness", "model.o")  # the sealed body, in order; weights.bin is the tail


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
        self._tmp: tempfile.TemporaryDirectory | None = tempfile.TemporaryDirectory(prefix="cuvil-harness-",
                                                                                     dir=workdir)
        self.dir = Path(self._tmp.name)  # mkdtemp: 0700, this user's only
        sealer = device_sealer() if use_cache else None
        key = cache_key(f"{content_hash or graph_digest(graph)} emulated harness {HARNESS_VERSION}", self.target, batch)
        entry = (Path(cache_dir) if cache_dir is not None else default_dir()) / "emulated" / f"{key}{SUFFIX}"
        self.cache_hit = sealer is not None and self._install_cached(sealer, entry, key)
        if not self.cache_hit:
            link_harness(self.lowered, jit.emit_object(self.lowered.llvm_ir, self.target), self.dir)
            if sealer is not None:
                self._store(sealer, entry, key)

    @property
    def executable(self) -> Path:
        return self.dir / "harness"

    @property
    def object_code(self) -> bytes:
        return (self.dir / "model.o").read_bytes()

    def _install_cached(self, sealer: Sealer, entry: Path, key: str) -> bool:
        """Check the cached entry, then write its checked bytes into this model's private directory."""
        try:
            opened = sealer.read(entry, key)
            meta = json.loads(opened.meta)
            lengths = [int(n) for n in meta["lengths"]]
            if meta.get("format") != FORMAT or len(lengths) != len(_FILES) or min(lengths) < 0 \
                    or sum(lengths) != len(opened.body) or len(opened.tail) != len(self.lowered.weights):
                raise SealError("entry does not match this model")
        except FileNotFoundError:
            return False
        except (OSError, SealError, ValueError, KeyError, TypeError) as e:
            log.warning("emulated-device cache entry %s is unusable, building again: %s", entry, e)
            return False
        pos = 0
        for name, n in zip(_FILES, lengths):
            _write_private(self.dir / name, opened.body[pos:pos + n], 0o700 if name == "harness" else 0o600)
            pos += n
        _write_private(self.dir / "weights.bin", opened.tail.tobytes(), 0o600)
        return True

    def _store(self, sealer: Sealer, entry: Path, key: str) -> None:
        files = [(self.dir / name).read_bytes() for name in _FILES]
        meta = json.dumps({"format": FORMAT, "lengths": [len(f) for f in files]}).encode()
        try:
            private_dir(entry.parent)
            sealer.write(entry, key, meta, files, self.lowered.weights)
        except (OSError, SealError) as e:
            log.warning("could not write emulated-device cache entry %s: %s", entry, e)

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


def _write_private(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def emulate(graph: Graph, target_or_profile: str | Target, inputs: Sequence[Mapping[str, np.ndarray]],
            batch: int = 1, sve_vector_bits: int | None = None, workdir: str | os.PathLike | None = None,
            cache_dir: str | os.PathLike | None = None) -> list[dict[str, np.ndarray]]:
    """Run ``inputs`` through ``graph`` as the device ``target_or_profile`` would, under qemu."""
    model = EmulatedModel(graph, target_or_profile, batch, cache_dir=cache_dir, workdir=workdir)
    try:
        return model.run(inputs, sve_vector_bits)
    finally:
        model.close()
