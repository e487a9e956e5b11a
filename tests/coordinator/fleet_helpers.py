"""Shared set-up for coordinator tests: keys, small signed bundles (no torch), provisioned devices."""

from __future__ import annotations

from pathlib import Path

from cuvil import api
from cuvil.fleet_example import digits_mlp


def make_keys(root: Path, name: str = "author"):
    return api.keygen(root / "keys", name, force=True)


def make_bundle(root: Path, keys, version: str = "1", seed: int = 0, epochs: int = 8) -> Path:
    path = root / f"digits-v{version}.cuvil"
    api.export(digits_mlp(seed, epochs=epochs), path, keys.private_path, name="digits-mlp", version=version)
    return path
