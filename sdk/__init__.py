"""Cuvil: push signed models to an edge fleet, compile them on each device, evaluate them privately."""

from .compiler import Graph
from .compiler.errors import BundleError, CuvilError
from .version import __version__
from .api import (  # noqa: E402
    Exported, Inspection, export, import_model, inspect_model, keygen, load, read_inputs, run_reference, save_outputs,
)
from .compiler.quantize import QuantizationReport, QuantizedModel, integer_form, quantize  # noqa: E402,F811
from .edge_runtime.loader import Model  # noqa: E402
from .edge_runtime.session import Session  # noqa: E402
from .native import BenchResult, bench, compile, device_profiles, run_native  # noqa: E402

__all__ = [
    "BenchResult", "BundleError", "CuvilError", "Exported", "Graph", "Inspection", "Model", "QuantizationReport",
    "QuantizedModel", "Session", "bench", "compile", "device_profiles", "export", "import_model", "inspect_model",
    "integer_form",
    "keygen", "load", "quantize", "read_inputs", "run_native", "run_reference", "save_outputs",
]
