"""Cuvil's compiler: IR, verifier, text form, reference interpreter, frontends, passes, lowering.

The names below load on first use (PEP 562): a device process on a warm start needs a few of the
compiler's modules (IR types, bundle format), never the op table, the interpreter or the passes.
"""

from .lazy import lazy_names

_FROM = {
    "CuvilError": ".errors", "run_reference": ".interpreter",
    "Batch": ".ir", "DType": ".ir", "Graph": ".ir", "N": ".ir", "Node": ".ir", "TensorType": ".ir",
    "bind_batch": ".ir.infer", "infer_graph_types": ".ir.infer", "parse_graph": ".ir.text", "print_graph": ".ir.text",
    "verify": ".ir.verify",
}

__all__ = sorted(_FROM)
__getattr__, __dir__ = lazy_names(__name__, _FROM)
