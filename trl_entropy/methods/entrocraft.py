"""Entrocraft: entropy-scheduled rejection of rollouts (Li et al., "Addressing Performance Saturation for LLM RL via
Precise Entropy Curve Control", arXiv:2604.26326; the authors' code, github.com/lblaoke/entrocraft at commit 26165bd,
``verl/trainer/ppo/core_algos.py`` and ``ray_trainer.py``; docs/entrocraft.md).

Once per generation cycle ``k`` of ``K``, the generation batch's mean entropy ``H̄_k`` (the rollout policy's, over the
valid tokens of every rank) is held against a scheduled band ``[L_k, U_k]``, with ``u_k = (k + 1)/K`` and ``g(u) = u``
(linear), ``½(1 − cos πu)`` (cosine) or 0 (fixed):

    L_k = L_0 + (L_1 − L_0)·g(u_k),    U_k = U_0 + (U_1 − U_0)·g(u_k).

Above the band the cycle's negative rollouts are rejected, below it its positive ones (advantage 0, still counted in
the loss's normaliser): the authors' code (``"code"``) takes RAFT++ ``max(R − b₀, 0)`` above, NSR ``min(R − b₀, 0)``
below and GRPO's advantages inside, on the raw reward ``R``; the estimator-agnostic form of the paper's abstract
(``"sign"``, ours) zeroes the group baseline's ``A < 0`` above the band and ``A > 0`` below it.
"""

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.citation import Paper, method_paper, model_card_tags
from ..core.config import EntropyGRPOBaseConfig, Range, config_field
from ..core.control import Controller, LastCycleMean
from ..core.parts import MethodPart, warn_beside_entropy_drivers
from ..core.trainer import EntropyGRPOTrainer
from ..core.warn import warn_user
from .spec import MethodDocs, MethodSpec, Metric, Neutral, Place, Sweep, Variant


BAND = ("entrocraft_lower_start", "entrocraft_lower_end", "entrocraft_upper_start", "entrocraft_upper_end")
# The toy sweep: bands that follow the toy's entropy down (0.58 nats at the start; GRPO's about 0.2 after 400 steps).
TOY_BANDS = [
    dict(zip(BAND, b, strict=True)) for b in ((0.45, 0.3, 0.55, 0.4), (0.5, 0.4, 0.6, 0.5), (0.4, 0.2, 0.5, 0.3))
]
# The branch of a cycle, as logged: negatives rejected (RAFT++), none, positives rejected (NSR).
ABOVE, INSIDE, BELOW = 1, 0, -1


def entrocraft_band(
    lower: tuple[float, float], upper: tuple[float, float], shape: str, cycle: int, cycles: int
) -> tuple[float, float]:
    """``(L_k, U_k)`` of cycle ``cycle`` (0-based) of ``cycles``: each bound moves from its start to its end by
    ``g(u)``, ``u = (k + 1)/K`` (the authors' clock: the end values in the last cycle)."""
    progress = min((cycle + 1) / max(cycles, 1), 1.0)
    moved = {"linear": progress, "cosine": 0.5 * (1 - math.cos(math.pi * progress)), "fixed": 0.0}[shape]
    return lower[0] + (lower[1] - lower[0]) * moved, upper[0] + (upper[1] - upper[0]) * moved


def entrocraft_branch(mean_entropy: float, low: float, high: float) -> int:
    """``ABOVE`` (+1) when the entropy exceeds the band, ``BELOW`` (−1) under it, ``INSIDE`` (0) within it."""
    return ABOVE if mean_entropy > high else BELOW if mean_entropy < low else INSIDE


def entrocraft_advantages(
    rewards: torch.Tensor, advantages: torch.Tensor, branch: int, variant: str, reward_offset: float = 0.0
) -> torch.Tensor:
    """The cycle's advantages after rejection. ``"code"``: RAFT++ ``max(R − b₀, 0)`` above the band, NSR
    ``min(R − b₀, 0)`` below it, ``advantages`` inside; an unscorable reward (NaN) gives 0. ``"sign"``: ``advantages``
    with the negative ones zeroed above the band, the positive ones below it."""
    if branch == INSIDE:
        return advantages
    if variant == "sign":
        keep = advantages >= 0 if branch == ABOVE else advantages <= 0
        return torch.where(keep, advantages, torch.zeros_like(advantages))
    shifted = torch.nan_to_num(rewards - reward_offset, nan=0.0).to(advantages.dtype)
    return shifted.clamp(min=0.0) if branch == ABOVE else shifted.clamp(max=0.0)


class EntrocraftPart(MethodPart):
    """Entrocraft's seam: each generation batch's rollouts rejected by its entropy against the cycle's band."""

    key = "entrocraft"
    needs_rollout_entropy = True
    warned_offset = False  # the warning that a cycle trains nothing comes once

    def controllers(self) -> list[Controller]:
        previous_cycle = self.args.entrocraft_entropy_source == "previous_cycle"
        return [LastCycleMean(self.key, "entropy")] if previous_cycle else []

    def reject_rollouts(self, rewards: torch.Tensor, advantages: torch.Tensor, batch: dict):
        args, trainer = self.args, self.trainer
        rollout = args.entrocraft_entropy_source == "rollout"
        entropy = trainer.generation_batch_entropy(batch) if rollout else trainer.controllers[self.key].value
        lower = (args.entrocraft_lower_start, args.entrocraft_lower_end)
        upper = (args.entrocraft_upper_start, args.entrocraft_upper_end)
        low, high = entrocraft_band(lower, upper, args.entrocraft_shape, *trainer.generation_cycle())
        branch = INSIDE if entropy is None else entrocraft_branch(entropy, low, high)
        if branch == BELOW and args.entrocraft_variant == "code":
            self.warn_if_nothing_moves(trainer.accelerator.gather(rewards))
        rejected = entrocraft_advantages(
            rewards, advantages, branch, args.entrocraft_variant, args.entrocraft_reward_offset
        )
        metrics = {"entrocraft/lower": low, "entrocraft/upper": high, "entrocraft/branch": float(branch)}
        metrics["entrocraft/in_band_fraction"] = float(branch == INSIDE)
        metrics["entrocraft/zero_advantage_fraction"] = (
            (trainer.accelerator.gather(rejected) == 0).float().mean().item()
        )
        metrics |= {} if entropy is None else {"entrocraft/entropy": entropy}
        return rejected, metrics

    def warn_if_nothing_moves(self, rewards: torch.Tensor) -> None:
        """NSR keeps only ``R − b₀ < 0``: with rewards that never fall below the offset, every advantage is 0."""
        if self.warned_offset or (rewards < self.args.entrocraft_reward_offset).any():  # NaN (unscorable) is not below
            return
        self.warned_offset = True
        warn_user(
            "Entrocraft rejects this cycle's positive rollouts (its entropy is below the band), but no reward is "
            f"below entrocraft_reward_offset={self.args.entrocraft_reward_offset!r}, so every advantage is 0 and the "
            "cycle trains nothing. The authors' rewards are ±1; with 0/1 rewards set entrocraft_reward_offset=0.5."
        )


@dataclass
class EntrocraftConfig(EntropyGRPOBaseConfig):
    r"""
    Configuration for [`EntrocraftTrainer`]: every field of [`EntropyGRPOBaseConfig`] plus Entrocraft's scheduled band.
    Defaults: the authors' reference run (Qwen3-4B-Base); the band is in nats at the sampling temperature and specific
    to the model. Parameters: each field's `help`; docs/entrocraft.md (the authors' other bands too).
    """

    method_parts: ClassVar[tuple[type, ...]] = (EntrocraftPart,)

    entrocraft_variant: str = config_field(
        "code",
        "'code' (the authors' code: above the band RAFT++ max(R - offset, 0), below it NSR min(R - offset, 0), inside "
        "it GRPO's own advantages; on the group-baseline axis) or 'sign' (ours, the estimator-agnostic form of the "
        "paper's abstract: the group baseline's advantages with the negative ones zeroed above the band and the "
        "positive ones below it; on the rollout-rejection axis, after any group baseline).",
        choices=("code", "sign"),
    )
    entrocraft_shape: str = config_field(
        "linear",
        "How the band moves from its start to its end values: 'linear' (the authors' reference run), 'cosine' "
        "(g(u) = (1 - cos(pi u))/2) or 'fixed' (the start values throughout).",
        choices=("linear", "cosine", "fixed"),
    )
    entrocraft_lower_start: float = config_field(
        0.6, "Lower bound L_0 of the band in the first cycle (nats); the authors' reference run.", valid=Range(0)
    )
    entrocraft_lower_end: float = config_field(
        0.4, "Lower bound L_1 of the band in the last cycle (nats); the authors' reference run.", valid=Range(0)
    )
    entrocraft_upper_start: float = config_field(
        0.7,
        "Upper bound U_0 >= L_0 of the band in the first cycle (nats); the authors' reference run.",
        valid=Range(0),
    )
    entrocraft_upper_end: float = config_field(
        0.5, "Upper bound U_1 >= L_1 of the band in the last cycle (nats); the authors' reference run.", valid=Range(0)
    )
    entrocraft_reward_offset: float = config_field(
        0.0,
        "Offset b_0 of the 'code' variant's raw branches, max(R - b_0, 0) and min(R - b_0, 0). 0 is the authors' "
        "(their rewards are +-1); with 0/1 rewards 0.5 gives their sign pattern at half the scale.",
        valid=Range(unbounded_because="a shift of the rewards, whatever their scale"),
    )
    entrocraft_entropy_source: str = config_field(
        "rollout",
        "Where the cycle's entropy comes from: 'rollout' (the authors': the generation batch's rollout entropy; one "
        "pass without gradient per cycle where TRL computes no rollout log-probs) or 'previous_cycle' (ours: the "
        "previous cycle's training entropy; free, one cycle late: the first cycle keeps GRPO's advantages).",
        choices=("rollout", "previous_cycle"),
    )

    def check_settings(self) -> None:
        for end, cycle in (("start", "first"), ("end", "last")):
            low, high = getattr(self, f"entrocraft_lower_{end}"), getattr(self, f"entrocraft_upper_{end}")
            if low > high:
                raise ValueError(
                    f"entrocraft_lower_{end}={low!r} is above entrocraft_upper_{end}={high!r}: the band of the "
                    f"{cycle} cycle is empty. Set entrocraft_lower_{end} <= entrocraft_upper_{end}."
                )
        unused = {"entrocraft_lower_end", "entrocraft_upper_end"} if self.entrocraft_shape == "fixed" else set()
        unused |= {"entrocraft_reward_offset"} if self.entrocraft_variant == "sign" else set()
        changed = [
            name
            for name in sorted(unused)
            if getattr(self, name) != EntrocraftConfig.__dataclass_fields__[name].default
        ]
        ignored = [f"{name}={getattr(self, name)!r}" for name in changed]
        if ignored:
            raise ValueError(
                f"{', '.join(ignored)} would be ignored: entrocraft_shape='fixed' holds the start values throughout, "
                "and entrocraft_variant='sign' shifts no reward. Leave it out, or take the shape or variant using it."
            )
        warn_beside_entropy_drivers(self, EntrocraftPart, "Entrocraft holds the entropy in its band")

    def reads_max_steps(self) -> bool:
        return EntropyGRPOBaseConfig.reads_max_steps(self) or self.entrocraft_shape != "fixed"  # K moves the band


class EntrocraftTrainer(EntropyGRPOTrainer):
    """GRPO whose rollouts are rejected, once per generation cycle, by the batch's entropy against a scheduled band
    (arXiv:2604.26326). Takes the same arguments as `trl.GRPOTrainer`; `args` must be an [`EntrocraftConfig`]."""

    config_class = EntrocraftConfig
    paper = Paper(
        "li2026entrocraft",
        "Addressing Performance Saturation for LLM RL via Precise Entropy Curve Control",
        "2604.26326",
        2026,
        "Li and others",
    )
    _name = "Entrocraft"
    _paper = method_paper(paper)
    _tag_names = model_card_tags("entrocraft")


SPEC = MethodSpec(
    key="entrocraft",
    config_class=EntrocraftConfig,
    trainer_class=EntrocraftTrainer,
    variants={
        # The authors' switch replaces GRPO's baseline in two of its branches: it takes the group-baseline axis.
        "entrocraft": Variant(
            "Entrocraft: RAFT++ / GRPO / NSR switched by the entropy's band",
            {"entrocraft_variant": "code"},
            acts_on=(Place.GROUP_BASELINE,),
            sweep=Sweep(TOY_BANDS, fixed={"entrocraft_reward_offset": 0.5}),  # the toy's 0/1 rewards: ±0.5 as ±1
        ),
        "entrocraft_sign": Variant(
            "Entrocraft (sign): advantages of one sign rejected by the entropy's band",
            {"entrocraft_variant": "sign"},
        ),
    },
    acts_on=(Place.ROLLOUT_REJECTION,),
    metrics=(
        Metric("entrocraft/branch", "Entrocraft: branch (+1 negatives rejected, −1 positives)", "branch"),
        Metric("entrocraft/entropy"),
        Metric("entrocraft/lower", target_label="Entrocraft band, lower"),
        Metric("entrocraft/upper", target_label="Entrocraft band, upper"),
        Metric("entrocraft/zero_advantage_fraction"),
        Metric("entrocraft/in_band_fraction"),
    ),
    docs=MethodDocs(
        summary="the batch's negative or positive rollouts rejected each cycle, by its entropy against a moving band",
        choose_when="the entropy made to follow a curve you draw in nats, by rejecting rollouts, with no coefficient",
        sources="the band, its schedules, the switch and the defaults from the authors' code (`lblaoke/entrocraft` "
        "at `26165bd`); the sign form is the abstract's",
    ),
    # The band [0.1, 5] in the first of two cycles, [0, 0] in the second: GRPO's advantages, then negatives rejected.
    short_run_settings=dict(zip(BAND, (0.2, 0.0, 10.0, 0.0), strict=True)),
    # A band that holds every entropy: every cycle keeps GRPO's advantages.
    neutral=Neutral(ours=dict(entrocraft_shape="fixed", entrocraft_lower_start=0.0, entrocraft_upper_start=1e9)),
    sweep=Sweep(TOY_BANDS),
)
