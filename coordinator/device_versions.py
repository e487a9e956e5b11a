"""A device's active and previous version of each model: promotion switches, rollback reverts locally.

``versions.json`` in the state directory maps a model name to ``{"active": hash, "previous": hash}``.
Activating a version makes the active one previous; reverting swaps them back. Both bundles stay
held (content-addressed under ``bundles/``), so a rollback needs no download, and the reverted
version is byte for byte the bundle that was active before, so its outputs are exactly the old ones.

The coordinator names the model, so one rule (:func:`_decode`) bounds the file on both sides: a name
is 1 to :data:`MAX_NAME_CHARS` printable characters (a bundle's own name limit), a version a SHA-256,
at most :data:`MAX_MODELS` names in at most :data:`MAX_FILE_BYTES`. A write the reader would refuse is
refused before it replaces the file, so no message can leave a file that later activations and
rollbacks cannot read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..compiler.bundle.format import MAX_NAME_CHARS, is_sha256_hex
from ..compiler.regular_file import read_regular
from .device import DeviceError, DeviceState, _atomic_write

VERSIONS_FILE = "versions.json"
MAX_MODELS = 1024  # names a device tracks, at most (the file is read whole)
# One entry at most: the name in UTF-8 (printable text, JSON-escaped within 4 bytes a character), two
# hashes and the JSON around them; so every file the writer may write is within what the reader reads.
_MAX_ENTRY_BYTES = 4 * MAX_NAME_CHARS + 3 * 64
MAX_FILE_BYTES = MAX_MODELS * _MAX_ENTRY_BYTES
_FIELDS = {"active", "previous"}


@dataclass(frozen=True)
class Versions:
    active: str | None
    previous: str | None


def valid_name(name: object) -> bool:
    """Whether ``name`` may name a model here: 1 to :data:`MAX_NAME_CHARS` printable characters."""
    return isinstance(name, str) and 1 <= len(name) <= MAX_NAME_CHARS and name.isprintable()


def _check_name(name: object) -> None:
    if not valid_name(name):
        raise DeviceError(f"a model name is 1 to {MAX_NAME_CHARS} printable characters")


def _decode(data: bytes) -> dict[str, Versions]:
    """The versions in a file's bytes; ValueError for anything the writer here never writes."""
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
    raw = json.loads(data)
    if not isinstance(raw, dict) or len(raw) > MAX_MODELS:
        raise ValueError(f"not a map of at most {MAX_MODELS} models")
    for name, v in raw.items():
        if not valid_name(name) or not isinstance(v, dict) or set(v) != _FIELDS or \
                not all(h is None or is_sha256_hex(h) for h in v.values()):
            raise ValueError("an entry is not a model name with its active and previous hashes")
    return {name: Versions(v["active"], v["previous"]) for name, v in raw.items()}


def read_versions(state: DeviceState) -> dict[str, Versions]:
    path = state.root / VERSIONS_FILE
    if not path.is_file():
        return {}
    try:
        return _decode(read_regular(path, MAX_FILE_BYTES))
    except (OSError, ValueError, RecursionError) as e:
        raise DeviceError(f"{path} is unreadable ({str(e)[:200]})") from None


def _write(state: DeviceState, versions: dict[str, Versions]) -> None:
    body = {k: {"active": v.active, "previous": v.previous} for k, v in sorted(versions.items())}
    data = json.dumps(body, sort_keys=True, ensure_ascii=False).encode()
    try:
        _decode(data)
    except ValueError as e:
        raise DeviceError(f"versions the reader would refuse are not written ({e})") from None
    _atomic_write(state.root / VERSIONS_FILE, data)


def activate(state: DeviceState, name: str, content_hash: str, base: str | None = None) -> Versions:
    """Make the held bundle ``content_hash`` the active version of ``name``; the one it replaces (``base``
    when given: the version the rollout compares against, also held) becomes previous."""
    _check_name(name)
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
    _check_name(name)
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
