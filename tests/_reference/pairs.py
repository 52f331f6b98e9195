"""The pair table's pieces (``tests/compose/test_pairs.py``): what the float64 loss step of methods combined
(``combined_reference.py``) and the table of refused pairs need of each method, declared once per method module as
``PAIR = PairReference(...)`` at the end of its test file, ``tests/methods/test_<module>.py``, and found here by
importing every such file. A piece is written by hand from the method's paper and docs (docs/composing.md for its
axis), never read from the method's code: the pair test checks the code against it.
"""

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch


ROOT = Path(__file__).resolve().parents[2]
METHOD_TESTS = ROOT / "tests" / "methods"


@dataclass(frozen=True)
class PairMethod:
    """One registry name: the axis it acts on, as docs/composing.md names it; whether it acts through the PPO clip or
    its surrogate replaces that clip (the two are refused together); its float64 formula at each stage of the loss step
    where it acts, called by ``combined_reference.py`` with the arguments that file's stage function names, and
    ``s``, the run's settings; and ``thresholds``, the settings it chooses from the batch's own values, called with
    the batch's log-probs, the pair's token advantages and the completion mask, returning ``{field: value}``."""

    axis: str
    acts_through_clip: bool = False
    replaces_clip: bool = False
    group_baseline: Callable | None = None
    rollout_rejection: Callable | None = None
    token_advantages: Callable | None = None
    surrogate: Callable | None = None
    gate: Callable | None = None
    regulariser: Callable | None = None
    thresholds: Callable | None = None


@dataclass(frozen=True)
class PairReference:
    """A method module's piece of the pair table: the settings of its names in the pair runs, one ``PairMethod`` per
    registry name, and the pairs of its own names that are refused, with what the refusal says."""

    settings: dict
    methods: dict[str, PairMethod]
    refused: dict[tuple[str, str], str] = field(default_factory=dict)


def method_references() -> dict[str, PairReference]:
    """``PAIR`` of every ``tests/methods/test_*.py`` that declares one, by the file's path from the repository root.

    Each file is imported as pytest imports it (its folder on ``sys.path``, its file name as the module's name), so a
    file that pytest collects in the same run is one module, its asserts rewritten."""
    if str(METHOD_TESTS) not in sys.path:
        sys.path.insert(0, str(METHOD_TESTS))
    modules = {path: importlib.import_module(path.stem) for path in sorted(METHOD_TESTS.glob("test_*.py"))}
    return {str(path.relative_to(ROOT)): module.PAIR for path, module in modules.items() if hasattr(module, "PAIR")}


def widest_gap(values: torch.Tensor) -> tuple[float, int]:
    """The middle of the widest gap between the sorted middle half of ``values``, and how many values lie above it: a
    threshold with margins far above rounding."""
    ordered = values.sort(descending=True).values
    quarter = len(ordered) // 4
    gaps = ordered[quarter : -quarter - 1] - ordered[quarter + 1 : len(ordered) - quarter]
    index = quarter + int(gaps.argmax())
    return float((ordered[index] + ordered[index + 1]) / 2), index + 1
