"""The signed, deterministic `.cuvil` bundle: layout, writer, verify-first reader, Ed25519 keys.

The names below load on first use (PEP 562): a device reading a bundle's signed head needs
neither the writer nor deltas.
"""

from ..lazy import lazy_names

_FROM = {
    "Delta": ".delta", "apply_delta": ".delta", "make_delta": ".delta", "read_delta": ".delta",
    "ALIGN": ".format", "FORMAT_VERSION": ".format", "MAGIC": ".format", "MAX_MANIFEST_BYTES": ".format",
    "Header": ".format", "Manifest": ".format", "WeightEntry": ".format",
    "Lineage": ".lineage",
    "Bundle": ".reader", "BundleHead": ".reader", "read_bundle": ".reader", "read_head": ".reader",
    "KeyFileError": ".signing", "KeyPair": ".signing", "fingerprint": ".signing", "generate_keypair": ".signing",
    "load_private_key": ".signing", "load_public_key": ".signing",
    "build_manifest": ".writer", "bundle_bytes": ".writer", "frame": ".writer", "save_bundle": ".writer",
    "write_bundle": ".writer",
}

__all__ = sorted(_FROM)
__getattr__, __dir__ = lazy_names(__name__, _FROM)
