"""What entropy control buys, measured: pass@k on held-out prompts (``passk``), the entropy–reward law
(``entropy_law``) and intervals over seeds and held-out problems (``bootstrap``). The names load on first use, so
the law's fit and the intervals can be used without importing torch."""

import importlib


_PUBLIC = {
    "EntropyLaw": ".entropy_law",
    "Interval": ".bootstrap",
    "bootstrap_difference": ".bootstrap",
    "bootstrap_mean": ".bootstrap",
    "resampled_means": ".bootstrap",
    "EntropyLawCallback": ".entropy_law",
    "EntropyLawFit": ".entropy_law",
    "entropy_law_fit": ".entropy_law",
    "fit_entropy_law": ".entropy_law",
    "PassAtKCallback": ".passk",
    "count_correct": ".passk",
    "evaluate_pass_at_k": ".passk",
    "pass_at_k": ".passk",
    "pass_at_k_values": ".passk",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'trl_entropy.evaluation' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
