"""A fine-tuned version's lineage: where it came from and what privacy it cost, signed in its manifest.

A bundle made by federated fine-tuning names its parent version (by content hash, so the lineage
cannot point at a different model with the same version string), how many training rounds and
devices made it, and the largest ε any contributing device had spent (on the dataset it trained
on) with its δ. The manifest carries no floating-point numbers, so ε and δ are decimal text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import BundleError

FIELDS = ("parent", "parent_version", "rounds", "devices", "epsilon", "delta", "method")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_DECIMAL = re.compile(r"(0|[1-9][0-9]{0,8})(\.[0-9]{1,12})?(e-[0-9]{1,3})?")
_MAX_TEXT = 200
_MAX_COUNT = 1 << 31


@dataclass(frozen=True)
class Lineage:
    parent: str  # content hash of the version this one was fine-tuned from
    parent_version: str
    rounds: int  # training rounds aggregated into this version
    devices: int  # distinct devices whose updates went into it
    epsilon: str  # the largest ε a contributing device had spent, after its last update (decimal text)
    delta: str  # the δ of that ε (decimal text)
    method: str = "dp-sgd (opacus) + fedavg (flower)"

    def __post_init__(self) -> None:
        if not isinstance(self.parent, str) or not _HEX64.fullmatch(self.parent):
            raise BundleError("lineage.parent must be a content hash (64 lowercase hex digits)")
        for name in ("parent_version", "method"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or len(value) > _MAX_TEXT or not value.isprintable():
                raise BundleError(f"lineage.{name} must be printable text of 1 to {_MAX_TEXT} characters")
        for name in ("rounds", "devices"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_COUNT:
                raise BundleError(f"lineage.{name} must be an integer in [0, {_MAX_COUNT})")
        for name in ("epsilon", "delta"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _DECIMAL.fullmatch(value):
                raise BundleError(f"lineage.{name} must be a non-negative decimal such as '1.25' or '1e-06'")

    @classmethod
    def of(cls, parent: str, parent_version: str, rounds: int, devices: int, epsilon: float, delta: float,
           method: str | None = None) -> Lineage:
        """A lineage from numbers (ε rounded up in its 6th decimal: never shown smaller than it was)."""
        extra = {} if method is None else {"method": method}
        return cls(parent, parent_version, rounds, devices, _decimal(math.ceil(epsilon * 1e6) / 1e6),
                   _decimal(delta), **extra)

    @property
    def epsilon_value(self) -> float:
        return float(self.epsilon)

    @property
    def delta_value(self) -> float:
        return float(self.delta)

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FIELDS}

    @classmethod
    def from_json(cls, value: Any) -> Lineage:
        if not isinstance(value, Mapping) or set(value) != set(FIELDS):
            raise BundleError(f"lineage must be an object with exactly the fields {', '.join(FIELDS)}")
        return cls(**{name: value[name] for name in FIELDS})


def _decimal(x: float) -> str:
    """Decimal text the manifest accepts: plain up to 12 decimals, or mantissa-exponent for tiny values."""
    if not (math.isfinite(x) and x >= 0):
        raise BundleError(f"lineage numbers must be finite and non-negative, got {x!r}")
    if x != 0 and x < 1e-4:
        mantissa, exponent = f"{x:.6e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e-{int(exponent[1:]):02d}"
    text = f"{x:.12f}".rstrip("0").rstrip(".")
    return text or "0"
