"""Entropy-control trainers for Hugging Face TRL."""

from ._compat import check_trl_version


check_trl_version()

# The imports below come after the TRL version check on purpose.
from .adapo import ADAPOConfig, ADAPOController, ADAPOTrainer  # noqa: E402
from .aent import AEntConfig, AEntController, AEntTrainer  # noqa: E402
from .base import CompletionBatch, EntropyGRPOConfig, EntropyGRPOTrainer  # noqa: E402
from .controllers import Controller  # noqa: E402
from .cov import ClipCovConfig, ClipCovTrainer, KLCovConfig, KLCovTrainer  # noqa: E402
from .evaluation import (  # noqa: E402
    EntropyLaw,
    EntropyLawCallback,
    PassAtKCallback,
    evaluate_pass_at_k,
    fit_entropy_law,
    pass_at_k,
    pass_at_k_values,
)
from .repo import REPOConfig, REPOController, REPOTrainer  # noqa: E402


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
