"""Why a device does not fine-tune a model: typed, so the reply carries a code and fixed words only."""

from __future__ import annotations

from ...compiler.errors import CuvilError


class TrainingError(CuvilError):
    """On-device fine-tuning cannot run here (no torch/opacus, too little memory, a bad weights update)."""


class TrainingUnsupported(TrainingError):
    """The model holds ops or weights that on-device DP-SGD cannot train (named in the message)."""
