"""On-device fine-tuning with DP-SGD (Opacus). torch and opacus are optional: only :mod:`.dpsgd` and
:mod:`.torch_graph` import them, and only when a device trains; importing this package needs neither.
"""

from .capability import TRAINING_MEMORY_MIB, TrainingCapability, training_capability
from .config import DpSgdConfig
from .errors import TrainingError, TrainingUnsupported

__all__ = ["DpSgdConfig", "TRAINING_MEMORY_MIB", "TrainingCapability", "TrainingError", "TrainingUnsupported",
           "training_capability"]
