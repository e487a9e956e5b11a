"""Reading an ONNX model (a path, serialized bytes or a ModelProto) into a ModelProto fit to import.

A path is a file named by someone else: it is opened the way Cuvil opens every such file
(``regular_file``), without blocking and refusing anything but a regular file (a FIFO would hang
``onnx.load`` forever, ``/dev/zero`` never ends), and read up to protobuf's own limit. Its external
data is then loaded by ``onnx`` itself, relative to the model's directory, with onnx's checks (no
``..``, no absolute location, no symbolic link, regular files only). Bytes and a ModelProto have no
directory: a tensor in them that still names external data is refused where it is read
(``onnx_node.tensor_value``), never looked up in the current directory.
"""

from __future__ import annotations

import math
import os
from typing import Any

import onnx
import onnx.serialization
from onnx import external_data_helper

from ..regular_file import open_regular, read_exactly
from .onnx_node import OnnxImportError
from .onnx_subgraphs import all_graphs

MAX_MODEL_BYTES = (2 << 30) - 1  # protobuf parses no larger message: bigger models keep weights as external data
DEFAULT_FORMAT = "protobuf"  # what onnx.load assumes for an extension it does not know


def load(model: Any) -> onnx.ModelProto:
    """The model as a ModelProto whose every name is text; OnnxImportError for anything malformed."""
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (str, os.PathLike)):
        proto = _from_path(os.fspath(model))
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto = _parse(bytes(model), DEFAULT_FORMAT)
    else:
        raise TypeError(f"import_onnx takes a path, bytes or onnx.ModelProto, not {type(model).__name__}")
    if not proto.HasField("graph") or not proto.graph.output:
        raise OnnxImportError("not a valid ONNX model: it has no graph outputs")
    check_names(proto)
    return proto


def _from_path(path: str | bytes) -> onnx.ModelProto:
    """As ``onnx.load(path)``: the format from the extension, external data from the model's directory."""
    too_big = OnnxImportError(f"ONNX model {path!r} is larger than {MAX_MODEL_BYTES} bytes, more than protobuf "
                              "reads: save its weights as external data")
    try:
        fd, st = open_regular(path)
        try:
            if st.st_size > MAX_MODEL_BYTES:  # refused by its size, before 2 GiB are read to be refused
                raise too_big
            data = read_exactly(fd, st.st_size + 1)
        finally:
            os.close(fd)
    except OSError as e:
        raise OnnxImportError(f"cannot read ONNX model {path!r}: {e.strerror or e}") from None
    if len(data) > MAX_MODEL_BYTES:
        raise too_big
    path = os.fsdecode(path)
    fmt = onnx.serialization.registry.get_format_from_file_extension(os.path.splitext(path)[1]) or DEFAULT_FORMAT
    proto = _parse(data, fmt)
    _check_external_sizes(proto, os.path.dirname(path))
    try:
        external_data_helper.load_external_data_for_model(proto, os.path.dirname(path))
    except Exception as e:  # onnx's location checks, a missing file, a length past its end, MemoryError...
        raise OnnxImportError(f"not a valid ONNX model ({type(e).__name__}: {e})") from None
    return proto


_SUB_BYTE_BITS = {getattr(onnx.TensorProto, n): b for n, b in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4),
                                                                 ("INT2", 2), ("UINT2", 2)) if hasattr(onnx.TensorProto, n)}


def _check_external_sizes(proto: onnx.ModelProto, base: str) -> None:
    """Each tensor's external bytes (its ``length``, else what its file holds past its ``offset``) must be
    what its shape and type take, checked before onnx reads a byte: a 142-byte model naming 10^9 bytes
    of a sparse file took 2 GB before the reshape failed."""
    for t in external_data_helper._get_all_tensors(proto):  # the tensors onnx loads, in every graph
        if not external_data_helper.uses_external_data(t):
            continue
        info = external_data_helper.ExternalDataInfo(t)
        count = math.prod(t.dims)
        bits = _SUB_BYTE_BITS.get(t.data_type)
        try:
            want = -(-count * bits // 8) if bits else count * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        except (KeyError, ValueError, TypeError):
            raise OnnxImportError(f"tensor {t.name!r} of data type {t.data_type} cannot be external data") from None
        if info.length is not None and info.length != want:
            raise OnnxImportError(f"tensor {t.name!r}: its external data is {info.length} bytes where "
                                  f"{list(t.dims)} of its type take {want}")
        if info.length is None:  # onnx reads to the end of the file: what is there must fit (its size unsaid)
            try:
                rest = os.stat(os.path.join(base, info.location)).st_size - (info.offset or 0)
            except (OSError, ValueError):
                continue  # onnx's own checks name what is wrong with the location
            if rest != want:
                raise OnnxImportError(f"tensor {t.name!r}: its external file does not hold what {list(t.dims)} "
                                      f"of its type take ({want} bytes) past its offset")


def _parse(data: bytes, fmt: str) -> onnx.ModelProto:
    try:
        return onnx.load_model_from_string(data, format=fmt)
    except Exception as e:  # protobuf DecodeError, a text format's parse error...
        raise OnnxImportError(f"not a valid ONNX model ({type(e).__name__}: {e})") from None


def check_names(proto: onnx.ModelProto) -> None:
    """protobuf hands back proto2 strings that are not UTF-8 as bytes: reject them once, here, in
    every graph (sub-graphs are imported by the same code as the main graph)."""
    names = [*(o.domain for o in proto.opset_import)]
    for g in all_graphs(proto.graph):
        names.append(g.name)
        names.extend(t.name for t in g.initializer)
        names.extend(n for s in g.sparse_initializer for n in (s.values.name, s.indices.name))
        for vi in (*g.input, *g.output, *g.value_info):
            names.append(vi.name)
            names.extend(d.dim_param for d in vi.type.tensor_type.shape.dim)
        for n in g.node:
            names.extend((n.name, n.op_type, n.domain, *n.input, *n.output, *(a.name for a in n.attribute)))
    if not all(isinstance(name, str) for name in names):
        raise OnnxImportError("not a valid ONNX model: a name in it is not valid UTF-8")
