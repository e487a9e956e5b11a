"""Cuvil: push signed models to an edge fleet, compile them on each device, evaluate them privately.

The public names load on first use (PEP 562): a device process that imports only
``cuvil.edge_runtime`` never loads the API, the quantizer or the frontends' helpers.
"""

from .compiler.lazy import lazy_names

from .version import __version__

_FROM = {
    "Graph": ".compiler", "BundleError": ".compiler.errors", "CuvilError": ".compiler.errors",
    "Exported": ".api", "Inspection": ".api", "export": ".api", "import_model": ".api", "inspect_model": ".api",
    "keygen": ".api", "load": ".api", "read_inputs": ".api", "run_reference": ".api", "save_outputs": ".api",
    "QuantizationReport": ".compiler.quantize", "QuantizedModel": ".compiler.quantize",
    "integer_form": ".compiler.quantize", "quantize": ".compiler.quantize",
    "Model": ".edge_runtime.loader", "Session": ".edge_runtime.session", "finish_writes": ".edge_runtime.cache",
    "BenchResult": ".native", "bench": ".native", "compile": ".native", "device_profiles": ".native",
    "run_native": ".native",
}

__all__ = sorted(_FROM)
__getattr__, __dir__ = lazy_names(__name__, _FROM)
