"""A device's identity: the Flower node's key, never a string the device reports.

A device says what it is called (``device_id`` in its info); anyone can say anything. What a device
cannot choose is the key its SuperNode authenticates with (``--auth-supernode-private-key``, checked
by a SuperLink started with ``--enable-supernode-auth``: see ``docs/fleet.md``). So the coordinator
records a device as ``name@fingerprint``, the fingerprint being the first 16 hex digits of the
SHA-256 of the node's public key (DER SubjectPublicKeyInfo; ``cuvil fleet node-key`` prints it): an impostor answering under a victim's name gets its own
identity, and a budget refusal, failure or report it sends is charged to that identity, never to
the victim's. Without node authentication the key is whatever the SuperNode presented (nothing is
proven); a node with no key at all is ``name@node<id>``.

A simulation provisions every simulated device itself, so there the name alone is the identity
(it stays the same across runs, as a simulated device's state directory does).
"""

from __future__ import annotations

from collections.abc import Mapping

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from ..compiler.digest import sha256

NAME_CHARS = 64  # a longer reported name is cut: it is a label, not the identity
FINGERPRINT_HEX = 16


def fingerprint(public_key: bytes) -> str:
    """Of a PEM public key (as Flower holds a node's) its DER form's hash; of other bytes, their hash."""
    try:
        der = serialization.load_pem_public_key(public_key).public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        der = public_key
    return sha256(der).hexdigest()[:FINGERPRINT_HEX]


def device_identity(name: object, node_id: int, keys: Mapping[int, bytes] | None) -> str:
    """The identity the coordinator records for the device on ``node_id`` that calls itself ``name``;
    ``keys``: each node's public key, or None where this process provisioned every node (simulation)."""
    label = str(name)[:NAME_CHARS] or "unnamed"
    if keys is None:
        return label
    key = keys.get(node_id)
    return f"{label}@{fingerprint(key)}" if key else f"{label}@node{node_id}"
