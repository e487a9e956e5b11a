"""The coordinator's signed updates: a version pushed as a delta from one the device holds.

Every bundle the coordinator pushes is remembered (by content hash); when a device lacks the version
a message needs but holds an earlier one of the same model, it gets a delta from the most recently
pushed version it holds, signed by the coordinator's key (``signing-key``), made once per pair and
sent only when smaller than the bundle. Without a key, or for a device that holds no earlier
version, the full bundle goes; a device that refuses a delta (it lacks the parent, or the delta did
not verify) gets the full bundle next (:data:`.messages.Code.DELTA_FALLBACK`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..compiler.bundle import load_private_key, make_delta
from ..compiler.errors import BundleError

MAX_KNOWN = 8  # versions remembered as parents, at most (the oldest forgotten first): each is a whole bundle in memory


class Version(Protocol):
    """What a delta needs of a version (:class:`.rounds.BundleRef` has it)."""

    name: str
    content_hash: str
    data: bytes


@dataclass
class WireBytes:
    """What the pushes cost on the wire, and what full bundles would have: for the demo and benchmarks."""

    full: int = 0  # bundle bytes sent whole
    delta: int = 0  # delta bytes sent
    replaced: int = 0  # bundle bytes those deltas stood in for
    deltas: int = 0  # deltas sent
    not_smaller: int = 0  # pushes to a device holding a parent whose delta was not smaller than the bundle


class DeltaBook:
    def __init__(self, key_path: str = ""):
        self.key_path, self._key = key_path, None
        self.known: dict[str, Version] = {}  # content hash -> bundle, oldest first
        self._made: dict[tuple[str, str], bytes | None] = {}
        self.wire = WireBytes()

    def know(self, bundle: Version) -> None:
        self.known.pop(bundle.content_hash, None)
        self.known[bundle.content_hash] = bundle
        while len(self.known) > MAX_KNOWN:
            del self.known[next(iter(self.known))]

    def parent(self, target: Version, held: Collection[str]) -> Version | None:
        """The latest known version of ``target``'s model in ``held`` (None without a key: no delta is signed)."""
        self.know(target)
        if not self.key_path:
            return None
        return next((b for h, b in reversed(self.known.items())
                     if h in held and h != target.content_hash and b.name == target.name), None)

    def delta_for(self, target: Version, held: Collection[str]) -> bytes | None:
        """A signed delta to ``target`` from :meth:`parent`, or None (no parent, or not smaller than the bundle)."""
        parent = self.parent(target, held)
        if parent is None:
            return None
        pair = (parent.content_hash, target.content_hash)
        if pair not in self._made:
            try:
                data = make_delta(parent.data, target.data, self.key())
            except BundleError:  # a bundle the coordinator cannot diff goes whole
                data = None
            self._made = {k: v for k, v in self._made.items() if k[1] == target.content_hash}  # one target's at a time
            self._made[pair] = data if data is not None and len(data) < len(target.data) else None
        return self._made[pair]

    def key(self) -> Any:
        if self._key is None:
            self._key = load_private_key(Path(self.key_path).expanduser())
        return self._key

    def payload(self, target: Version, held: Collection[str], full: bool = False) -> tuple[bytes | None, bytes | None]:
        """(bundle, delta) to push to a device holding ``held`` that lacks ``target``: one of them is None;
        ``full``: the bundle (after the device refused a delta)."""
        delta = None if full else self.delta_for(target, held)
        bundle = target.data if delta is None else None
        if bundle is not None and not full and self.parent(target, held) is not None:
            self.wire.not_smaller += 1
        self._count(bundle, delta, target)
        return bundle, delta

    def _count(self, bundle: bytes | None, delta: bytes | None, target: Version) -> None:
        if delta is not None:
            self.wire.delta += len(delta)
            self.wire.replaced += len(target.data)
            self.wire.deltas += 1
        elif bundle is not None:
            self.wire.full += len(bundle)
