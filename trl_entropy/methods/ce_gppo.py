"""CE-GPPO: gradient-preserving clipping (Su et al., "CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping
Policy Optimization in Reinforcement Learning", arXiv:2509.20712, §3.2 eq. 8 and §3.3 eqs. 9–10; the authors' code,
github.com/Kwai-Klear/CE-GPPO at commit 10558fe, ``compute_gppo_loss_general_beta``; docs/ce_gppo.md).

PPO's clip gives a token outside the trust region no gradient. CE-GPPO gives it a bounded one instead, through a
stop-gradient ``sg``: on a clipped token the value is ``β`` times PPO's clipped value and the gradient with respect to
the log-prob ``ℓ_t`` is ``β`` times the clip bound times ``A_t``. Per valid token, with ``r_t = exp(ℓ_t − ℓ^old_t)``:

    low_t  = (r_t < 1 − ε_low) ∧ (A_t < 0)        L_t = −β₁ (1 − ε_low) · (r_t / sg(r_t)) · A_t
    high_t = (r_t > 1 + ε_high) ∧ (A_t > 0)       L_t = −β₂ (1 + ε_high) · (r_t / sg(r_t)) · A_t
    otherwise                                     L_t = −r_t · A_t
    A_t < 0, dual clip c (TRL's ``delta``)        L_t ← min(L_t, −c · A_t)

``β₁ = β₂ = 0`` has PPO's gradient (and loss 0 on the clipped tokens, where PPO's is a constant); on-policy every
ratio is 1, no token is clipped and the loss is GRPO's.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.batch import CompletionBatch
from ..core.citation import Paper, method_paper, model_card_tags
from ..core.config import EntropyGRPOBaseConfig, Range, config_field, reject_trl_entropy_bonus, warn_if_on_policy
from ..core.parts import MethodPart, Metrics, TokenMean
from ..core.trainer import EntropyGRPOTrainer
from ..core.trl.objectives import PPO_CLIP_LOSS_TYPES
from .spec import MethodDocs, MethodSpec, Metric, Neutral, Place, Sweep


def ce_gppo_branches(
    ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """CE-GPPO's clipped tokens, ``(low, high)`` bool masks in the broadcast shape of the inputs (arXiv:2509.20712,
    eq. 8): ``low`` where ``r < 1 − ε_low`` and ``A < 0``, ``high`` where ``r > 1 + ε_high`` and ``A > 0``. The
    inequalities are strict: a ratio exactly at a bound is not clipped (as in the authors' code)."""
    low = (ratio < 1 - epsilon_low) & (advantages < 0)
    high = (ratio > 1 + epsilon_high) & (advantages > 0)
    return low, high


def ce_gppo_surrogate(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    beta1: float,
    beta2: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CE-GPPO's per-token loss (arXiv:2509.20712, eq. 8; the dual clip from the authors' code,
    github.com/Kwai-Klear/CE-GPPO at commit 10558fe).

    Args:
        log_ratio: ``ℓ − ℓ^old`` per token, ``(B, T)``, differentiable in ``ℓ``.
        advantages: ``A``, ``(B, 1)`` or ``(B, T)``, no gradient.
        epsilon_low, epsilon_high: the clip range ``(ε_low, ε_high)``.
        beta1: ``β₁ ≥ 0``, the gradient scale of the low-clipped tokens (``A < 0``, ratio below ``1 − ε_low``).
        beta2: ``β₂ ≥ 0``, the gradient scale of the high-clipped tokens (``A > 0``, ratio above ``1 + ε_high``).
        dual_clip: ``c``: where ``A < 0`` the loss is at most ``−c·A`` (flat in ``ℓ`` where it binds); None: none.

    Returns:
        ``(loss, low, high)``: the per-token loss, ``(B, T)``, and the masks of :func:`ce_gppo_branches`.

    ``r/sg(r)`` is 1 in value with gradient ``∇ℓ``; it is computed as ``exp(log_ratio − sg(log_ratio))``, which has the
    same value and gradient without the ``0/0`` the quotient gives where ``r`` underflows to 0.
    """
    ratio = torch.exp(log_ratio)
    low, high = ce_gppo_branches(ratio, advantages, epsilon_low, epsilon_high)
    preserved = torch.exp(log_ratio - log_ratio.detach())
    loss = torch.where(
        low,
        -beta1 * (1 - epsilon_low) * preserved * advantages,
        torch.where(high, -beta2 * (1 + epsilon_high) * preserved * advantages, -ratio * advantages),
    )
    if dual_clip is not None:
        cap = -dual_clip * advantages
        loss = torch.where((advantages < 0) & (loss > cap), cap.expand_as(loss), loss)
    return loss, low, high


class CEGPPOPart(MethodPart):
    """CE-GPPO's seam: the surrogate, whose clipped tokens keep a bounded gradient."""

    key = "ce_gppo"

    def surrogate(
        self, batch: CompletionBatch, ratio: torch.Tensor, token_advantages: torch.Tensor
    ) -> tuple[torch.Tensor, Metrics]:
        epsilon_low, epsilon_high = self.trainer.clip_range()
        args = self.args
        loss, low, high = ce_gppo_surrogate(
            batch.log_probs - batch.old_log_probs,  # the log of `ratio` (token level, the only one accepted)
            token_advantages,
            epsilon_low,
            epsilon_high,
            args.ce_gppo_beta1,
            args.ce_gppo_beta2,
            args.delta,
        )
        metrics = {
            "ce_gppo/low_fraction": TokenMean(low.float(), batch.mask),
            "ce_gppo/high_fraction": TokenMean(high.float(), batch.mask),
        }
        return loss, metrics


@dataclass
class CEGPPOConfig(EntropyGRPOBaseConfig):
    r"""
    Configuration for [`CEGPPOTrainer`]: [`EntropyGRPOBaseConfig`] plus CE-GPPO's gradient scales of the clipped tokens
    (Su et al., arXiv:2509.20712).

    CE-GPPO replaces the PPO clip, so the loss types with that clip work (`grpo`, `bnpo`, `dr_grpo`, `dapo`, `luspo`);
    `importance_sampling_level` must be `"token"`. `delta` is the authors' dual clip `c` (negative advantages only).

    Parameters:
        ce_gppo_beta1 (`float`, *optional*, defaults to `0.5`):
            β₁: gradient scale of the tokens clipped below (ratio < 1 − ε_low, negative advantage). The authors' 1.5B
            script; 0.75 in their 7B script, 0.25 in their config's default. `0` gives them no gradient, as PPO.
        ce_gppo_beta2 (`float`, *optional*, defaults to `1.0`):
            β₂: gradient scale of the tokens clipped above (ratio > 1 + ε_high, positive advantage). The authors'
            scripts and config. `0` gives them no gradient, as PPO.
    """

    # CE-GPPO redefines the PPO clip: the loss types whose surrogate is that clip (docs/loss_types.md).
    supported_loss_types: ClassVar[tuple[str, ...]] = PPO_CLIP_LOSS_TYPES
    unsupported_loss_type_reasons: ClassVar[dict[str, str]] = {
        "cispo": "CISPO has no PPO clip whose gradient CE-GPPO could preserve: its epsilon_max caps a detached "
        "importance weight, and every token already keeps a gradient",
        "sapo": "SAPO has no PPO clip whose gradient CE-GPPO could preserve: a smooth sigmoid gate replaces the clip",
        "vespo": "VESPO has no PPO clip whose gradient CE-GPPO could preserve: a smooth gamma weight of the sequence "
        "ratio replaces the clip",
    }
    controls_clip_range: ClassVar[bool] = True  # CE-GPPO acts through the clip and warns about on-policy runs itself

    method_parts: ClassVar[tuple[type, ...]] = (CEGPPOPart,)

    ce_gppo_beta1: float = config_field(
        0.5,
        "beta1: gradient scale of the tokens clipped below (ratio < 1 - epsilon, negative advantage); their loss is "
        "-beta1 * (1 - epsilon) * A * r / sg(r). 0.5 is the authors' 1.5B script (0.75 their 7B script, 0.25 their "
        "config's default); 0 gives these tokens no gradient, as PPO does.",
        valid=Range(0),
    )
    ce_gppo_beta2: float = config_field(
        1.0,
        "beta2: gradient scale of the tokens clipped above (ratio > 1 + epsilon_high, positive advantage); their loss "
        "is -beta2 * (1 + epsilon_high) * A * r / sg(r). 1.0 is the authors' scripts and config; 0 gives these tokens "
        "no gradient, as PPO does.",
        valid=Range(0),
    )

    def check_settings(self) -> None:
        reject_trl_entropy_bonus(self, "CE-GPPO")
        if self.importance_sampling_level != "token":
            raise ValueError(
                f"importance_sampling_level={self.importance_sampling_level!r} is not supported by CEGPPOConfig: "
                "CE-GPPO's clipped branches are defined per token (arXiv:2509.20712, eq. 8; the authors' code is "
                "token-level only), and with GSPO's sequence ratio a whole sequence would share one branch, a "
                "combination neither the paper nor its code defines. Use importance_sampling_level='token'."
            )
        epsilon_high = self.epsilon if self.epsilon_high is None else self.epsilon_high
        if self.delta is not None and self.delta < 1 + epsilon_high:
            raise ValueError(
                f"delta={self.delta!r} is not supported by CEGPPOConfig below 1 + epsilon_high = "
                f"{1 + epsilon_high!r}: "
                "CE-GPPO reads delta as its dual clip c, which bounds only negative-advantage tokens, and below "
                "1 + epsilon_high TRL's delta would also cap positive-advantage ratios inside the clip range. Use "
                "delta >= 1 + epsilon_high (the authors use 10) or None."
            )
        warn_if_on_policy(
            self,
            "CE-GPPO",
            "every ratio is 1, so no token leaves the clip range: ce_gppo_beta1 and ce_gppo_beta2 have no effect and "
            "the loss is plain GRPO's.",
            "CE-GPPO to act (the authors make 8 updates per rollout batch)",
        )


class CEGPPOTrainer(EntropyGRPOTrainer):
    """GRPO whose clipped tokens keep a bounded gradient, scaled by β₁ (below the clip) and β₂ (above), as CE-GPPO
    (arXiv:2509.20712).

    Takes the same arguments as `trl.GRPOTrainer`; `args` must be a [`CEGPPOConfig`].
    """

    config_class = CEGPPOConfig
    paper = Paper(
        "su2025cegppo",
        "CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization in Reinforcement Learning",
        "2509.20712",
        2025,
        "Zhenpeng Su and Leiyu Pan and Minxuan Lv and Yuntao Li and Wenping Hu and Fuzheng Zhang and Kun Gai and "
        "Guorui Zhou",
        note='listed earlier as "CE-GPPO: Controlling Entropy via Gradient-Preserving Clipping Policy Optimization in '
        'Reinforcement Learning"',
    )
    _name = "CE-GPPO"
    _paper = method_paper(paper)
    _tag_names = model_card_tags("ce-gppo")


SPEC = MethodSpec(
    key="ce_gppo",
    config_class=CEGPPOConfig,
    trainer_class=CEGPPOTrainer,
    description="CE-GPPO: clipped tokens keep a bounded gradient, scaled by beta1 (below) and beta2 (above)",
    acts_on=(Place.SURROGATE,),
    metrics=(
        Metric(
            "ce_gppo/low_fraction",
            "CE-GPPO: tokens clipped below, gradient × β₁ (ce_gppo/low_fraction)",
            "fraction of tokens",
            smooth=True,
        ),
        Metric(
            "ce_gppo/high_fraction",
            "CE-GPPO: tokens clipped above, gradient × β₂ (ce_gppo/high_fraction)",
            "fraction of tokens",
            smooth=True,
        ),
    ),
    # With a clip range no ratio leaves, no token is clipped: CE-GPPO is −r·A, as trl.GRPOTrainer with that range.
    neutral=Neutral(ours={"epsilon": 1e3, "epsilon_high": 1e3}, trl={"epsilon": 1e3, "epsilon_high": 1e3}),
    docs=MethodDocs(
        summary="clipped tokens keep a bounded gradient, `β₁(1−ε)·A` below and `β₂(1+ε)·A` above",
        choose_when="no controller, off-policy: the tokens PPO's clip silences keep a bounded gradient, weighted "
        "apart below and above the clip",
        sources="formula from the paper (eq. 8), defaults and the dual clip from the authors' code",
    ),
    # The toy sweep: beta1 (the gradient kept by the tokens clipped below) around the authors' 0.25 / 0.5 / 0.75;
    # beta2 1.
    sweep=Sweep(
        {"ce_gppo_beta1": [0.25, 0.5, 0.75]},
        fixed={"ce_gppo_beta2": 1.0, "epsilon": 0.2, "epsilon_high": 0.2, "delta": 10.0},
    ),
)
