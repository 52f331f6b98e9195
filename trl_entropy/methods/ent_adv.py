"""Entropy-based advantage shaping (Cheng et al., "Reasoning with Exploration: An Entropy Perspective",
arXiv:2506.14758, the entropy-based advantage ψ(H_t) and the shaped advantage A^shaped_t; docs/ent_adv.md).

Every token's advantage gains a bonus from the policy's full entropy at that position, detached, and capped by a
fraction of the advantage's own magnitude:

    ψ(H_t) = min(α · sg(H_t), |A_t| / κ),    A'_t = A_t + ψ(H_t),    α ≥ 0, κ > 1.

``H_t`` is the entropy of this forward pass (the loss step's own, so nothing extra is computed); ``sg`` stops its
gradient, so the term moves the advantage and never becomes an entropy bonus in the loss. ``A'`` replaces ``A``
everywhere in the surrogate. The cap keeps the sign: for ``A < 0``, ``A' ∈ [A, A(1 − 1/κ)]``; ``A = 0`` or
``H = 0`` leave the token as it is; ``α = 0`` is plain GRPO.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.batch import CompletionBatch
from ..core.citation import Paper, method_paper, model_card_tags
from ..core.config import EntropyGRPOBaseConfig, Range, config_field, reject_trl_entropy_bonus
from ..core.parts import MethodPart, Metrics, TokenMean
from ..core.trainer import EntropyGRPOTrainer
from .spec import MethodDocs, MethodSpec, Metric, Neutral, Place


def entropy_bonus(advantages: torch.Tensor, entropy: torch.Tensor, alpha: float, kappa: float) -> torch.Tensor:
    """The paper's entropy-based term ``ψ(H_t) = min(α · sg(H_t), |A_t| / κ)`` (arXiv:2506.14758).

    Args:
        advantages: ``(B, 1)`` (or ``(B,)``) per-sequence, or ``(B, T)`` per-token advantages ``A``.
        entropy: ``(B, T)`` full entropies ``H_t``; detached here.
        alpha: the entropy coefficient ``α ≥ 0``.
        kappa: the cap divisor ``κ > 1``.

    Returns:
        ``(B, T)``, no gradient.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    return torch.minimum(alpha * entropy.detach(), advantages.detach().abs() / kappa)


def entropy_shaped_advantages(
    advantages: torch.Tensor, entropy: torch.Tensor, alpha: float, kappa: float
) -> torch.Tensor:
    """The paper's shaped advantage ``A'_t = A_t + ψ(H_t)`` (arXiv:2506.14758), a new ``(B, T)`` tensor without
    gradient: ``advantages`` itself is left untouched."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    return advantages.detach() + entropy_bonus(advantages, entropy, alpha, kappa)


class EntropyAdvantagePart(MethodPart):
    """The shaping's seam: the token advantages."""

    key = "ent_adv"

    def token_advantages(self, batch: CompletionBatch) -> tuple[torch.Tensor, Metrics]:
        alpha, kappa = self.args.ent_adv_alpha, self.args.ent_adv_kappa
        shaped = entropy_shaped_advantages(batch.group_advantages, batch.entropy, alpha, kappa)
        # Where the cap |A|/κ is the smaller term; tokens with A = 0 (cap 0, nothing to shape) are not counted.
        capped = (batch.group_advantages.abs() / kappa < alpha * batch.entropy.detach()).float()
        metrics = {
            "ent_adv/mean_bonus": TokenMean(shaped - batch.group_advantages, batch.mask),
            "ent_adv/capped_fraction": TokenMean(capped, batch.mask * (batch.group_advantages != 0)),
        }
        return shaped, metrics


@dataclass
class EntropyAdvantageConfig(EntropyGRPOBaseConfig):
    r"""
    Configuration for [`EntropyAdvantageTrainer`]: [`EntropyGRPOBaseConfig`] plus the entropy-based advantage term.

    Parameters:
        ent_adv_alpha (`float`, *optional*, defaults to `0.4`):
            Coefficient `α` of the detached entropy in `ψ(H_t) = min(α·H_t, |A_t|/κ)` (paper: 0.4 with GRPO, 0.1 with
            PPO). `0` turns the term off (plain GRPO).
        ent_adv_kappa (`float`, *optional*, defaults to `2.0`):
            Cap divisor `κ > 1`: the term never exceeds `|A_t|/κ`, so it never flips the sign of the advantage
            (paper: 2).
    """

    method_parts: ClassVar[tuple[type, ...]] = (EntropyAdvantagePart,)

    ent_adv_alpha: float = config_field(
        0.4,
        "Coefficient alpha of the detached entropy in the advantage term min(alpha * H_t, |A_t| / kappa). 0.4 is the "
        "paper's value with GRPO (0.1 with PPO); 0 turns the term off (plain GRPO).",
        valid=Range(0),
        note="(0 turns the entropy term off)",
    )
    ent_adv_kappa: float = config_field(
        2.0,
        "Cap divisor kappa: the advantage term never exceeds |A_t| / kappa, so a negative advantage stays negative. 2 "
        "is the paper's value.",
        valid=Range(1, ends="()"),
        note="(the term is capped at |A| / kappa: below |A|, so a negative advantage keeps its sign)",
    )

    def check_settings(self) -> None:
        reject_trl_entropy_bonus(self, "EntropyAdvantage")


class EntropyAdvantageTrainer(EntropyGRPOTrainer):
    """GRPO whose advantages gain a capped, detached entropy term per token (arXiv:2506.14758).

    Takes the same arguments as `trl.GRPOTrainer`; `args` must be an [`EntropyAdvantageConfig`]. Every `loss_type`
    works: the shaped advantage replaces `A` in the surrogate of each.
    """

    config_class = EntropyAdvantageConfig
    paper = Paper(
        "cheng2025reasoning",
        "Reasoning with Exploration: An Entropy Perspective",
        "2506.14758",
        2025,
        "Daixuan Cheng and Shaohan Huang and Xuekai Zhu and Bo Dai and Wayne Xin Zhao and Zhenliang Zhang and "
        "Furu Wei",
        note='AAAI 2026; v3: "Reasoning with Exploration: An Entropy Perspective on Reinforcement Learning for LLMs"',
    )
    _name = "Entropy-based advantage shaping"
    _paper = method_paper(paper)
    _tag_names = model_card_tags("ent-adv")


SPEC = MethodSpec(
    key="ent_adv",
    config_class=EntropyAdvantageConfig,
    trainer_class=EntropyAdvantageTrainer,
    description="Entropy-based advantage shaping: A + min(alpha * H, |A| / kappa) per token",
    acts_on=(Place.ADVANTAGES,),
    metrics=(
        Metric("ent_adv/mean_bonus", "Entropy advantage: mean bonus A' − A (ent_adv/mean_bonus)", "advantage"),
        Metric(
            "ent_adv/capped_fraction",
            "Entropy advantage: tokens at the cap |A|/κ (ent_adv/capped_fraction)",
            "fraction of tokens with A ≠ 0",
            smooth=True,
        ),
    ),
    neutral=Neutral(ours={"ent_adv_alpha": 0.0}),
    docs=MethodDocs(
        summary="per-token advantages plus a capped, detached entropy term `min(α·H, |A|/κ)`",
        choose_when="no controller, more exploration on-policy: high-entropy tokens reinforced more, penalised less",
        sources="no public code, the formula and defaults from the paper",
    ),
)
