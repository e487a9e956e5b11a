"""The signed, deterministic `.cuvil` bundle: layout, writer, verify-first reader, Ed25519 keys."""

from .delta import Delta, apply_delta, make_delta, read_delta
from .format import ALIGN, FORMAT_VERSION, MAGIC, MAX_MANIFEST_BYTES, Header, Manifest, WeightEntry
from .lineage import Lineage
from .reader import Bundle, BundleHead, read_bundle, read_head
from .signing import KeyFileError, KeyPair, fingerprint, generate_keypair, load_private_key, load_public_key
from .writer import build_manifest, bundle_bytes, frame, save_bundle, write_bundle

__all__ = [
    "ALIGN", "Delta", "FORMAT_VERSION", "MAGIC", "MAX_MANIFEST_BYTES", "Bundle", "BundleHead", "Header", "KeyFileError", "KeyPair",
    "Lineage", "apply_delta", "make_delta", "read_delta",
    "Manifest", "WeightEntry", "build_manifest", "bundle_bytes", "fingerprint", "frame", "generate_keypair",
    "load_private_key", "load_public_key", "read_bundle", "read_head", "save_bundle", "write_bundle",
]
