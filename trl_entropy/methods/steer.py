"""STEER: token reweighting by the estimated entropy change (Hao, Wang et al., "Rethinking Entropy Interventions in
RLVR: An Entropy Change Perspective", arXiv:2510.10150; the authors' code,
github.com/zz-haooo/STEER at commit b31df71, ``compute_token_weights`` and ``compute_policy_loss_with_entropy`` in
``verl/trainer/ppo/core_algos.py``; docs/steer.md).

Each token's surrogate is multiplied by a weight without gradient, smaller where the token is estimated to change the
policy's entropy more. With ``p_t = exp(ℓ_t)`` (this pass, detached), ``p^old_t = exp(ℓ^old_t)``, the rollout policy's
entropy ``H^old_t`` and the token advantage ``A_t`` the surrogate multiplies:

    Ω_t = (A_t / p^old_t) · p_t (1 − p_t) · (log p_t + H^old_t),    μ_t = |Ω_t|    (a non-finite Ω_t counts as 0),

and with ``μ_min``, ``μ_max`` over the micro-batch's valid tokens, either the exponential mapping

    κ = −ln λ_min / max(μ_max, 0.02),    w_t = clamp(exp(−κ μ_t), λ_min, 1)

(the token with the largest ``|Ω|`` gets ``λ_min`` where ``μ_max ≥ 0.02``) or the authors' linear one,
``w_t = clamp(w_max − (μ_t − μ_min)(w_max − w_min)/(μ_max − μ_min), w_min, w_max)`` (``(w_min + w_max)/2`` where all
``μ`` are equal); ``w_t = 0`` at masked positions. The loss is the ``loss_type``'s aggregation of ``w_t · L_t``, its
normaliser unchanged. Unlike ERC it acts on-policy too: there ``Ω_t = A_t (1 − p_t)(ℓ_t + H_t)``, which still varies.
"""

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.batch import CompletionBatch
from ..core.citation import Paper, method_paper, model_card_tags
from ..core.config import EntropyGRPOBaseConfig, Range, config_field
from ..core.parts import Gathered, MethodPart, Metrics, TokenGate, TokenMean
from ..core.trainer import EntropyGRPOTrainer
from .spec import MethodDocs, MethodSpec, Metric, Neutral, Place, Sweep


STEER_MAPPINGS = ("exponential", "linear")
# The authors' floor on μ_max in κ, and their clamps of the probabilities (core_algos.py at b31df71).
MU_MAX_FLOOR = 0.02
PROBABILITY_FLOOR = 1e-8


def steer_omega(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, old_entropy: torch.Tensor, advantages: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Ω, finite)``: STEER's estimate of each token's entropy change (arXiv:2510.10150; the authors' code at
    b31df71), in float32 from the log-probs, without gradient, 0 where it is not finite; ``finite`` marks where it was.
    ``1 − p`` is ``−expm1(ℓ)``, floored at 1e-8 as the authors floor it."""
    log_probs = log_probs.detach().float()
    p = log_probs.exp().clamp(PROBABILITY_FLOOR, 1 - PROBABILITY_FLOOR)
    one_minus_p = (-torch.expm1(log_probs)).clamp(min=PROBABILITY_FLOOR)
    p_old = old_log_probs.detach().float().exp().clamp(PROBABILITY_FLOOR, 1.0)
    advantages = advantages.detach().float().expand_as(log_probs)
    omega = advantages / p_old * p * one_minus_p * (p.log() + old_entropy.detach().float())
    finite = torch.isfinite(omega)
    return torch.where(finite, omega, torch.zeros_like(omega)), finite


def steer_weights(
    omega: torch.Tensor, mask: torch.Tensor, mapping: str, weight_min: float, weight_max: float = 1.2
) -> torch.Tensor:
    """STEER's weights ``w_t`` from ``Ω`` over the valid tokens of ``mask`` (0 elsewhere): the exponential mapping
    ``clamp(exp(−κ|Ω|), λ_min, 1)`` with ``κ = −ln λ_min / max(μ_max, 0.02)``, or the linear min-max one between
    ``weight_min`` and ``weight_max``."""
    mu = omega.abs()
    valid = mask.bool()
    if not valid.any():
        return torch.zeros_like(mu)
    mu_min, mu_max = mu[valid].min(), mu[valid].max()
    if mapping == "exponential":
        kappa = -math.log(weight_min) / max(float(mu_max), MU_MAX_FLOOR)
        weights = torch.exp(-kappa * mu).clamp(weight_min, 1.0)
    elif mu_max > mu_min:
        weights = weight_max - (mu - mu_min) * (weight_max - weight_min) / (mu_max - mu_min)
        weights = weights.clamp(weight_min, weight_max)
    else:
        weights = torch.full_like(mu, (weight_min + weight_max) / 2)
    return torch.where(valid, weights, torch.zeros_like(weights))


class STEERPart(MethodPart):
    """STEER's seam: a weight without gradient on each token's surrogate."""

    key = "steer"
    needs_rollout_entropy = True

    def gate(
        self, batch: CompletionBatch, ratio: torch.Tensor, token_advantages: torch.Tensor
    ) -> tuple[TokenGate, Metrics]:
        args = self.args
        omega, finite = steer_omega(batch.log_probs, batch.old_log_probs, batch.old_entropy, token_advantages)
        weights = steer_weights(omega, batch.mask, args.steer_mapping, args.steer_weight_min, args.steer_weight_max)
        valid = batch.mask.bool()
        # This rank's extremes (±inf without a valid token), the world's after the step.
        if valid.any():
            lowest, highest, omega_max = weights[valid].min(), weights[valid].max(), omega.abs()[valid].max()
        else:
            lowest, highest, omega_max = weights.new_tensor(math.inf), *weights.new_tensor([-math.inf] * 2)
        metrics = {
            "steer/weight_mean": TokenMean(weights, batch.mask),
            "steer/weight_min": Gathered(lowest.detach().reshape(1), lambda values: values.min().item()),
            "steer/weight_max": Gathered(highest.detach().reshape(1), lambda values: values.max().item()),
            "steer/omega_abs_mean": TokenMean(omega.abs(), batch.mask),
            "steer/omega_abs_max": Gathered(omega_max.detach().reshape(1), lambda values: values.max().item()),
            "steer/nonfinite_fraction": TokenMean((~finite).float(), batch.mask),
        }
        return TokenGate(weight=weights.to(batch.log_probs.dtype)), metrics


@dataclass
class STEERConfig(EntropyGRPOBaseConfig):
    r"""
    Configuration for [`STEERTrainer`]: [`EntropyGRPOBaseConfig`] plus STEER's token weights (arXiv:2510.10150).

    Parameters:
        steer_mapping (`str`, *optional*, defaults to `"exponential"`):
            `"exponential"` (the paper's form, the authors' `run_exp.sh`) or `"linear"` (their function's default).
        steer_weight_min (`float`, *optional*, defaults to `0.8`):
            `λ_min` of the exponential mapping (`0 < λ_min ≤ 1`), `w_min` of the linear one; both scripts' 0.8.
        steer_weight_max (`float`, *optional*, defaults to `1.2`):
            `w_max` of the linear mapping (`≥ w_min`); the authors' function default. Unused by the exponential one.
    """

    method_parts: ClassVar[tuple[type, ...]] = (STEERPart,)

    steer_mapping: str = config_field(
        "exponential",
        "Mapping from the estimated entropy change |Omega| to the token weight: 'exponential' (clamp(exp(-kappa "
        "|Omega|), weight_min, 1), the paper's and the authors' run_exp.sh) or 'linear' (min-max between "
        "steer_weight_min and steer_weight_max, the authors' run_linear.sh and their function's default).",
        choices=STEER_MAPPINGS,
    )
    steer_weight_min: float = config_field(
        0.8,
        "Smallest token weight: lambda_min of the exponential mapping (0 < lambda_min <= 1; the token with the "
        "largest |Omega| gets it), w_min of the linear one (>= 0). 0.8 in both of the authors' scripts.",
        valid=Range(0),
    )
    steer_weight_max: float = config_field(
        1.2,
        "Largest token weight of the linear mapping, w_max >= steer_weight_min (the authors' function default 1.2); "
        "the exponential mapping's largest weight is 1 and takes no field.",
        valid=Range(0),
    )

    def check_settings(self) -> None:
        if self.steer_mapping == "exponential" and not 0 < self.steer_weight_min <= 1:
            raise ValueError(
                f"steer_weight_min={self.steer_weight_min!r} is invalid for steer_mapping='exponential': it must lie "
                "in (0, 1], the weight of the token with the largest estimated entropy change."
            )
        if self.steer_mapping == "exponential" and self.steer_weight_max != 1.2:
            raise ValueError(
                f"steer_weight_max={self.steer_weight_max!r} would be ignored: steer_mapping='exponential' caps the "
                "weights at 1. Leave it out, or set steer_mapping='linear'."
            )
        if self.steer_mapping == "linear" and self.steer_weight_max < self.steer_weight_min:
            raise ValueError(
                f"steer_weight_max={self.steer_weight_max!r} is below steer_weight_min={self.steer_weight_min!r}; the "
                "linear mapping needs steer_weight_min <= steer_weight_max."
            )
        if self.importance_sampling_level != "token":
            raise ValueError(
                f"importance_sampling_level={self.importance_sampling_level!r} is not supported by STEER: its weight "
                "is a per-token quantity, and with a sequence-level ratio the loss is one per sequence. Use "
                "importance_sampling_level='token'."
            )


class STEERTrainer(EntropyGRPOTrainer):
    """GRPO whose per-token surrogate is weighted, without gradient, by STEER's estimate of each token's entropy change
    (arXiv:2510.10150). Takes the same arguments as `trl.GRPOTrainer`; `args` must be a [`STEERConfig`]."""

    config_class = STEERConfig
    paper = Paper(
        "hao2025steer", "Rethinking Entropy Interventions in RLVR: An Entropy Change Perspective", "2510.10150", 2025
    )
    _name = "STEER"
    _paper = method_paper(paper)
    _tag_names = model_card_tags("steer")


SPEC = MethodSpec(
    key="steer",
    config_class=STEERConfig,
    trainer_class=STEERTrainer,
    description="STEER: each token's surrogate weighted by its estimated entropy change",
    acts_on=(Place.GATES,),
    metrics=(
        Metric("steer/weight_mean", "STEER: mean token weight (steer/weight_mean)", "weight", smooth=True),
        Metric("steer/weight_min"),
        Metric("steer/weight_max"),
        Metric("steer/omega_abs_mean"),
        Metric("steer/omega_abs_max"),
        Metric("steer/nonfinite_fraction"),
    ),
    neutral=Neutral(ours={"steer_weight_min": 1.0}),  # λ_min = 1: every weight is 1
    normalises_per_micro_batch=True,  # κ (exponential) or the min-max range (linear) is the micro-batch's
    docs=MethodDocs(
        summary="each token's update weighted down where it is estimated to change the entropy most",
        choose_when="no controller, on-policy too: each token's update weighted down where it is estimated to change "
        "the entropy most",
        sources="the formula, both mappings and the defaults from the authors' code (`zz-haooo/STEER` at `b31df71`)",
    ),
    # The toy sweep: the smallest weight from the authors' 0.8 down.
    sweep=Sweep({"steer_weight_min": [0.8, 0.5, 0.2]}),
)
