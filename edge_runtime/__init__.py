"""The device side: verified bundle loading and trust, native compile with an on-disk cache, sessions.

Imports only numpy, llvmlite and cryptography: a device never needs torch or onnx.
"""

from .compile import compile_graph, compile_model
from .loader import Model, load, load_bytes
from .session import CompileStats, Session
from .trust import TrustStore, default_trust_dir, resolve_trust

__all__ = [
    "CompileStats", "Model", "Session", "TrustStore", "compile_graph", "compile_model", "default_trust_dir", "load",
    "load_bytes", "resolve_trust",
]
