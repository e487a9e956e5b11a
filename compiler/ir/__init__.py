"""Cuvil IR: element types, tensor types, nodes and graphs (inference, verifier, text form beside)."""

from .dtypes import DType
from .graph import Graph, Node
from .types import N, Batch, Dim, TensorType

__all__ = ["DType", "Graph", "Node", "N", "Batch", "Dim", "TensorType"]
