"""The public Python API; the CLI is a thin layer over these functions.

Frontends (torch, onnx) are imported lazily, only when a model of that kind is imported, so
``import cuvil`` works on a device that has neither.
"""

from __future__ import annotations

import math
import os
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .compiler.atomic_file import atomic_write
from .compiler import interpreter
from .compiler.analysis import ModelSummary, summarize
from .version import __version__
from .compiler.bundle import MAGIC, BundleHead, KeyPair, Lineage, fingerprint, generate_keypair, load_private_key, save_bundle
from .compiler.errors import CuvilError
from .compiler.ir.graph import Graph
from .compiler.ir.limits import check_graph
from .compiler.ir.text import print_graph
from .compiler.ir.verify import verify
from .compiler.npy_header import read_header
from .compiler.regular_file import open_regular, starts_with
from .compiler.quantize import integer_form, quantize  # noqa: F401  (post-training int8; the form bundles sign)
from .edge_runtime.loader import Model, Trusted, read_file_head
from .edge_runtime.loader import load as _load

PathLike = str | os.PathLike


def _frontend_missing(kind: str, e: ModuleNotFoundError) -> CuvilError:
    return CuvilError(f"importing {kind} models needs {e.name!r} (pip install 'cuvil[{kind.lower()}]')")


def _is_instance_of(obj: Any, module: str, attr_path: str) -> bool:
    """isinstance against a class of an optional library, without importing the library."""
    mod = sys.modules.get(module)
    if mod is None:
        return False
    cls: Any = mod
    for part in attr_path.split("."):
        cls = getattr(cls, part, None)
    return isinstance(cls, type) and isinstance(obj, cls)


def import_model(model_or_path: Any, example_inputs: Any = None, *, batch_size: int | None = None) -> Graph:
    """Turn an ONNX model (path, bytes, ``onnx.ModelProto``) or a ``torch.nn.Module`` into a verified Graph.

    ``example_inputs`` (a tensor or a tuple of them) is required for torch; ``batch_size`` binds an
    ONNX model's symbolic batch dimension when its shape arithmetic needs a concrete size.
    """
    if isinstance(model_or_path, Graph):
        return verify(model_or_path)
    if isinstance(model_or_path, (str, os.PathLike)):
        path = Path(model_or_path)
        if path.is_file():
            _refuse_blank(path)
        if path.suffix.lower() == ".cuvil" or _has_magic(path):
            raise CuvilError(f"{path} is a Cuvil bundle: use cuvil.load (or `cuvil inspect`) instead")
        if path.suffix.lower() != ".onnx":
            raise CuvilError(f"{path}: cannot tell the model format (expected a .onnx file or a Cuvil bundle)")
    is_onnx = isinstance(model_or_path, (str, os.PathLike, bytes, bytearray, memoryview)) or _is_instance_of(
        model_or_path, "onnx", "ModelProto")
    if is_onnx:
        try:
            from .compiler.frontends.onnx import import_onnx
        except ModuleNotFoundError as e:
            raise _frontend_missing("ONNX", e) from None
        return import_onnx(model_or_path, batch_size=batch_size)
    if _is_instance_of(model_or_path, "torch", "nn.Module"):
        if example_inputs is None:
            raise CuvilError("importing a torch module needs example_inputs (a tensor or a tuple of tensors)")
        if not isinstance(example_inputs, (tuple, list)):
            example_inputs = (example_inputs,)
        try:
            from .compiler.frontends.torch import import_torch
        except ModuleNotFoundError as e:
            raise _frontend_missing("torch", e) from None
        return import_torch(model_or_path, tuple(example_inputs))
    raise CuvilError(f"cannot import a {type(model_or_path).__name__}: expected a .onnx path, ONNX bytes, "
                     "an onnx.ModelProto or a torch.nn.Module")


_BLANK_HEAD = 1 << 16


def _refuse_blank(path: Path) -> None:
    """CuvilError where the file is empty or begins with zero bytes only (a preallocated or wiped file): a
    ``.cuvil`` one was called a Cuvil bundle and an ``.onnx`` one failed in the protobuf parser, unnamed."""
    with _opened(path) as f:
        head = f.read(_BLANK_HEAD)
    if not head.strip(b"\0"):
        what = "empty" if not head else "all zero bytes" if len(head) < _BLANK_HEAD else "zero bytes at its start"
        raise CuvilError(f"{path} is not a model: the file is {what}")


def _has_magic(path: Path, missing_ok: bool = True) -> bool:
    """Whether ``path`` is a bundle by its first bytes (a FIFO or device is an OSError, never a block)."""
    try:
        return starts_with(path, MAGIC)
    except OSError:
        if missing_ok:
            return False
        raise


def run_reference(graph_or_model: Graph | Model, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a Graph or a loaded Model with the NumPy reference interpreter."""
    graph = graph_or_model.graph if isinstance(graph_or_model, Model) else graph_or_model
    _, batch = interpreter.bind_inputs(graph, inputs)
    check_graph(graph, batch or 1)  # the interpreter holds activations of that batch
    return interpreter.run_reference(graph, inputs)


@dataclass(frozen=True)
class Exported:
    path: Path
    size: int
    weight_bytes: int
    content_hash: str
    signer: str


def _private_key(key: Ed25519PrivateKey | PathLike) -> Ed25519PrivateKey:
    return key if isinstance(key, Ed25519PrivateKey) else load_private_key(key)


def export(graph: Graph, path: PathLike, key: Ed25519PrivateKey | PathLike, *, name: str | None = None,
           version: str = "0", lineage: Lineage | None = None) -> Exported:
    """Write ``graph`` as a signed bundle; the same graph, metadata and key give the same bytes.

    ``lineage``: where a fine-tuned version came from (see :class:`cuvil.compiler.bundle.Lineage`).
    """
    private = _private_key(key)
    manifest = save_bundle(graph, path, private, name=name or graph.name, version=version,
                           producer=f"cuvil {__version__}", lineage=lineage)
    return Exported(Path(path), os.path.getsize(path), graph.weight_bytes,
                    manifest.content_hash, fingerprint(private))


@dataclass(frozen=True)
class DeltaMade:
    path: Path
    size: int  # the delta's bytes
    target_size: int  # the bundle it stands in for
    parent: str  # content hashes: the version it applies to, the one it makes
    target: str


def make_delta(parent: PathLike, target: PathLike, key: Ed25519PrivateKey | PathLike, out: PathLike) -> DeltaMade:
    """Write the signed delta that makes bundle ``target`` from bundle ``parent`` (docs/bundle-format.md)."""
    from .compiler.bundle import make_delta as _make_delta, read_delta
    from .edge_runtime.loader import read_file

    old, new, private = read_file(parent), read_file(target), _private_key(key)
    data = _make_delta(old, new, private)
    with atomic_write(out) as f:
        f.write(data)
    m = read_delta(data, [private.public_key()]).manifest
    return DeltaMade(Path(out), len(data), len(new), m.parent, m.target)


def load(path: PathLike, trusted_keys: Trusted = None, *, lazy: bool = False) -> Model:
    """Verify the bundle against ``trusted_keys`` (key files, public keys; default: the trust directory), then load it.

    ``lazy=True``: verify the signed head now and read the weights (checked against it) when the graph is
    first needed, so compiling it on a cache hit never reads them."""
    return _load(path, trusted_keys, lazy=lazy)


def keygen(out_dir: PathLike, name: str = "cuvil", force: bool = False) -> KeyPair:
    """Write a new Ed25519 key pair: ``NAME.key`` (PEM, mode 0600) and ``NAME.pub``."""
    return generate_keypair(out_dir, name, force)


@dataclass(frozen=True)
class Inspection:
    graph_text: str
    graph: Graph | None  # None for a bundle whose signer is not trusted here: its graph is never parsed
    summary: ModelSummary  # flops and op_counts are None where the graph was not parsed
    bundle: BundleHead | None  # None for a model imported from ONNX


def inspect_model(path: PathLike, trusted_keys: Trusted = None) -> Inspection:
    """Summarize a bundle or a source model. A bundle's signature must verify, but its signer need not be
    trusted here (``bundle.trusted`` says whether it is). Of an untrusted bundle only the header and
    the signed manifest are read, and its graph text is shown as signed, never parsed: what it costs is
    bounded by the manifest's size cap. A trusted bundle is loaded whole (weights hashed, graph parsed)."""
    if _has_magic(Path(path), missing_ok=False):
        head = read_file_head(path, trusted_keys)
        if head.trusted:
            graph = _load(path, trusted_keys).graph
            return Inspection(print_graph(graph, data=False), graph, summarize(graph), head)
        m = head.manifest
        summary = ModelSummary(parameters=sum(math.prod(w.shape) for w in m.weights), flops=None,
                               weight_bytes=sum(w.length for w in m.weights), inputs=m.inputs, outputs=m.outputs,
                               op_counts=None)
        return Inspection(m.graph, None, summary, head)
    graph = import_model(path)
    return Inspection(print_graph(graph, data=False), graph, summarize(graph), None)


def read_inputs(model: Graph | Model, npy: PathLike | None = None, npz: PathLike | None = None) -> dict[str, np.ndarray]:
    """Inputs from one ``.npy`` (single-input models) or an ``.npz`` keyed by input name. Never unpickles.

    The files are input like any other: an array's header must declare exactly the bytes that follow
    it, and an .npz may hold only the model's inputs, each checked before it is read (a 100-byte file
    declaring 2^40 floats, or a 3 MB archive inflating to 3 GiB, allocated first and failed after)."""
    if (npy is None) == (npz is None):
        raise CuvilError("give exactly one of an .npy input or an .npz of inputs")
    names = [name for name, _ in model.inputs] if isinstance(model, Model) else list(model.inputs)
    try:
        if npy is not None:
            if len(names) != 1:
                raise CuvilError(f"the model has {len(names)} inputs {names}: pass an .npz")
            with _opened(npy) as f:
                return {names[0]: _read_npy(f, os.fstat(f.fileno()).st_size, "the file")}
        with _opened(npz) as f, zipfile.ZipFile(f) as archive:
            out = {}
            for member in archive.infolist():
                name = member.filename.removesuffix(".npy")
                if name not in names or not member.filename.endswith(".npy"):
                    raise ValueError(f"{member.filename[:100]!r} is not an .npy of an input of the model {names[:8]}")
                if name in out:  # a zip may repeat a name: which copy counts would be a reader's choice
                    raise ValueError(f"{member.filename[:100]!r} is in the archive twice")
                with archive.open(member) as m:
                    out[name] = _read_npy(m, member.file_size, member.filename)
            return out
    except (ValueError, zipfile.BadZipFile, EOFError) as e:
        reason = str(e).splitlines()[0] if str(e) else repr(e)
        raise CuvilError(f"cannot read inputs from {npy or npz}: {reason}") from None
    except MemoryError:
        raise CuvilError(f"the inputs in {npy or npz} do not fit in this machine's memory") from None


def _read_npy(f: BinaryIO, size: int, what: str) -> np.ndarray:
    """One .npy array of a file (or archive member) of ``size`` bytes, read once its header is checked
    (:func:`~cuvil.compiler.npy_header.read_header`: nothing allocated for more than it holds)."""
    shape, fortran, dtype = read_header(f, size, what)
    declared = math.prod(shape) * dtype.itemsize
    data = f.read(declared)
    if len(data) != declared:
        raise ValueError(f"{what} is truncated")
    return np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C")


def _opened(path: PathLike) -> BinaryIO:
    """``path`` opened as a regular file (a FIFO or device is an OSError at once: ``np.load`` would block)."""
    fd, _ = open_regular(path)
    return os.fdopen(fd, "rb")


def output_dir(path: PathLike, force: bool = False) -> Path:
    """``path`` made (with its parents) for a command that writes many files into it. A directory that holds
    anything already is refused unless ``force``: its files were replaced one by one, mixed with the new."""
    path = Path(path)
    if not force and path.is_dir() and any(path.iterdir()):
        raise CuvilError(f"{path} is not empty; pass --force to write into it")
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_outputs(path: PathLike, outputs: Mapping[str, np.ndarray]) -> None:
    """Write an ``.npz`` keyed by output name (works for any name, unlike ``np.savez(**kw)``), whole or
    not at all (on a full disk an existing file was truncated and half a zip left)."""
    with atomic_write(path) as out, zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, arr in outputs.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(arr), allow_pickle=False)
