"""The methods, one file each, and their registry: what `--method` names in `examples/train.py` and the demo.

Each method file reads top to bottom: its math as pure functions, its controller, its part (the seams of the loss step
it fills, `trl_entropy.core.parts.MethodPart`), its config (which names the part), its trainer (the base trainer with
the method's config as its default), and last its declaration, a `MethodSpec` (`methods/spec.py`). The registry
(`methods/registry.py`) is built from the declarations, one import line per method; `EntropyGRPOConfig`
(`methods/combined.py`) has every method's config as a base. docs/adding_a_method.md says how to add a method.
"""

from ..core.places import PLACES
from .combined import EntropyGRPOConfig
from .compose import SEPARATOR, combine, in_axis_order
from .registry import FIELD_OWNERS, GRPO, METHODS, SPECS
from .spec import MethodSpec, Metric, Neutral, Place, Sweep, Variant


__all__ = [
    "EntropyGRPOConfig",
    "FIELD_OWNERS",
    "GRPO",
    "METHODS",
    "SPECS",
    "MethodSpec",
    "Metric",
    "Neutral",
    "PLACES",
    "Place",
    "Sweep",
    "Variant",
    "combination",
    "get_method",
]


def get_method(name: str) -> MethodSpec:
    """The registered method called ``name``, or the combination ``name`` joins with ``+`` (``"NAME+NAME"``); a
    ValueError lists the valid names otherwise."""
    if SEPARATOR in name:
        return combination(name.split(SEPARATOR))
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {sorted(METHODS)}")
    return METHODS[name]


_COMBINATIONS: dict[tuple[str, ...], MethodSpec] = {}


def combination(names) -> MethodSpec:
    """The methods ``names`` acting together (in any order; the same object for the same set): a ValueError says
    what to change where they cannot."""
    ordered = in_axis_order(names, METHODS)
    if ordered not in _COMBINATIONS:
        _COMBINATIONS[ordered] = combine(ordered, METHODS, EntropyGRPOConfig)
    return _COMBINATIONS[ordered]
