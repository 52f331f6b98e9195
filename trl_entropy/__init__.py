"""Entropy-control trainers for Hugging Face TRL.

The public names load on first use (PEP 562), so that ``import trl_entropy`` and its light submodules (the run report,
the toy task) start without importing TRL's trainers; the TRL version is checked at import all the same.
"""

import importlib

from ._compat import check_trl_version
from .upstream_noise import hide_known_upstream_noise


check_trl_version()
hide_known_upstream_noise()

# public name -> the module that defines it
_PUBLIC = {
    "CompletionBatch": ".core.batch",
    "EntropyGRPOConfig": ".core.config",
    "Controller": ".core.control",
    "EntropyGRPOTrainer": ".core.trainer",
    "EntropyLaw": ".evaluation",
    "EntropyLawCallback": ".evaluation",
    "PassAtKCallback": ".evaluation",
    "evaluate_pass_at_k": ".evaluation",
    "fit_entropy_law": ".evaluation",
    "pass_at_k": ".evaluation",
    "pass_at_k_values": ".evaluation",
    "ADAPOConfig": ".methods.adapo",
    "ADAPOController": ".methods.adapo",
    "ADAPOTrainer": ".methods.adapo",
    "AEntConfig": ".methods.aent",
    "AEntController": ".methods.aent",
    "AEntTrainer": ".methods.aent",
    "ClipCovConfig": ".methods.clip_cov",
    "ClipCovTrainer": ".methods.clip_cov",
    "KLCovConfig": ".methods.kl_cov",
    "KLCovTrainer": ".methods.kl_cov",
    "QAEConfig": ".methods.qae",
    "QAETrainer": ".methods.qae",
    "REPOConfig": ".methods.repo",
    "REPOController": ".methods.repo",
    "REPOTrainer": ".methods.repo",
}

__version__ = "0.1.0"
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'trl_entropy' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
