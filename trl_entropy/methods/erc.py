"""ERC: entropy ratio clipping (Su et al., "Entropy Ratio Clipping as a Soft Global Constraint for Stable Reinforcement
Learning", arXiv:2512.05591; the authors' code, github.com/Kwai-Klear/ERC at commit f1885c5, ``grpo_erc`` and
``gppo_erc`` in ``verl/trainer/ppo/core_algos.py``; docs/erc.md).

A stop-gradient gate on the change of the policy's full entropy since the rollout. With ``H_t`` the entropy of the
policy being trained at position ``t`` and ``H^old_t`` that of the rollout policy (computed in the pass that computes
the rollout log-probs), each token's surrogate keeps its gradient only while the entropy ratio stays inside a band:

    ρ_t = (H_t + 1e-8) / (H^old_t + 1e-8),    keep_t = m_t ∧ (L < ρ_t < U)    (both bounds strict),

and a token not kept has its surrogate detached: it keeps its forward value and its place in the normaliser, and only
its gradient goes. The gate applies to whatever surrogate the ``loss_type`` gives (the authors ship it on DAPO's
clipped surrogate and on GPPO's); the KL term and any entropy bonus are not gated. On-policy, ``H^old = H`` and
``ρ = 1``: every token is kept, and ERC is the plain surrogate (its config warns).
"""

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.batch import CompletionBatch
from ..core.citation import Paper, method_paper, model_card_tags
from ..core.config import EntropyGRPOBaseConfig, Range, config_field, warn_if_on_policy
from ..core.parts import MethodPart, Metrics, TokenGate, TokenMean
from ..core.trainer import EntropyGRPOTrainer
from .spec import MethodDocs, MethodSpec, Metric, Neutral, Place, Sweep


# The authors' code adds it to both entropies, so a position deterministic under both policies has ratio 1.
ENTROPY_RATIO_EPSILON = 1e-8


def entropy_ratio(entropy: torch.Tensor, old_entropy: torch.Tensor) -> torch.Tensor:
    """ERC's entropy ratio ``ρ_t = (H_t + 1e-8) / (H^old_t + 1e-8)``, without gradient (arXiv:2512.05591; the
    authors' code, Kwai-Klear/ERC at f1885c5, ``compute_policy_loss_grpo_erc``).

    Args:
        entropy: ``(B, T)`` full entropies ``H_t`` of the policy being trained; detached here.
        old_entropy: ``(B, T)`` full entropies ``H^old_t`` of the rollout policy.

    Returns:
        ``(B, T)``, positive wherever both entropies are ``≥ 0``.
    """
    return (entropy.detach() + ENTROPY_RATIO_EPSILON) / (old_entropy.detach() + ENTROPY_RATIO_EPSILON)


def erc_keep_mask(ratio: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """The tokens whose surrogate keeps its gradient: ``keep_t = m_t ∧ (L < ρ_t < U)``, strict at both bounds as the
    authors' code compares (Kwai-Klear/ERC at f1885c5). A bool ``(B, T)`` tensor."""
    return mask.bool() & (ratio > low) & (ratio < high)


def entropy_ratio_gate(per_token_loss: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """ERC's stop-gradient gate (arXiv:2512.05591): the per-token loss where ``keep`` is set, its detached value
    elsewhere. Every token keeps its forward value (and stays in the normaliser); the tokens not kept lose their
    gradient. ``per_token_loss`` may be ``(B, 1)`` (a sequence-level surrogate): the result is ``(B, T)``."""
    return torch.where(keep, per_token_loss, per_token_loss.detach())


class ERCPart(MethodPart):
    """ERC's seam: a gate that stops the gradient where the entropy ratio leaves the band."""

    key = "erc"
    needs_rollout_entropy = True

    def gate(
        self, batch: CompletionBatch, ratio: torch.Tensor, token_advantages: torch.Tensor
    ) -> tuple[TokenGate, Metrics]:
        rho = entropy_ratio(batch.entropy, batch.old_entropy)
        keep = erc_keep_mask(rho, batch.mask, self.args.erc_low, self.args.erc_high)
        return TokenGate(stop_gradient=~keep), {"erc/kept_fraction": TokenMean(keep.float(), batch.mask)}


@dataclass
class ERCConfig(EntropyGRPOBaseConfig):
    r"""
    Configuration for [`ERCTrainer`]: [`EntropyGRPOBaseConfig`] plus the entropy-ratio band of ERC (arXiv:2512.05591).

    ERC acts only off-policy (`num_iterations > 1` or `steps_per_generation > gradient_accumulation_steps`): on-policy
    the entropy ratio is 1 and every token is kept.

    Parameters:
        erc_low (`float`, *optional*, defaults to `0.95`):
            Lower bound `L` (exclusive) of the entropy ratio `ρ = H / H_old`; `0 <= L < 1`. 0.95 is the authors'
            training scripts' value; their config's default is 0.8.
        erc_high (`float`, *optional*, defaults to `1.05`):
            Upper bound `U` (exclusive); `U > 1`, `inf` allowed. 1.05 is the authors' training scripts' value; their
            config's default is 1.2. `erc_low=0`, `erc_high=inf` keeps every token (the plain surrogate).
    """

    method_parts: ClassVar[tuple[type, ...]] = (ERCPart,)

    erc_low: float = config_field(
        0.95,
        "Lower bound L (exclusive) of the entropy ratio rho = (H + 1e-8) / (H_old + 1e-8): a token with rho <= L "
        "loses its policy gradient. 0 <= L < 1. 0.95 is the authors' training scripts' value (their config default: "
        "0.8).",
        valid=Range(0),
    )
    erc_high: float = config_field(
        1.05,
        "Upper bound U (exclusive) of the entropy ratio: a token with rho >= U loses its policy gradient. U > 1; inf "
        "allowed (erc_low=0 with erc_high=inf keeps every token). 1.05 is the authors' training scripts' value (their "
        "config default: 1.2).",
        valid=Range(0, ends="(]", finite=False),
    )

    def check_settings(self) -> None:
        if not self.erc_low < self.erc_high:
            raise ValueError(
                "erc_low must be below erc_high (the tokens kept have an entropy ratio strictly between them), got "
                f"erc_low={self.erc_low!r} and erc_high={self.erc_high!r}."
            )
        if not self.erc_low < 1 < self.erc_high:
            raise ValueError(
                "erc_low < 1 < erc_high is required: an unchanged entropy (ratio 1, every token of a rollout's first "
                f"update) must keep its gradient, got erc_low={self.erc_low!r} and erc_high={self.erc_high!r}."
            )
        warn_if_on_policy(
            self,
            "ERC",
            "the rollout policy is the policy being trained, every entropy ratio is 1 and no token is ever gated; the "
            "loss is the plain surrogate.",
            "ERC to act",
        )


class ERCTrainer(EntropyGRPOTrainer):
    """GRPO whose per-token surrogate loses its gradient where the entropy ratio to the rollout policy leaves
    ``(erc_low, erc_high)`` (arXiv:2512.05591).

    Takes the same arguments as `trl.GRPOTrainer`; `args` must be an [`ERCConfig`]. Every `loss_type` works: the gate
    detaches the surrogate of each. The rollout policy's entropy comes with the generation batch
    (``batch.old_entropy``), from the pass that computes TRL's rollout log-probs: no extra forward pass.
    """

    config_class = ERCConfig
    paper = Paper(
        "su2025erc",
        "Entropy Ratio Clipping as a Soft Global Constraint for Stable Reinforcement Learning",
        "2512.05591",
        2025,
        "Zhenpeng Su and Leiyu Pan and Minxuan Lv and Tiehua Mei and Zijia Lin and Yuntao Li and Wenping Hu and "
        "Ruiming Tang and Kun Gai and Guorui Zhou",
    )
    _name = "ERC"
    _paper = method_paper(paper)
    _tag_names = model_card_tags("erc")


SPEC = MethodSpec(
    key="erc",
    config_class=ERCConfig,
    trainer_class=ERCTrainer,
    description="ERC: entropy ratio clipping, no gradient where H / H_old leaves (erc_low, erc_high)",
    acts_on=(Place.GATES,),
    metrics=(
        Metric(
            "erc/kept_fraction",
            "ERC: tokens inside the entropy-ratio band (erc/kept_fraction)",
            "fraction of tokens",
            smooth=True,
        ),
    ),
    neutral=Neutral(ours={"erc_low": 0.0, "erc_high": math.inf}),  # every ratio lies in (0, inf): every token kept
    docs=MethodDocs(
        summary="no gradient where a token's entropy moved too far since the rollout (off-policy)",
        choose_when="no controller, steadier off-policy updates (`num_iterations > 1`): no gradient where a token's "
        "entropy moved too far from the rollout's",
        sources="the method section could not be read, the formula and defaults from the authors' code "
        "(`Kwai-Klear/ERC` at `f1885c5`)",
    ),
    # The toy sweep: the entropy-ratio band, symmetric bands from a tighter one than the authors' scripts' 0.95 / 1.05
    # to their config default 0.8 / 1.2 (a band's two ends go in pairs: these points only).
    sweep=Sweep(
        [
            {"erc_low": 0.98, "erc_high": 1.02},
            {"erc_low": 0.95, "erc_high": 1.05},
            {"erc_low": 0.9, "erc_high": 1.1},
            {"erc_low": 0.8, "erc_high": 1.2},
        ],
        fixed={"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28},
    ),
)
