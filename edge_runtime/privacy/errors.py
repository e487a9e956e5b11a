"""Typed refusals: a device that will not release answers with one of these and no metrics."""

from __future__ import annotations

import enum

from ...compiler.errors import CuvilError


class RefusalCode(enum.Enum):
    BUDGET_EXHAUSTED = "DP_BUDGET_EXHAUSTED"
    PARAMS_REJECTED = "DP_PARAMS_REJECTED"
    LEDGER_UNAVAILABLE = "DP_LEDGER_UNAVAILABLE"


class PrivacyRefusal(CuvilError):
    def __init__(self, code: RefusalCode, reason: str):
        self.code = code
        super().__init__(f"{code.value}: {reason}")
