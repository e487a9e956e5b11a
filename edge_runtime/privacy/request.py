"""Every number a coordinator sends, checked before anything else: finite, in range, of its type.

Values arrive from an untrusted peer (Flower ConfigRecords: ints, floats, strings, bools, bytes or
lists). Nothing is coerced or clamped: ``float("nan")``, ``"1e400"``, ``True`` or ``-3`` are refused
with a typed reason. 0 for σ or ε means "the device's own floor" (the only default).
"""

from __future__ import annotations

import math
from dataclasses import replace

from .errors import PrivacyRefusal, Reason, RefusalCode
from .ledger import PrivacyFloors
from .mechanism import DEFAULT_PARAMS, PrivacyParams

MAX_SIGMA = 1e6  # examples; beyond it a report is pure noise, and the integer variance stays small
MAX_EPSILON = 1e6
MAX_RELEASE_ID = 400


def _reject(reason: Reason, detail: str) -> PrivacyRefusal:
    return PrivacyRefusal(RefusalCode.PARAMS_REJECTED, reason, detail[:200])


def number(name: str, value: object, lo: float, hi: float) -> float:
    """A finite real in [lo, hi]; ints and floats only (no bools, no strings)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _reject(Reason.WRONG_TYPE, f"{name} must be a number, got {type(value).__name__}")
    if isinstance(value, int) and abs(value) > 2**63:
        raise _reject(Reason.OUT_OF_RANGE, f"{name} is out of range")
    value = float(value)
    if not math.isfinite(value):
        raise _reject(Reason.NOT_FINITE, f"{name} must be finite")
    if not lo <= value <= hi:
        raise _reject(Reason.OUT_OF_RANGE, f"{name} must be in [{lo:g}, {hi:g}], got {value:g}")
    return value


def integer(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _reject(Reason.WRONG_TYPE, f"{name} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise _reject(Reason.OUT_OF_RANGE, f"{name} must be in [{lo}, {hi}]")
    return int(value)


def release_id(value: object) -> str:
    """1-400 printable characters (it carries the coordinator's name for the device, whatever that is)."""
    if not isinstance(value, str):
        raise _reject(Reason.WRONG_TYPE if value is not None else Reason.MISSING, "release-id must be a string")
    if not 1 <= len(value) <= MAX_RELEASE_ID or not value.isprintable():
        raise _reject(Reason.BAD_RELEASE_ID, f"release-id must be 1-{MAX_RELEASE_ID} printable characters")
    return value


def resolve(sigma: object, epsilon: object, floors: PrivacyFloors) -> PrivacyParams:
    """The parameters a release will use: the request's, checked against the floors (0 = floor)."""
    s = number("dp-sigma", sigma, 0.0, MAX_SIGMA) or floors.min_sigma
    e = number("dp-epsilon", epsilon, 0.0, MAX_EPSILON) or floors.epsilon
    return check(replace(DEFAULT_PARAMS, sigma=s, epsilon=e, delta=floors.delta), floors)


def check(params: PrivacyParams, floors: PrivacyFloors) -> PrivacyParams:
    """Refuse parameters that are not finite and positive, or looser than the floors."""
    number("sigma", params.sigma, 1e-9, MAX_SIGMA)
    number("epsilon", params.epsilon, 1e-9, MAX_EPSILON)
    number("delta", params.delta, 1e-300, 0.5)
    number("loss clip", params.loss_clip, 1e-9, 1e6)
    integer("quantum", params.quantum, 1, 1 << 20)
    integer("max examples", params.max_examples, 1, 1 << 24)
    if params.sigma < floors.min_sigma:
        raise _reject(Reason.BELOW_FLOOR, f"sigma {params.sigma:g} is below this device's floor {floors.min_sigma:g}")
    if params.epsilon > floors.epsilon or params.delta > floors.delta:
        raise _reject(Reason.ABOVE_BUDGET, f"budget (ε={params.epsilon:g}, δ={params.delta:g}) exceeds this "
                                           f"device's (ε={floors.epsilon:g}, δ={floors.delta:g})")
    return params
