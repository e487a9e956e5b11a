"""Cuvil: push signed models to an edge fleet, compile them on each device, evaluate them privately."""

__version__ = "0.1.0"

from .compiler import Graph  # noqa: E402  (the version is set first: the API stamps it into bundles)
from .compiler.errors import BundleError, CuvilError  # noqa: E402
from .api import (  # noqa: E402
    Exported, Inspection, export, import_model, inspect_model, keygen, load, read_inputs, run_reference, save_outputs,
)
from .edge_runtime.loader import Model  # noqa: E402

__all__ = [
    "BundleError", "CuvilError", "Exported", "Graph", "Inspection", "Model", "export", "import_model",
    "inspect_model", "keygen", "load", "read_inputs", "run_reference", "save_outputs",
]
