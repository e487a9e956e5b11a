"""The complete compiled artifact as one cache file, so a cache hit never lowers again.

Layout (little endian)::

    MAGIC | sha256(meta) (32 B) | len(meta) (u64) | meta (JSON) | object files | pad | weights | pad

The weights start on a page boundary, so they can be mapped straight from the file with no copy
(a page-aligned mapping is 64-byte aligned, as the kernels assume), and the weight region is padded
to whole pages. ``meta`` holds everything the Session needs: entry symbol, arena bytes, IO specs,
the memory plan, counts, and per region its offset, length and checksum. The object files get a
sha256 (they are small and are executed); the weights, megabytes read on every warm start, get a
position-sensitive 64-bit sum that numpy computes at memory speed (sha256 of ResNet-18's 44 MB
costs ~48 ms, crc32 ~19 ms, this ~3 ms). Checksums are against accidents (a full disk, a crash,
bit rot), not an attacker: whoever can write the cache directory can write code that runs.
JSON, not pickle, so reading an entry never executes anything.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np

from ..compiler.codegen.lower import IOSpec, LoweredModel
from ..compiler.ir.dtypes import DType
from ..compiler.memory.plan import MemoryPlan
from ..compiler.target import Target

MAGIC = b"CUVILART1\n"
PAGE = 4096
_HEAD = len(MAGIC) + 32 + 8
_BLOCK_WORDS = PAGE // 8
MAX_META_BYTES = 64 << 20


class ArtifactError(ValueError):
    """The entry is truncated, garbled or of another format: the caller treats it as a miss."""


@dataclass(frozen=True)
class Artifact:
    lowered: LoweredModel  # llvm_ir and weights empty: the weights are the array below
    objects: list[bytes]
    weights: np.ndarray  # uint8, read-only, 64-byte aligned (a view of a page-aligned mapping)


def weights_checksum(block: np.ndarray) -> str:
    """Wrapping sums of the 64-bit words, plain and weighted by 4 KiB block index (Fletcher-like).

    ``block`` is uint8 with a length that is a multiple of a page. Catches any single bit flip,
    zeroed or garbage regions, and moved blocks; it is no cryptographic hash (see the module doc).
    """
    if not len(block):
        return "0:0"
    sums = block.view(np.uint64).reshape(-1, _BLOCK_WORDS).sum(axis=1, dtype=np.uint64)
    weighted = int(np.dot(sums, np.arange(1, len(sums) + 1, dtype=np.uint64)))
    return f"{int(sums.sum(dtype=np.uint64)):x}:{weighted & (2**64 - 1):x}"


def _pad(n: int) -> int:
    return -n % PAGE


def _spec_json(s: IOSpec) -> list:
    return [s.name, s.offset, s.dtype.value, list(s.shape)]


def _spec(v: list) -> IOSpec:
    return IOSpec(str(v[0]), int(v[1]), DType(v[2]), tuple(int(d) for d in v[3]))


def _meta(lw: LoweredModel) -> dict:
    p = lw.plan
    return {
        "entry": lw.entry, "arena_bytes": lw.arena_bytes, "batch": lw.batch,
        "inputs": [_spec_json(s) for s in lw.inputs], "outputs": [_spec_json(s) for s in lw.outputs],
        "kernel_count": lw.kernel_count, "node_count": lw.node_count,
        "profile_offset": lw.profile_offset, "profile_nodes": list(lw.profile_nodes),
        "plan": {"batch": p.batch, "offsets": dict(p.offsets), "sizes": dict(p.sizes), "arena_bytes": p.arena_bytes,
                 "lower_bound": p.lower_bound, "naive_bytes": p.naive_bytes, "alignment": p.alignment,
                 "aliases": dict(p.aliases)},
    }


def _lowered(meta: dict, target: Target) -> LoweredModel:
    p = meta["plan"]
    plan = MemoryPlan(int(p["batch"]), p["offsets"], p["sizes"], int(p["arena_bytes"]), int(p["lower_bound"]),
                      int(p["naive_bytes"]), int(p["alignment"]), p["aliases"])
    return LoweredModel(
        llvm_ir="", entry=str(meta["entry"]), weights=b"", plan=plan, arena_bytes=int(meta["arena_bytes"]),
        inputs=tuple(map(_spec, meta["inputs"])), outputs=tuple(map(_spec, meta["outputs"])),
        kernel_count=int(meta["kernel_count"]), target=target, batch=int(meta["batch"]),
        node_count=int(meta["node_count"]), profile_offset=meta["profile_offset"],
        profile_nodes=tuple(meta["profile_nodes"]))


def write_artifact(f, lowered: LoweredModel, objects: list[bytes]) -> None:
    """Write the whole entry to the open binary file ``f`` (the cache publishes it atomically)."""
    weights = np.frombuffer(lowered.weights, dtype=np.uint8)
    region = np.zeros(len(weights) + _pad(len(weights)), dtype=np.uint8)
    region[:len(weights)] = weights
    meta = _meta(lowered)
    # The offsets depend on the meta's length, which holds them: size the meta with wide
    # placeholders first, then fill the real numbers in (the second text is never longer).
    meta["objects"] = [[2**62, len(o), hashlib.sha256(o).hexdigest()] for o in objects]
    meta["weights"] = [2**62, len(weights), weights_checksum(region)]
    meta["file_bytes"] = 2**62
    width = len(json.dumps(meta, separators=(",", ":")).encode())
    pos = _HEAD + width
    for entry in meta["objects"]:
        entry[0], pos = pos, pos + entry[1]
    pos += _pad(pos)
    meta["weights"][0] = pos
    meta["file_bytes"] = pos + len(region)
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (width - len(text))  # JSON allows trailing whitespace
    f.write(MAGIC + hashlib.sha256(text).digest() + len(text).to_bytes(8, "little") + text)
    for o in objects:
        f.write(o)
    f.write(b"\0" * (meta["weights"][0] - f.tell()))
    f.write(region.data)


def read_artifact(path: str | os.PathLike, target: Target) -> Artifact:
    """Read and check an entry; any inconsistency raises ArtifactError (a miss), never a crash."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(_HEAD)
        if len(head) != _HEAD or head[:len(MAGIC)] != MAGIC:
            raise ArtifactError("not a cuvil artifact")
        n = int.from_bytes(head[-8:], "little")
        if n > min(MAX_META_BYTES, size - _HEAD):
            raise ArtifactError("metadata length out of bounds")
        text = f.read(n)
        if hashlib.sha256(text).digest() != head[len(MAGIC):len(MAGIC) + 32]:
            raise ArtifactError("metadata checksum mismatch")
        try:
            meta = json.loads(text)
            w_off, w_len, w_sum = meta["weights"]
            objs = [(int(o), int(k), str(d)) for o, k, d in meta["objects"]]
            lowered = _lowered(meta, target)
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise ArtifactError(f"bad metadata: {e}") from None
        w_end = w_off + w_len + _pad(w_len)
        if meta.get("file_bytes") != size or w_end != size or w_off % PAGE or w_len < 0 or not objs:
            raise ArtifactError(f"size mismatch: the file has {size} bytes")
        pos, objects = _HEAD + n, []
        for off, k, digest in objs:
            if off != pos or off + k > w_off:
                raise ArtifactError("object region out of bounds")
            obj = f.read(k)
            if len(obj) != k or hashlib.sha256(obj).hexdigest() != digest:
                raise ArtifactError("object checksum mismatch")
            objects.append(obj)
            pos += k
    region = np.memmap(path, dtype=np.uint8, mode="r", offset=w_off, shape=(w_end - w_off,)) if w_end > w_off \
        else np.zeros(PAGE, dtype=np.uint8)
    if weights_checksum(region) != w_sum:
        raise ArtifactError("weights checksum mismatch")
    return Artifact(lowered, objects, region[:w_len])
