"""AEnt: a clamped-entropy bonus with an adaptive coefficient ("On Entropy Control in LLM-RL Algorithms",
arXiv:2509.03493; docs/aent.md). The loss of each micro-batch is

    L = L_GRPO − λ · (Σ_t m_t H^c_t / Σ_t m_t)

where ``H^c_t`` is the entropy of the policy renormalised over the tokens left after dropping the ``floor(p·V)``
smallest logits (the clamped entropy, computed by the fused kernel in the same pass as the log-probs), and ``λ``
moves after every generation cycle (paper eq. 4.1, the reference AReaL recipe ``recipe/AEnt``):

    λ ← clip(λ − α · (min(0, H̄ − H_low) + max(0, H̄ − H_high)), λ_min, λ_max)

with ``H̄`` the cycle's token-mean clamped entropy over all its micro-batches and all ranks. ``λ`` rises while
``H̄ < H_low``, falls while ``H̄ > H_high`` and holds inside the band; band and box may follow ``aent_schedule``.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.batch import CompletionBatch
from ..core.bounds import ScheduledBounds
from ..core.citation import Paper, method_paper, model_card_tags
from ..core.config import EntropyGRPOBaseConfig, Range, config_field, reject_trl_entropy_bonus
from ..core.control import Controller
from ..core.parts import MethodPart, Metrics
from ..core.statistics import masked_mean
from ..core.trainer import EntropyGRPOTrainer
from .spec import MethodDocs, MethodSpec, Metric, Neutral, Place, Sweep


__all__ = ["AEntConfig", "AEntController", "AEntTrainer", "aent_coefficient_step"]
BOUND_METRICS = ("aent/h_low", "aent/h_high", "aent/coef_min", "aent/coef_max")  # logged while scheduled
BAND_AND_BOX = (("aent_entropy_low", "aent_entropy_high"), ("aent_coef_min", "aent_coef_max"))
AENT_BOUNDS = ScheduledBounds("aent_schedule", BAND_AND_BOX, "aent_adaptive", {"aent_coef_init": BAND_AND_BOX[1]})


def aent_coefficient_step(
    coef: float, mean_clamped_entropy: float, low: float, high: float, lr: float, coef_min: float, coef_max: float
) -> float:
    """One step of AEnt's coefficient controller (paper eq. 4.1): ``λ − lr · (min(0, H̄ − low) + max(0, H̄ − high))``
    clipped to ``[coef_min, coef_max]``: it rises by ``lr · (low − H̄)`` below the band, falls by ``lr · (H̄ − high)``
    above it, and holds inside it."""
    direction = min(0.0, mean_clamped_entropy - low) + max(0.0, mean_clamped_entropy - high)
    return min(max(coef - lr * direction, coef_min), coef_max)


class AEntController(Controller):
    """The AEnt coefficient ``λ``, moved by :func:`aent_coefficient_step` after each generation cycle.

    The update applies only when ``adaptive`` is on and the optimizer step that ends the cycle is past
    ``warmup_steps`` (``step > warmup_steps``, 1-based). Its statistic is the mean clamped entropy, or the full
    entropy when the clamp fraction is 0 (the two are then equal and the kernel computes only the latter).
    """

    name = "aent"
    statistic = "clamped_entropy"

    def __init__(self, coef, low, high, lr, coef_min, coef_max, warmup_steps=0, adaptive=True, statistic=statistic):
        self.value = self.coef_init = float(coef)
        self.low, self.high, self.lr = low, high, lr
        self.coef_min, self.coef_max = coef_min, coef_max
        self.warmup_steps, self.adaptive = warmup_steps, adaptive
        self.statistic = statistic

    @classmethod
    def from_config(cls, args: "AEntConfig") -> "AEntController":
        statistic = "clamped_entropy" if args.aent_clamp_fraction > 0 else "entropy"
        low, high, coef_min, coef_max = AENT_BOUNDS.widest(args).values()  # a resumed λ lies within the run's widest
        band = (low, high, args.aent_coef_lr, coef_min, coef_max)
        return cls(args.aent_coef_init, *band, args.aent_warmup_steps, args.aent_adaptive, statistic)

    def coef_in(self, bounds: tuple[float, float, float, float]) -> float:
        """``λ`` in the box of the scheduled ``(H_low, H_high, λ_min, λ_max)``."""
        return min(max(self.value, bounds[2]), bounds[3])

    def take_bounds(self, bounds: tuple[float, float, float, float]) -> None:
        """Take ``(H_low, H_high, λ_min, λ_max)``, ``λ`` into the box: the next update uses them."""
        (self.low, self.high, self.coef_min, self.coef_max), self.value = bounds, self.coef_in(bounds)

    def follow_schedule(self, trainer) -> None:
        if AENT_BOUNDS.moves(trainer.args):  # the running step's band and box (before the first: the widest)
            self.take_bounds(tuple(AENT_BOUNDS.now(trainer).values()))

    def update(self, mean_statistic: float, step: int) -> None:
        if not self.adaptive or step <= self.warmup_steps:
            return
        self.value = aent_coefficient_step(
            self.value, mean_statistic, self.low, self.high, self.lr, self.coef_min, self.coef_max
        )

    def state_dict(self) -> dict:
        return {"coef": self.value}

    def load_state_dict(self, state: dict) -> None:
        if "coef" not in state:
            raise KeyError(f"AEnt controller state {state!r} has no 'coef'")
        coef = min(max(float(state["coef"]), self.coef_min), self.coef_max)  # into the (new) config's (widest) box
        self.value = coef if self.adaptive else self.coef_init  # fixed: the config's value applies

    def metrics(self) -> dict[str, float]:
        return {"aent/coef": self.value}


class AEntPart(MethodPart):
    """AEnt's seams: the clamped entropy, the controller, and the bonus: ``−λ`` times the clamped entropy's token mean
    over the micro-batch (the full one when ``p = 0``), over the tokens TRL's high-entropy filter keeps (as TRL's)."""

    key = "aent"

    def controllers(self) -> list[Controller]:
        return [AEntController.from_config(self.args)]

    def clamp_fraction(self) -> float:
        return self.args.aent_clamp_fraction

    def regulariser(self, batch: CompletionBatch) -> tuple[torch.Tensor, Metrics]:
        entropy = batch.entropy if batch.clamped_entropy is None else batch.clamped_entropy
        mask = batch.mask if batch.entropy_mask is None else batch.mask * batch.entropy_mask
        controller, mean = self.trainer.controllers[AEntController.name], masked_mean(entropy, mask)
        if not AENT_BOUNDS.moves(self.args):
            return -controller.value * mean, {}
        bounds = tuple(AENT_BOUNDS.now(self.trainer).values())
        metrics = dict(zip(BOUND_METRICS, bounds, strict=True)) if batch.mode == "train" else {}
        return -controller.coef_in(bounds) * mean, metrics


@dataclass
class AEntConfig(EntropyGRPOBaseConfig):
    r"""
    Configuration for [`AEntTrainer`]: every field of [`EntropyGRPOBaseConfig`] plus AEnt's clamped-entropy bonus.

    Defaults are the reference implementation's (AReaL `recipe/AEnt`), except `aent_warmup_steps` (its run used 29).

    Parameters (each field's `help` says more):
        aent_clamp_fraction (`float`, defaults to `0.3`): fraction `p` of the vocabulary dropped, `0 ≤ p < 1`.
        aent_coef_init, aent_coef_lr (`float`, default to `2e-4`, `1e-3`): initial coefficient `λ_0`, its rate `α`.
        aent_entropy_low, aent_entropy_high (`float`, default to `0.05`, `0.23`): the band `[H_low, H_high]`.
        aent_coef_min, aent_coef_max (`float`, default to `1e-5`, `3e-3`): the box `[λ_min, λ_max]` of `λ`.
        aent_warmup_steps (`int`, defaults to `0`): optimizer steps during which `λ` stays at `λ_0`.
        aent_adaptive (`bool`, defaults to `True`): move `λ`; `False` keeps `λ = λ_0` (the box is then unused).
        aent_schedule (`str`, defaults to `"constant"`): moves the band and box to their `*_final` (docs/aent.md).
    """

    method_parts: ClassVar[tuple[type, ...]] = (AEntPart,)

    aent_clamp_fraction: float = config_field(
        0.3,
        "AEnt clamp fraction p: the floor(p*V) smallest logits of each position are dropped before the clamped "
        "entropy is computed; 0 <= p < 1, 0 gives the full entropy. Default: the reference implementation (AReaL "
        "recipe/AEnt).",
        valid=Range(0, 1, "[)"),
    )
    aent_coef_init: float = config_field(
        2e-4,
        "Initial coefficient lambda_0 of the clamped-entropy bonus. Must lie in [aent_coef_min, aent_coef_max] when "
        "aent_adaptive is on; any value >= 0 when it is off. Default: the reference implementation (AReaL "
        "recipe/AEnt).",
        valid=Range(0),
    )
    aent_entropy_low: float = config_field(
        0.05,
        "Lower edge H_low of the clamped-entropy band: while the step's mean clamped entropy is below it, the "
        "coefficient rises. Default: the reference implementation (AReaL recipe/AEnt).",
        valid=Range(0),
    )
    aent_entropy_high: float = config_field(
        0.23,
        "Upper edge H_high of the clamped-entropy band: while the step's mean clamped entropy is above it, the "
        "coefficient falls. Default: the reference implementation (AReaL recipe/AEnt).",
        valid=Range(0),
    )
    aent_coef_lr: float = config_field(
        1e-3,
        "Learning rate alpha of the coefficient controller (>= 0). Default: the reference implementation (AReaL "
        "recipe/AEnt).",
        valid=Range(0),
    )
    aent_coef_min: float = config_field(
        1e-5,
        "Lower bound lambda_min of the coefficient box (>= 0). Default: the reference implementation (AReaL "
        "recipe/AEnt).",
        valid=Range(0),
    )
    aent_coef_max: float = config_field(
        3e-3,
        "Upper bound lambda_max of the coefficient box (>= aent_coef_min). Default: the reference implementation "
        "(AReaL recipe/AEnt).",
        valid=Range(),
    )
    aent_warmup_steps: int = config_field(
        0,
        "Optimizer steps during which the coefficient stays at aent_coef_init; it is updated after each generation "
        "cycle whose last optimizer step's 1-based index exceeds this. Default 0 from the reference implementation's "
        "defaults (its example run used 29).",
        valid=Range(0, integer=True),
    )
    aent_adaptive: bool = config_field(
        True,
        "Adapt the coefficient to keep the clamped entropy in [aent_entropy_low, aent_entropy_high]; False keeps it "
        "at aent_coef_init for the whole run. Default True (the paper's method).",
    )
    aent_schedule: str = AENT_BOUNDS.kind_field()
    aent_entropy_low_final: float | None = AENT_BOUNDS.final_field("aent_entropy_low")
    aent_entropy_high_final: float | None = AENT_BOUNDS.final_field("aent_entropy_high")
    aent_coef_min_final: float | None = AENT_BOUNDS.final_field("aent_coef_min")
    aent_coef_max_final: float | None = AENT_BOUNDS.final_field("aent_coef_max")
    aent_schedule_warmup_steps: int = AENT_BOUNDS.warmup_field()
    aent_schedule_decay_steps: int | None = AENT_BOUNDS.decay_field()

    def check_settings(self) -> None:
        AENT_BOUNDS.check(self)  # aent_coef_init in the box at the start too
        reject_trl_entropy_bonus(self, "AEnt")

    def reads_max_steps(self) -> bool:
        return EntropyGRPOBaseConfig.reads_max_steps(self) or AENT_BOUNDS.moves(self)


class AEntTrainer(EntropyGRPOTrainer):
    """GRPO with AEnt's clamped-entropy bonus and adaptive coefficient (see the module docstring). Takes the same
    arguments as `trl.GRPOTrainer`; `args` must be an [`AEntConfig`]."""

    config_class = AEntConfig
    paper = Paper("aent2025", "On Entropy Control in LLM-RL Algorithms", "2509.03493", 2025, note="ICLR 2026")
    _name = "AEnt"
    _paper = method_paper(paper)
    _tag_names = model_card_tags("aent")


SPEC = MethodSpec(
    key="aent",
    config_class=AEntConfig,
    trainer_class=AEntTrainer,
    description="AEnt: clamped-entropy bonus, adaptive coefficient",
    acts_on=(Place.REGULARISER, Place.CLAMP_FRACTION),
    metrics=(
        Metric("aent/coef", "AEnt: entropy-bonus coefficient (aent/coef)", "coefficient"),
        Metric("entropy/clamped"),
        *(Metric(key) for key in BOUND_METRICS),
    ),
    neutral=Neutral(ours={"aent_coef_init": 0.0, "aent_adaptive": False}),
    docs=MethodDocs("an adaptive bonus on the top (1 − p) of the vocabulary's entropy", "the entropy held in a band"),
    exports=(AEntController,),
    # The toy sweep: the controller's step and box; the band stays [0.4, 0.5], around the toy policy's start 0.58 nats.
    sweep=Sweep(
        {"aent_coef_lr": [0.1, 1.0], "aent_coef_max": [0.05, 0.5]},
        fixed={"aent_entropy_low": 0.4, "aent_entropy_high": 0.5},
    ),
)
