"""Cuvil: push signed models to an edge fleet, compile them on each device, evaluate them privately.

The public names load on first use (PEP 562): a device process that imports only
``cuvil.edge_runtime`` never loads the API, the quantizer or the frontends' helpers.
"""

import os as _os

# numpy's OpenBLAS starts a thread per core that spins for ~0.13 s after its import and after every
# BLAS call it spreads, on the cores Cuvil's own workers and weights' check run on: a ResNet-18 warm
# start on 2 CPUs 19.3 -> 12.7 ms median with one BLAS thread. Cuvil's numpy work is small. Set it
# before numpy is imported to choose otherwise (docs/threads.md).
_os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .compiler.lazy import lazy_names  # noqa: E402

from .version import __version__  # noqa: E402

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
