"""Cuvil's compiler: IR, verifier, text form, reference interpreter, frontends, passes, lowering."""

from .errors import CuvilError
from .interpreter import run_reference
from .ir import Batch, DType, Graph, N, Node, TensorType
from .ir.infer import bind_batch, infer_graph_types
from .ir.text import parse_graph, print_graph
from .ir.verify import verify

__all__ = [
    "Batch", "CuvilError", "DType", "Graph", "N", "Node", "TensorType",
    "bind_batch", "infer_graph_types", "parse_graph", "print_graph", "run_reference", "verify",
]
