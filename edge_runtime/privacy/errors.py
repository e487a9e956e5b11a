"""Typed refusals: a device that will not release answers with a code and a fixed reason, no metrics.

The reply carries ``code`` and ``reason`` only (both from closed sets, never data); ``detail`` is for
the device's own log.
"""

from __future__ import annotations

import enum

from ...compiler.errors import CuvilError


class RefusalCode(enum.Enum):
    BUDGET_EXHAUSTED = "DP_BUDGET_EXHAUSTED"
    PARAMS_REJECTED = "DP_PARAMS_REJECTED"
    LEDGER_UNAVAILABLE = "DP_LEDGER_UNAVAILABLE"


class Reason(enum.Enum):
    """Why, in a word a coordinator may see: a closed set, independent of the device's data."""

    MISSING = "missing"  # a required request field is absent
    WRONG_TYPE = "wrong_type"  # not a number / not an integer / not a string where one is needed
    NOT_FINITE = "not_finite"  # NaN or an infinity
    OUT_OF_RANGE = "out_of_range"  # negative, zero where positive is needed, or beyond a hard cap
    BELOW_FLOOR = "below_floor"  # less noise than this device's floor
    ABOVE_BUDGET = "above_budget"  # a larger ε or δ than this device's budget
    BAD_RELEASE_ID = "bad_release_id"  # empty, too long, or with control characters
    RELEASE_REBOUND = "release_rebound"  # a charged release-id asked again with other parameters or bundle
    RELEASE_LOST = "release_lost"  # charged, but its reply was never stored (crash): never re-noised
    BUDGET_SPENT = "budget_spent"  # this release would push ε past the budget
    LEDGER_BROKEN = "ledger_broken"  # missing, unreadable, corrupt, rolled back or unwritable


class PrivacyRefusal(CuvilError):
    def __init__(self, code: RefusalCode, reason: Reason, detail: str = ""):
        self.code = code
        self.reason = reason
        self.detail = detail
        super().__init__(f"{code.value}: {reason.value}")
