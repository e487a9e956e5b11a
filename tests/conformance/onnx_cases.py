"""ONNX's backend conformance cases as Cuvil's suite sees them: collected from the installed ``onnx``
wheel (its node cases, generated locally, and the model directories with data under
``onnx/backend/test/data/{pytorch-converted,pytorch-operator,simple}``), each with its scope: the
out-of-scope kinds are named by :data:`OUT_OF_SCOPE` with the reason. :mod:`.onnx_suite` runs them.
"""

from __future__ import annotations

import functools
import os
import random
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cuvil.compiler.frontends.onnx_subgraphs import all_nodes

MODEL_DIRS = ("pytorch-converted", "pytorch-operator", "simple")

OUT_OF_SCOPE: Mapping[str, str] = {
    "training": "training losses and optimizers (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss, "
                "ai.onnx.preview.training): inference only",
    "string": "string tensors and string ops: no text processing on the device",
    "sequence": "tensor sequences (Sequence*, SplitToSequence, ConcatFromSequence; If and Loop over them): "
                "Cuvil IR has tensors only",
    "optional": "optional values (Optional*): Cuvil IR has tensors only",
    "map": "maps: Cuvil IR has tensors only",
    "image decoding": "ImageDecoder: image files are decoded before the model, outside it",
}
"""Why a case is out of scope; :func:`scope_of` decides which reason applies."""

TRAINING_OPS = frozenset({"NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"})
TRAINING_DOMAINS = frozenset({"ai.onnx.preview.training"})
STRING_OPS = frozenset({"StringNormalizer", "StringConcat", "StringSplit", "RegexFullMatch"})
SEQUENCE_OPS = frozenset({"SplitToSequence", "ConcatFromSequence"})
IMAGE_OPS = frozenset({"ImageDecoder"})


@dataclass(frozen=True)
class Case:
    name: str
    source: str  # "node" or a model directory kind
    model: bytes  # the serialized ModelProto
    data_sets: tuple[tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]], ...]
    rtol: float
    atol: float
    scope: str | None  # None: in scope; else a key of OUT_OF_SCOPE
    ops: tuple[str, ...]  # op types (with domain when not the default one), subgraphs included
    inputs: tuple[str, ...]  # the ONNX graph inputs the data sets feed, in order


def _value_kinds(graph) -> set:
    kinds: set = set()

    def walk(t) -> None:
        which = t.WhichOneof("value")
        kinds.add(which)
        if which == "tensor_type":
            kinds.add(("elem", t.tensor_type.elem_type))
        elif which == "sequence_type":
            walk(t.sequence_type.elem_type)
        elif which == "optional_type":
            walk(t.optional_type.elem_type)
        elif which == "map_type":
            walk(t.map_type.value_type)

    for vi in (*graph.input, *graph.output, *graph.value_info):
        walk(vi.type)
    for node in all_nodes(graph):
        for a in node.attribute:
            if a.HasField("g"):
                kinds |= _value_kinds(a.g)
    return kinds


def scope_of(model) -> str | None:
    """The OUT_OF_SCOPE key that applies to ``model`` (a ModelProto), or None when it is in scope."""
    from onnx import TensorProto

    nodes = list(all_nodes(model.graph))
    ops = {n.op_type for n in nodes}
    kinds = _value_kinds(model.graph)
    strings = ("elem", TensorProto.STRING) in kinds or any(t.data_type == TensorProto.STRING for t in model.graph.initializer)
    if ops & TRAINING_OPS or {n.domain for n in nodes} & TRAINING_DOMAINS:
        return "training"
    if ops & IMAGE_OPS:
        return "image decoding"
    if strings or ops & STRING_OPS:
        return "string"
    if "sequence_type" in kinds or ops & SEQUENCE_OPS or any(o.startswith("Sequence") for o in ops):
        return "sequence"
    if "optional_type" in kinds or any(o.startswith("Optional") for o in ops):
        return "optional"
    if "map_type" in kinds:
        return "map"
    return None


def _op_names(model) -> tuple[str, ...]:
    return tuple(sorted({n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
                         for n in all_nodes(model.graph)}))


def _array(x) -> np.ndarray:
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(x) if isinstance(x, TensorProto) else np.asarray(x)


def _case(name: str, source: str, model, data_sets, rtol: float, atol: float) -> Case:
    """A case; out-of-scope ones keep no data (theirs may be sequences, maps or None)."""
    scope = scope_of(model)
    sets = () if scope else tuple((tuple(map(_array, ins)), tuple(map(_array, outs))) for ins, outs in data_sets)
    weights = {t.name for t in model.graph.initializer}
    inputs = tuple(vi.name for vi in model.graph.input if vi.name not in weights)
    return Case(name, source, model.SerializeToString(), sets, rtol, atol, scope, _op_names(model), inputs)


def _model_dir_cases(kind: str) -> list[Case]:
    import onnx
    from onnx.backend.test.loader import load_model_tests

    cases = []
    for t in load_model_tests(kind=kind):
        model = onnx.load(os.path.join(t.model_dir, "model.onnx"))
        sets = []
        for d in sorted(Path(t.model_dir).glob("test_data_set_*")):
            sets.append(tuple([_read_pb(p) for p in sorted(d.glob(f"{io}_*.pb"), key=_pb_index)] for io in ("input", "output")))
        cases.append(_case(f"{kind}/{t.name}", kind, model, sets, t.rtol, t.atol))
    return cases


def _pb_index(p: Path) -> int:
    return int(p.stem.rsplit("_", 1)[1])


def _read_pb(path: Path):
    from onnx import TensorProto

    t = TensorProto()
    t.ParseFromString(path.read_bytes())
    return t


@functools.cache
def load_cases(model_dirs: Sequence[str] = MODEL_DIRS) -> tuple[Case, ...]:
    """Every node case of the installed onnx (generated here) plus the model directories' cases
    (generated once per process: it takes ONNX about 10 s)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = [_case(c.name, "node", c.model, c.data_sets, c.rtol, c.atol) for c in collect_testcases(None)]
    for kind in model_dirs:
        cases.extend(_model_dir_cases(kind))
    return tuple(cases)


def sample(cases: Sequence[Case], count: int, seed: int) -> list[Case]:
    """A seeded sample of ``count`` in-scope cases (all of them when ``count`` is larger)."""
    inside = [c for c in cases if c.scope is None]
    if count >= len(inside):
        return inside
    picked = sorted(random.Random(seed).sample(range(len(inside)), count))
    return [inside[i] for i in picked]
