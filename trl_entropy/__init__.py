"""Entropy-control trainers for Hugging Face TRL."""

from ._compat import check_trl_version


check_trl_version()

# The imports below come after the TRL version check on purpose.
from .core.batch import CompletionBatch  # noqa: E402
from .core.config import EntropyGRPOConfig  # noqa: E402
from .core.control import Controller  # noqa: E402
from .core.trainer import EntropyGRPOTrainer  # noqa: E402
from .evaluation import (  # noqa: E402
    EntropyLaw,
    EntropyLawCallback,
    PassAtKCallback,
    evaluate_pass_at_k,
    fit_entropy_law,
    pass_at_k,
    pass_at_k_values,
)
from .methods.adapo import ADAPOConfig, ADAPOController, ADAPOTrainer  # noqa: E402
from .methods.aent import AEntConfig, AEntController, AEntTrainer  # noqa: E402
from .methods.clip_cov import ClipCovConfig, ClipCovTrainer  # noqa: E402
from .methods.kl_cov import KLCovConfig, KLCovTrainer  # noqa: E402
from .methods.repo import REPOConfig, REPOController, REPOTrainer  # noqa: E402


__version__ = "0.1.0"
__all__ = [
    "ADAPOConfig",
    "ADAPOController",
    "ADAPOTrainer",
    "AEntConfig",
    "AEntController",
    "AEntTrainer",
    "ClipCovConfig",
    "ClipCovTrainer",
    "CompletionBatch",
    "Controller",
    "EntropyGRPOConfig",
    "EntropyGRPOTrainer",
    "EntropyLaw",
    "EntropyLawCallback",
    "KLCovConfig",
    "KLCovTrainer",
    "PassAtKCallback",
    "REPOConfig",
    "REPOController",
    "REPOTrainer",
    "evaluate_pass_at_k",
    "fit_entropy_law",
    "pass_at_k",
    "pass_at_k_values",
]
