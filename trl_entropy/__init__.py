"""Entropy-control trainers for Hugging Face TRL."""

from ._compat import check_trl_version


check_trl_version()

__version__ = "0.1.0"
