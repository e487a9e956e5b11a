"""The device side: verified bundle loading and trust (native compile, arena, session to come).

Imports only numpy, llvmlite and cryptography: a device never needs torch or onnx.
"""

from .loader import Model, load, load_bytes
from .trust import TrustStore, default_trust_dir, resolve_trust

__all__ = ["Model", "TrustStore", "default_trust_dir", "load", "load_bytes", "resolve_trust"]
