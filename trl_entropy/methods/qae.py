"""QAE: Quantile Advantage Estimation (Wu et al., "Quantile Advantage Estimation for Entropy-Safe Reasoning",
arXiv:2509.22611; v2 is titled "Quantile Advantage Estimation: Stabilizing RLVR for LLM Reasoning"; docs/qae.md).

QAE changes one thing in GRPO/DAPO: the baseline of each prompt group. Instead of the group mean it is the group's
K-quantile of the rewards,

    b = Q_K({r_1, …, r_G}),   A_i = r_i − b,

with the linear interpolation between order statistics of ``torch.quantile`` (position ``K·(G−1)`` in the sorted
rewards), as the authors' code computes it; the advantage is then scaled exactly as the run's ``scale_rewards`` says
(the group's or the batch's standard deviation around the mean, or not at all), as verl's GRPO advantage that the
authors' code modifies keeps its std normalisation. For binary rewards with success rate ``p`` the baseline gates the
group: on hard groups (``p ≤ 1 − K``) it is 0 and only the successes get a (positive) advantage; on easy groups
(``p > 1 − K``) it is 1 and only the failures get a (negative) one. Unscorable completions (a reward of None, NaN in
TRL) are left out of the quantile as TRL leaves them out of the mean (ours) and get advantage 0.

Provenance (the paper, the authors' code and how each part was confirmed): docs/qae.md.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.citation import Paper, method_paper, model_card_tags
from ..core.config import EntropyGRPOBaseConfig, Range, config_field, reject_trl_entropy_bonus
from ..core.parts import MethodPart, Metrics
from ..core.trainer import EntropyGRPOTrainer
from .spec import MethodDocs, MethodSpec, Metric, Place


def quantile_baseline(grouped_rewards: torch.Tensor, k: float) -> torch.Tensor:
    """QAE's baseline ``b = Q_K(r)`` of each group (arXiv:2509.22611; the authors' ``torch.quantile(scores, K)``).

    Args:
        grouped_rewards: ``(groups, G)`` rewards; NaN marks an unscorable completion, left out of its group's quantile.
        k: the quantile level ``K`` in ``(0, 1)``.

    Returns:
        ``(groups,)``: the ``K``-quantile of each group's valid rewards, linearly interpolated between the order
        statistics at ``⌊K(n−1)⌋`` and ``⌈K(n−1)⌉`` (``n`` valid rewards); NaN for a group with no valid reward.
    """
    return torch.nanquantile(grouped_rewards, k, dim=1, interpolation="linear")


def qae_gate_metrics(grouped_rewards: torch.Tensor, baseline: torch.Tensor) -> dict[str, float]:
    """What shows QAE's gate on one generation batch (docs/qae.md, "Metrics").

    * ``qae/zero_advantage_fraction``: the fraction of completions whose advantage is exactly 0: reward equal to its
      group's baseline, or unscorable;
    * ``qae/hard_group_fraction``: the fraction of groups whose rewards differ and whose baseline is the group's lowest
      reward, so that only completions above it get an advantage, all positive (binary rewards: ``b = 0``);
    * ``qae/easy_group_fraction``: the same with the highest reward: only completions below it get an advantage, all
      negative (binary rewards: ``b = 1``).

    Groups whose valid rewards are all equal get no advantage under any baseline and count in neither regime; nor do
    groups whose baseline lies strictly between their lowest and highest reward (interpolated, or non-binary rewards).
    """
    valid = ~torch.isnan(grouped_rewards)
    lowest = grouped_rewards.masked_fill(~valid, torch.inf).amin(dim=1)
    highest = grouped_rewards.masked_fill(~valid, -torch.inf).amax(dim=1)
    differ = lowest < highest
    zero = (grouped_rewards == baseline.unsqueeze(1)) | ~valid
    return {
        "qae/zero_advantage_fraction": zero.double().mean().item(),
        "qae/hard_group_fraction": (differ & (baseline == lowest)).double().mean().item(),
        "qae/easy_group_fraction": (differ & (baseline == highest)).double().mean().item(),
    }


class QAEPart(MethodPart):
    """QAE's seam: the group baseline."""

    key = "qae"

    def group_baseline(self, grouped_rewards: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
        baseline = quantile_baseline(grouped_rewards, self.args.qae_quantile_k)
        return baseline, qae_gate_metrics(grouped_rewards, baseline)


@dataclass
class QAEConfig(EntropyGRPOBaseConfig):
    r"""
    Configuration for [`QAETrainer`]: [`EntropyGRPOBaseConfig`] plus QAE's quantile level.

    Parameters:
        qae_quantile_k (`float`, *optional*, defaults to `0.4`):
            The quantile level `K` of the group baseline `b = Q_K(r)`, in `(0, 1)`. 0.4 is the value of the authors'
            training scripts (Qwen3-8B/14B-Base with DAPO). Smaller `K` lowers the baseline: more groups are "hard"
            (only successes reinforced); larger `K` raises it: more groups are "easy" (only failures penalised).
    """

    method_parts: ClassVar[tuple[type, ...]] = (QAEPart,)

    qae_quantile_k: float = config_field(
        0.4,
        "Quantile level K of QAE's group baseline b = Q_K(rewards), in (0, 1), linear interpolation between order "
        "statistics. 0.4 is the authors' training scripts' value (Qwen3-8B/14B-Base, DAPO).",
        valid=Range(0, 1, "()"),
        note="(the authors' code falls back to the mean outside (0, 1): use method grpo for that)",
    )

    def check_settings(self) -> None:
        reject_trl_entropy_bonus(self, "QAE")
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                "QAE needs multi_objective_aggregation='sum_then_normalize', got "
                f"{self.multi_objective_aggregation!r}: 'normalize_then_sum' centres the summed per-function "
                "z-scores on the batch mean, so there is no group of rewards whose quantile could replace the mean."
            )


class QAETrainer(EntropyGRPOTrainer):
    """GRPO (or DAPO, with its settings) with QAE's K-quantile group baseline.

    Takes the same arguments as `trl.GRPOTrainer`; `args` must be a [`QAEConfig`]. Only the advantages change, so every
    `loss_type` of the base works; the paper runs QAE on DAPO (clip-higher, token-level loss).
    """

    config_class = QAEConfig
    paper = Paper(
        "wu2025qae",
        "Quantile Advantage Estimation for Entropy-Safe Reasoning",
        "2509.22611",
        2025,
        "Junkang Wu and Kexin Huang and Jiancan Wu and An Zhang and Xiang Wang and Xiangnan He",
        note='v2: "Quantile Advantage Estimation: Stabilizing RLVR for LLM Reasoning"',
    )
    _name = "QAE"
    _paper = method_paper(paper)
    _tag_names = model_card_tags("qae")


SPEC = MethodSpec(
    key="qae",
    config_class=QAEConfig,
    trainer_class=QAETrainer,
    description="QAE: the K-quantile of the group's rewards as the baseline",
    acts_on=(Place.GROUP_BASELINE,),
    metrics=(
        Metric(
            "qae/zero_advantage_fraction",
            "QAE: completions with zero advantage (qae/zero_advantage_fraction)",
            "fraction of completions",
            smooth=True,
        ),
        Metric(
            "qae/hard_group_fraction",
            "QAE: hard-regime groups (qae/hard_group_fraction)",
            "fraction of groups",
            smooth=True,
        ),
        Metric(
            "qae/easy_group_fraction",
            "QAE: easy-regime groups (qae/easy_group_fraction)",
            "fraction of groups",
            smooth=True,
        ),
    ),
    # The loss step is the base's: QAE changes only the generation batch's advantages.
    needs_all_ranks_rewards=True,
    docs=MethodDocs(
        summary="the group baseline: the K-quantile of the rewards instead of their mean",
        choose_when="no controller, only another baseline: the group's K-quantile of the rewards instead of its mean",
    ),
)
