"""On-disk cache of compiled object files, safe under concurrent processes.

Key: sha256 over the graph's content (or a bundle hash), the target, the batch size and the
compiler's fingerprint (versions plus the code generator's own sources, so a changed emitter never
loads stale code). Writes go to a temporary file in the same directory and are published with
``os.replace``, which is atomic: a reader sees either no entry or a complete one.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np

from ..compiler.ir.graph import Graph
from ..compiler.ir.text import print_graph
from ..compiler.target import Target

CODEGEN_VERSION = "1"


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cuvil"


@functools.lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """Versions plus the bytes of every compiler source and the JIT driver."""
    import llvmlite

    try:
        cuvil_version = metadata.version("cuvil")
    except metadata.PackageNotFoundError:
        cuvil_version = "unknown"
    h = hashlib.sha256(f"cuvil {cuvil_version} codegen {CODEGEN_VERSION} llvmlite {llvmlite.__version__}".encode())
    root = Path(__file__).resolve().parent.parent / "compiler"
    for path in sorted(root.rglob("*.py")) + [Path(__file__).with_name("jit.py")]:
        h.update(str(path.relative_to(root.parent)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def graph_digest(graph: Graph) -> str:
    """sha256 of the graph's canonical text form plus every weight's raw bytes (no copies)."""
    h = hashlib.sha256(print_graph(graph, data=False).encode())
    for name, arr in graph.constants.items():
        h.update(f"{name} {arr.dtype.str} {arr.shape}".encode())
        h.update(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def pack_objects(objs: list[bytes]) -> bytes:
    """Several object files as one cache payload: a count, then (length, bytes) each."""
    return len(objs).to_bytes(4, "little") + b"".join(len(o).to_bytes(8, "little") + o for o in objs)


def unpack_objects(data: bytes) -> list[bytes]:
    count, pos, out = int.from_bytes(data[:4], "little"), 4, []
    for _ in range(count):
        n = int.from_bytes(data[pos:pos + 8], "little")
        out.append(data[pos + 8:pos + 8 + n])
        pos += 8 + n
    return out


def cache_key(content: str, target: Target, batch: int) -> str:
    parts = [content, repr(target), str(batch), compiler_fingerprint()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


MAGIC = b"CUVILOBJ1\n"


class CompileCache:
    """A directory of ``<key>.o`` files: a magic line, the sha256 of the object, the object.

    An entry that fails its checksum (truncated by a full disk, bit rot, tampering by an
    unprivileged process) is treated as a miss and replaced, never loaded.
    """

    def __init__(self, directory: str | os.PathLike | None = None):
        self.dir = Path(directory) if directory is not None else default_dir()

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.o"

    def get(self, key: str) -> bytes | None:
        try:
            raw = self.path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        head, digest, obj = raw[:len(MAGIC)], raw[len(MAGIC):len(MAGIC) + 32], raw[len(MAGIC) + 32:]
        if head != MAGIC or hashlib.sha256(obj).digest() != digest:
            return None
        return obj

    def put(self, key: str, data: bytes) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + hashlib.sha256(data).digest() + data)
            os.replace(tmp, self.path(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
