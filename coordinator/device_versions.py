"""A device's active and previous version of each model: promotion switches, rollback reverts locally.

``versions.json`` in the state directory maps a model name to ``{"active": hash, "previous": hash}``.
Activating a version makes the active one previous; reverting swaps them back. Both bundles stay
held (content-addressed under ``bundles/``), so a rollback needs no download, and the reverted
version is byte for byte the bundle that was active before, so its outputs are exactly the old ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .device import DeviceError, DeviceState, _atomic_write

VERSIONS_FILE = "versions.json"
MAX_MODELS = 1024  # names a device tracks, at most (the file is read whole)


@dataclass(frozen=True)
class Versions:
    active: str | None
    previous: str | None


def read_versions(state: DeviceState) -> dict[str, Versions]:
    path = state.root / VERSIONS_FILE
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_bytes()[: 1 << 20])
        out = {str(k): Versions(v.get("active"), v.get("previous")) for k, v in raw.items()}
    except (ValueError, AttributeError, TypeError) as e:
        raise DeviceError(f"{path} is unreadable ({e})") from None
    if len(out) > MAX_MODELS:
        raise DeviceError(f"{path} tracks more than {MAX_MODELS} models")
    return out


def _write(state: DeviceState, versions: dict[str, Versions]) -> None:
    body = {k: {"active": v.active, "previous": v.previous} for k, v in sorted(versions.items())}
    _atomic_write(state.root / VERSIONS_FILE, json.dumps(body, sort_keys=True).encode())


def activate(state: DeviceState, name: str, content_hash: str, base: str | None = None) -> Versions:
    """Make the held bundle ``content_hash`` the active version of ``name``; the one it replaces (``base``
    when given: the version the rollout compares against, also held) becomes previous."""
    for h in (content_hash, base):
        if h is not None and not state.bundle_path(h).is_file():
            raise DeviceError(f"bundle {h[:12]} is not held: a version is activated only once held")
    versions = read_versions(state)
    current = versions.get(name, Versions(None, None))
    if current.active == content_hash:
        return current
    if name not in versions and len(versions) >= MAX_MODELS:
        raise DeviceError(f"this device already tracks {MAX_MODELS} models")
    versions[name] = Versions(content_hash, base or current.active)
    _write(state, versions)
    return versions[name]


def revert(state: DeviceState, name: str, expected: str | None = None) -> Versions:
    """Switch ``name`` back to its previous version, which the device still holds (no download);
    ``expected``: the version the coordinator means to restore (refused if the previous is another)."""
    current = read_versions(state).get(name)
    if current is None or current.previous is None:
        raise DeviceError(f"model {name!r} has no previous version to revert to")
    if expected is not None and current.active == expected:
        return current  # already reverted: a repeated rollback (a resumed run) changes nothing
    if expected is not None and current.previous != expected:
        raise DeviceError(f"the previous version of {name!r} is {current.previous[:12]}, not {expected[:12]}")
    if not state.bundle_path(current.previous).is_file():
        raise DeviceError(f"the previous version {current.previous[:12]} of {name!r} is no longer held")
    versions = read_versions(state)
    versions[name] = Versions(current.previous, current.active)
    _write(state, versions)
    return versions[name]
