"""On-device differential privacy for evaluation reports (``docs/privacy.md``).

Metrics leave a device only as noised integer sums (discrete Gaussian, cryptographic randomness),
charged to a persistent ledger before any noise is drawn; a device whose budget is spent refuses.
"""

from .errors import PrivacyRefusal, RefusalCode
from .mechanism import DEFAULT_PARAMS, NoisyReport, PrivacyParams, decode_reports, encode_sums

__all__ = [
    "DEFAULT_PARAMS", "NoisyReport", "PrivacyParams", "PrivacyRefusal", "RefusalCode",
    "decode_reports", "encode_sums",
]
