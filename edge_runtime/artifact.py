"""The complete compiled artifact as one sealed cache file, so a cache hit never lowers again.

The file is a :mod:`.sealed` file: ``meta`` (JSON) holds everything the Session needs (entry
symbol, arena bytes, IO specs, the memory plan, counts, the object files' lengths, the prelinked
image's layout), the body is the object files and the objects prelinked (:mod:`.prelink`, which a
warm start loads without linking), the tail the packed weights. The tail starts on a page
boundary, so the weights are mapped straight from the file with no copy (a page-aligned mapping is
64-byte aligned, as the kernels assume). The seal's MAC is checked before anything is parsed, and before the code is
loaded. JSON, not pickle, so reading an entry never executes anything.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from ..compiler.codegen.lowered import IOSpec, LoweredModel
from ..compiler.ir.dtypes import DType
from ..compiler.memory.plan import MemoryPlan
from ..compiler.target import Target
from .elf import ObjectFormatError
from .objload import UnsupportedObjectError
from .prelink import Prelinked, PrelinkError, prelink
from .sealed import Opened, Sealer, SealError, TailCheck

FORMAT = "cuvil artifact 4"


class ArtifactError(SealError):
    """The entry is truncated, garbled, of another format or fails its MAC: the caller treats it as a miss."""


@dataclass(frozen=True)
class Artifact:
    lowered: LoweredModel  # llvm_ir and weights empty: the weights are the array below
    objects: list[bytes]
    weights: np.ndarray  # uint8, read-only, 64-byte aligned (a view of a page-aligned mapping)


@dataclass(frozen=True)
class OpenedArtifact:
    """An entry whose code and plan are checked and whose weights are being checked (:meth:`checked`)."""

    lowered: LoweredModel
    objects: list[bytes]
    weights_check: TailCheck
    image: Prelinked | None = None  # the objects linked at address 0; None where they could not be

    def checked(self) -> Artifact:
        """The entry once its weights' check holds; SealError when it fails."""
        return Artifact(self.lowered, self.objects, self.weights_check.result())


def _spec_json(s: IOSpec) -> list:
    return [s.name, s.offset, s.dtype.value, list(s.shape), s.bounded_axis]


def _spec(v: list) -> IOSpec:
    return IOSpec(str(v[0]), int(v[1]), DType(v[2]), tuple(int(d) for d in v[3]),
                  v[4] if len(v) > 4 and type(v[4]) is int else None)


def _meta(lw: LoweredModel) -> dict:
    p = lw.plan
    return {
        "entry": lw.entry, "arena_bytes": lw.arena_bytes, "batch": lw.batch,
        "inputs": [_spec_json(s) for s in lw.inputs], "outputs": [_spec_json(s) for s in lw.outputs],
        "kernel_count": lw.kernel_count, "node_count": lw.node_count,
        "profile_offset": lw.profile_offset, "profile_nodes": list(lw.profile_nodes), "fault_offset": lw.fault_offset,
        "split_nodes": lw.split_nodes, "split_settled": lw.split_settled, "split_reason": lw.split_reason,
        "workers": lw.workers,
        "plan": {"batch": p.batch, "offsets": dict(p.offsets), "sizes": dict(p.sizes), "arena_bytes": p.arena_bytes,
                 "lower_bound": p.lower_bound, "naive_bytes": p.naive_bytes, "alignment": p.alignment,
                 "aliases": dict(p.aliases), "joined": {k: list(v) for k, v in p.joined.items()}},
    }


def _lowered(meta: dict, target: Target) -> LoweredModel:
    p = meta["plan"]
    plan = MemoryPlan(int(p["batch"]), p["offsets"], p["sizes"], int(p["arena_bytes"]), int(p["lower_bound"]),
                      int(p["naive_bytes"]), int(p["alignment"]), p["aliases"],
                      {str(k): (str(v[0]), int(v[1])) for k, v in p.get("joined", {}).items()})
    return LoweredModel(
        llvm_ir="", entry=str(meta["entry"]), weights=b"", plan=plan, arena_bytes=int(meta["arena_bytes"]),
        inputs=tuple(map(_spec, meta["inputs"])), outputs=tuple(map(_spec, meta["outputs"])),
        kernel_count=int(meta["kernel_count"]), target=target, batch=int(meta["batch"]),
        node_count=int(meta["node_count"]), profile_offset=_offset(meta["profile_offset"]),
        profile_nodes=tuple(meta["profile_nodes"]), fault_offset=_offset(meta["fault_offset"]),
        split_nodes=_count(meta.get("split_nodes", 0)), split_settled=meta.get("split_settled", True) is not False,
        split_reason=str(meta.get("split_reason", "")), workers=meta.get("workers", True) is not False)


def _check_layout(lw: LoweredModel) -> None:
    """Every region the runtime reads or writes lies inside the arena (the code's own offsets are
    compiled in; these are the Session's views of inputs, outputs and counters)."""
    regions = [(s.offset, s.nbytes) for s in lw.inputs + lw.outputs]
    regions += [(lw.fault_offset, 4)] if lw.fault_offset is not None else []
    regions += [(lw.profile_offset, 8 * len(lw.profile_nodes))] if lw.profile_offset is not None else []
    if lw.arena_bytes < 0 or any(at < 0 or at + n > lw.arena_bytes for at, n in regions):
        raise ArtifactError("a region lies outside the arena")


def _count(v) -> int:
    if type(v) is not int or v < 0:
        raise ValueError("a count that is no natural number")
    return v


def _offset(v) -> int | None:
    return None if v is None else int(v)


def write_artifact(sealer: Sealer, path: str | os.PathLike, name: str, lowered: LoweredModel,
                   objects: list[bytes]) -> None:
    """Seal the whole entry under ``name`` (its cache key) and publish it at ``path`` atomically."""
    meta = _meta(lowered)
    meta["format"] = FORMAT
    meta["objects"] = [len(o) for o in objects]
    try:
        image = prelink(objects, lowered.entry)
    except (UnsupportedObjectError, ObjectFormatError, PrelinkError):
        image = None  # linked from the objects on each load (or by llvmlite)
    meta["image"] = _image_json(image) if image else None
    body = objects + ([image.data] if image else [])
    sealer.write(path, name, json.dumps(meta, separators=(",", ":")).encode(), body, lowered.weights)


def _image_json(image: Prelinked) -> dict:
    return {"size": image.size, "bytes": len(image.data), "regions": [list(r) for r in image.regions],
            "fixups": [list(f) for f in image.fixups], "entries": list(image.entries)}


def _image(v: dict, data: bytes) -> Prelinked:
    """The prelinked image ``v`` describes; ValueError (a miss) for any inconsistency."""
    return Prelinked(_count(v["size"]), data, tuple((_count(o), _count(n)) for o, n in v["regions"]),
                     tuple((_count(at), name) for at, name in v["fixups"]),
                     tuple(e if type(e) is int and e == -1 else _count(e) for e in v["entries"])).check()


def read_artifact(sealer: Sealer, path: str | os.PathLike, name: str, target: Target) -> Artifact:
    """Open the entry sealed under ``name``; any inconsistency raises SealError (a miss), never a crash.

    A missing path, or one that is no regular file of this user, raises OSError.
    """
    return open_artifact(sealer, path, name, target).checked()


def open_artifact(sealer: Sealer, path: str | os.PathLike, name: str, target: Target,
                  opened: Opened | None = None) -> OpenedArtifact:
    """:func:`read_artifact` with the weights' check still under way (:meth:`Sealer.open`): a warm start
    loads the code meanwhile, and nothing reads the weights before ``checked()``. ``opened``: the file
    already opened under ``name`` (a warm start opens it before its key is known)."""
    opened = opened or sealer.open(path, name)
    try:
        meta = json.loads(opened.meta)
        if meta.get("format") != FORMAT:
            raise ArtifactError(f"artifact format {str(meta.get('format'))[:40]!r}")
        lengths = [int(k) for k in meta["objects"]]
        lowered = _lowered(meta, target)
        image_meta = meta["image"]
        image_bytes = 0 if image_meta is None else _count(image_meta["bytes"])
        if not lengths or min(lengths) < 0 or sum(lengths) + image_bytes != len(opened.body):
            raise ArtifactError("object and image lengths do not add up to the body")
        image = None if image_meta is None else _image(image_meta, opened.body[sum(lengths):])
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError, RecursionError) as e:
        if isinstance(e, ArtifactError):
            raise
        raise ArtifactError(f"bad metadata: {type(e).__name__}") from None
    _check_layout(lowered)
    objects, pos = [], 0
    for k in lengths:
        objects.append(opened.body[pos:pos + k])
        pos += k
    return OpenedArtifact(lowered, objects, opened.tail, image)
