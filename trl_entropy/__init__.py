"""Entropy-control trainers for Hugging Face TRL.

The public names load on first use (PEP 562), so that ``import trl_entropy`` and its light submodules (the run report,
the toy task) start without importing TRL's trainers; the TRL version is checked at import all the same.
"""

import importlib

from .core.trl.pin import check_trl_version


check_trl_version()  # the only thing the import does besides defining names: no warning or logging filter changes

# public name -> the module that defines it; each method's own names come from its declaration (methods/spec.py)
_PUBLIC = {
    "CompletionBatch": ".core.batch",
    "EntropyGRPOConfig": ".methods",  # from the registry, which lets them combine methods (entropy_control)
    "Controller": ".core.control",
    "EntropyGRPOTrainer": ".core.trainer",
    "EntropyLaw": ".evaluation",
    "EntropyLawCallback": ".evaluation",
    "PassAtKCallback": ".evaluation",
    "evaluate_pass_at_k": ".evaluation",
    "fit_entropy_law": ".evaluation",
    "pass_at_k": ".evaluation",
    "pass_at_k_values": ".evaluation",
}

__version__ = "0.4.0"


def _method_names() -> dict:
    """The methods' public names -> their objects, read from the registry (which imports TRL's trainers)."""
    from .methods import SPECS

    return {name: value for spec in SPECS for name, value in spec.public.items()}


def __getattr__(name: str):
    if name == "__all__":  # `from trl_entropy import *`
        return sorted(set(_PUBLIC) | set(_method_names()))
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
    elif not name.startswith("__") and name in (methods := _method_names()):
        value = methods[name]
    else:
        raise AttributeError(f"module 'trl_entropy' has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC) | set(_method_names()))
