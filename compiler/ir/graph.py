"""The IR's vocabulary: one immutable :class:`Node` type and an immutable :class:`Graph`.

Values are named by strings. Weights live in ``Graph.constants`` as read-only arrays. Every value
(input, constant, node output) has a :class:`TensorType` in ``Graph.types``. Nodes are kept in a
valid schedule order (every input defined before use).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from .types import TensorType


_NAN = float("nan")


def _freeze_attr(value: Any) -> Any:
    """Lists become tuples; every NaN becomes one shared object, so that equal nodes compare (and
    hash) equal: ``nan != nan``, and tuples compare elements by identity first."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze_attr(v) for v in value)
    return _NAN if isinstance(value, float) and math.isnan(value) else value


@dataclass(frozen=True)
class Node:
    """One op application. ``attrs`` is complete (defaults filled) and sorted by name."""

    op: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "attrs", tuple((k, _freeze_attr(v)) for k, v in self.attrs))

    @staticmethod
    def make(op: str, inputs: Iterable[str], outputs: Iterable[str], name: str = "", **attrs: Any) -> Node:
        """Build a node with canonical (defaulted, coerced) attributes from the op table."""
        from ..ops import get_op

        norm = get_op(op).normalize_attrs(attrs)
        outs = tuple(outputs)
        return Node(op, name or (outs[0] if outs else op), tuple(inputs), outs, tuple(sorted(norm.items())))

    @property
    def attr(self) -> Mapping[str, Any]:
        return dict(self.attrs)

    def replace(self, **changes: Any) -> Node:
        fields = {"op": self.op, "name": self.name, "inputs": self.inputs, "outputs": self.outputs, "attrs": self.attrs}
        fields.update(changes)
        if isinstance(fields["attrs"], Mapping):
            fields["attrs"] = tuple(sorted((k, _freeze_attr(v)) for k, v in fields["attrs"].items()))
        return Node(**fields)


def _readonly(arr: np.ndarray) -> np.ndarray:
    """A read-only, C-contiguous, native-byte-order array (0-d stays 0-d: no ascontiguousarray)."""
    arr = np.asarray(arr, order="C")
    arr = arr.astype(arr.dtype.newbyteorder("="), copy=False)
    if arr.flags.writeable:
        arr = arr.copy()
        arr.flags.writeable = False
    return arr


@dataclass(frozen=True, eq=False)
class Graph:
    """A whole model: inputs, constants (weights), nodes in schedule order, outputs, all types."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    types: Mapping[str, TensorType]
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "types", MappingProxyType(dict(self.types)))
        object.__setattr__(self, "constants", MappingProxyType({k: _readonly(v) for k, v in self.constants.items()}))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "nodes", tuple(self.nodes))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return (
            self.name == other.name
            and self.inputs == other.inputs
            and self.outputs == other.outputs
            and self.nodes == other.nodes
            and dict(self.types) == dict(other.types)
            and self.constants.keys() == other.constants.keys()
            and all(_same_array(self.constants[k], other.constants[k]) for k in self.constants)
        )

    __hash__ = None  # type: ignore[assignment]

    def replace(self, **changes: Any) -> Graph:
        fields = {
            "name": self.name,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "nodes": self.nodes,
            "types": self.types,
            "constants": self.constants,
        }
        fields.update(changes)
        return Graph(**fields)

    @property
    def input_types(self) -> dict[str, TensorType]:
        return {n: self.types[n] for n in self.inputs}

    @property
    def output_types(self) -> dict[str, TensorType]:
        return {n: self.types[n] for n in self.outputs}

    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    users.setdefault(name, []).append(node)
        return users

    @property
    def weight_bytes(self) -> int:
        return sum(int(a.nbytes) for a in self.constants.values())

    @property
    def parameter_count(self) -> int:
        return sum(int(a.size) for a in self.constants.values())


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
