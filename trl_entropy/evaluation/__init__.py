"""What entropy control buys, measured: pass@k on held-out prompts and the entropy–reward law."""

from .entropy_law import EntropyLaw, EntropyLawCallback, fit_entropy_law
from .pass_at_k import PassAtKCallback, evaluate_pass_at_k, pass_at_k, pass_at_k_values


__all__ = [
    "EntropyLaw",
    "EntropyLawCallback",
    "PassAtKCallback",
    "evaluate_pass_at_k",
    "fit_entropy_law",
    "pass_at_k",
    "pass_at_k_values",
]
