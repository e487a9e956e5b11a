"""A device rebuilds a pushed version from a signed delta, or refuses it with a typed error.

The delta is applied only to the exact version it names (which the device must hold: otherwise
:class:`DeltaParentMissing`, and the coordinator sends the full bundle), only when it makes the
version the message announces, and only once (a delta for a version the device already holds is a
replay, :class:`DeltaReplayed`). Its signature, the parent's bytes and the result's digest are
checked by :func:`cuvil.compiler.bundle.apply_delta`; the rebuilt bundle is then verified and
stored like a pushed one (:meth:`.device.DeviceState.accept_bundle`). Nothing is written before
all of that holds, and the active version is never touched here.
"""

from __future__ import annotations

from ..compiler.bundle import apply_delta, read_delta
from ..compiler.errors import DeltaError
from ..edge_runtime.loader import read_file
from .device import BundleMissing, DeviceState


class DeltaParentMissing(BundleMissing):
    """The device does not hold the version a delta applies to."""


class DeltaReplayed(DeltaError):
    """The device already holds the version a delta makes: a delta is applied once."""


def rebuild(state: DeviceState, data: bytes, announced: str) -> bytes:
    """The bundle bytes ``data`` (a signed delta) makes from the version this device holds, checked."""
    limit = state.memory_budget()
    trusted = state.trust().keys
    delta = read_delta(data, trusted, limit)
    m = delta.manifest
    if m.target != announced:
        raise DeltaError(f"the delta makes version {m.target[:12]}, not the announced {announced[:12]}")
    if state.bundle_path(m.target).is_file():
        raise DeltaReplayed(f"this device already holds version {m.target[:12]}: the delta was applied before")
    path = state.bundle_path(m.parent)
    if not path.is_file():
        raise DeltaParentMissing(f"the delta applies to version {m.parent[:12]}, which {state.device_id} does not hold")
    return apply_delta(delta, read_file(path), trusted, limit)
