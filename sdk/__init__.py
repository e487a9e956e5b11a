"""Cuvil: push signed models to an edge fleet, compile them on each device, evaluate them privately."""

from .compiler import CuvilError, Graph, run_reference

__all__ = ["CuvilError", "Graph", "run_reference"]
__version__ = "0.1.0"
