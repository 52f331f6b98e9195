"""The places of GRPO's step where a method acts, in the one order they run, each with its rule for combining the
answers of several methods' parts.

This table is the single ordering the library has: ``EntropyGRPOTrainer`` asks its parts place by place in this order
and combines their answers by the place's rule (:func:`fold`); a combination of methods is ordered by the first place
each acts on (its axis), and refused where two methods take an axis that admits one; docs/composing.md's table of
places is written from it.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum


class Rule(str, Enum):
    """How the answers of several parts at one place combine with the value the step starts from. A part that answers
    None contributes nothing."""

    FIRST = "first"  # the first answer is the value; the parts after it are not asked
    LAST = "last"  # every part is asked; the last answer is the value
    SUM = "sum"  # every answer is added to the value
    MAX = "max"  # the largest of the value and the answers
    CHAIN = "chain"  # every part is asked in turn, given the value so far; each answer acts on it


class Place(str, Enum):
    """Where in GRPO's step a method acts (``PLACES`` gives each its seam, its rule and its order)."""

    GROUP_BASELINE = "group_baseline"
    ROLLOUT_REJECTION = "rollout_rejection"
    CLAMP_FRACTION = "clamp_fraction"
    TOP_P = "top_p"
    ADVANTAGES = "advantages"
    CLIP_RANGE = "clip_range"
    SURROGATE = "surrogate"
    KL = "kl"
    GATES = "gates"
    REGULARISER = "regulariser"


@dataclass(frozen=True)
class PlaceRule:
    """One place: ``seam``, the method of ``core.parts.MethodPart`` a part fills it through; ``title``, what the docs
    and the errors call it; ``rule``, how several parts' answers combine; ``axis``, whether a method may take it as
    its axis (the first place its declaration acts on): two methods on one axis are refused unless ``several``;
    ``when``, the stage of the step that asks it; ``reports_metrics``, whether the seam returns ``(answer,
    metrics)`` rather than its answer alone."""

    seam: str
    title: str
    rule: Rule
    when: str
    axis: bool = True
    several: bool = False
    reports_metrics: bool = True


GENERATION = "each generation batch"
SCORING = "scoring, each micro-batch"
LOSS = "the loss, each micro-batch"

# Every place, in the order the step asks it.
PLACES: dict[Place, PlaceRule] = {
    Place.GROUP_BASELINE: PlaceRule("group_baseline", "group baseline", Rule.LAST, GENERATION),
    Place.ROLLOUT_REJECTION: PlaceRule("reject_rollouts", "rollout rejection", Rule.CHAIN, GENERATION),
    Place.CLAMP_FRACTION: PlaceRule(
        "clamp_fraction", "clamped entropy", Rule.MAX, SCORING, axis=False, reports_metrics=False
    ),
    Place.TOP_P: PlaceRule("top_p_rule", "top-p entropy", Rule.FIRST, SCORING, axis=False, reports_metrics=False),
    Place.ADVANTAGES: PlaceRule("token_advantages", "per-token advantage", Rule.LAST, LOSS),
    Place.CLIP_RANGE: PlaceRule("clip_range", "clip bound", Rule.FIRST, LOSS, reports_metrics=False),
    Place.SURROGATE: PlaceRule("surrogate", "surrogate", Rule.FIRST, LOSS),
    Place.KL: PlaceRule("penalty", "per-token penalty", Rule.SUM, LOSS, axis=False),
    Place.GATES: PlaceRule("gate", "stop-gradient gates", Rule.CHAIN, LOSS, several=True),
    Place.REGULARISER: PlaceRule("regulariser", "entropy regulariser", Rule.SUM, LOSS),
}
# The places a method may take as its axis, numbered from 1 in the step's order.
AXIS_ORDER: dict[Place, int] = {
    place: number for number, place in enumerate((place for place, rule in PLACES.items() if rule.axis), start=1)
}


def fold(rule: Rule, asks: Iterable[Callable], start, apply: Callable | None = None):
    """The value a place gives, from ``start`` and the parts' answers: ``asks`` holds one callable per part, in the
    parts' order, taking the value so far and returning the part's answer (None: nothing). ``apply(answer, value)``
    is how an answer acts on the value for ``SUM`` (default: added) and ``CHAIN`` (default: it replaces the value)."""
    value = start
    for ask in asks:
        answer = ask(value)
        if answer is None:
            continue
        if rule is Rule.FIRST:
            return answer
        if rule is Rule.LAST:
            value = answer
        elif rule is Rule.MAX:
            value = max(value, answer)
        elif rule is Rule.SUM:
            value = value + answer if apply is None else apply(answer, value)
        else:
            value = answer if apply is None else apply(answer, value)
    return value
