"""Cuvil: push signed models to an edge fleet, compile them on each device, evaluate them privately.

The public names load on first use (PEP 562): a device process that imports only
``cuvil.edge_runtime`` never loads the API, the quantizer or the frontends' helpers.
"""

import importlib

from .version import __version__

_FROM = {
    "Graph": ".compiler", "BundleError": ".compiler.errors", "CuvilError": ".compiler.errors",
    "Exported": ".api", "Inspection": ".api", "export": ".api", "import_model": ".api", "inspect_model": ".api",
    "keygen": ".api", "load": ".api", "read_inputs": ".api", "run_reference": ".api", "save_outputs": ".api",
    "QuantizationReport": ".compiler.quantize", "QuantizedModel": ".compiler.quantize",
    "integer_form": ".compiler.quantize", "quantize": ".compiler.quantize",
    "Model": ".edge_runtime.loader", "Session": ".edge_runtime.session",
    "BenchResult": ".native", "bench": ".native", "compile": ".native", "device_profiles": ".native",
    "run_native": ".native",
}

__all__ = sorted(_FROM)


def __getattr__(name: str):
    if name not in _FROM:
        raise AttributeError(f"module 'cuvil' has no attribute {name!r}")
    value = getattr(importlib.import_module(_FROM[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_FROM])
