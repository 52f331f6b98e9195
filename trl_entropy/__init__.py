"""Entropy-control trainers for Hugging Face TRL."""

from ._compat import check_trl_version


check_trl_version()

from .base import CompletionBatch, EntropyGRPOConfig, EntropyGRPOTrainer  # noqa: E402 (after the TRL version check)
from .controllers import Controller  # noqa: E402


__version__ = "0.1.0"
__all__ = ["CompletionBatch", "Controller", "EntropyGRPOConfig", "EntropyGRPOTrainer"]
