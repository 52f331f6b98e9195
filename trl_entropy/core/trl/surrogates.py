"""The per-token surrogate of each ``loss_type`` as pure functions: GRPO's clipped surrogate (and where it is flat),
CISPO's, SAPO's and VESPO's, and the importance ratio they take. Each multiplies the token advantages of the loss
step's third step (``(B, 1)`` or ``(B, T)``)."""

import math

import torch
from trl import GRPOTrainer

from .objectives import PPO_CLIP_LOSS_TYPES


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
) -> torch.Tensor:
    """Per-token PPO surrogate ``−min(min(r, δ)·A, clip(r, 1−ε_low, 1+ε_high)·A)``; TRL's two-sided ``delta`` caps
    the unclipped ratio (None: no cap)."""
    clipped_ratio = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    if delta is not None:
        ratio = torch.clamp(ratio, max=delta)
    return -torch.min(ratio * advantages, clipped_ratio * advantages)


def ppo_clip_active(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
) -> torch.Tensor:
    """Where :func:`clipped_surrogate` is already flat in ``r`` (bool, the broadcast shape of the inputs).

    Without ``delta`` this is ``(r > 1+ε_high and A > 0) or (r < 1−ε_low and A < 0)`` (the clipped term strictly wins
    the min). With ``delta`` the tokens it caps are flat too: ``A > 0`` and ``r > min(1+ε_high, δ)``, or ``A < 0``
    and ``r > max(1+ε_high, δ)``. Inequalities are strict.
    """
    upper = 1 + epsilon_high
    upper_positive = upper if delta is None else min(upper, delta)
    upper_negative = math.inf if delta is None else max(upper, delta)
    positive = (advantages > 0) & (ratio > upper_positive)
    negative = (advantages < 0) & ((ratio < 1 - epsilon_low) | (ratio > upper_negative))
    return positive | negative


def cispo_surrogate(
    log_probs: torch.Tensor, ratio: torch.Tensor, advantages: torch.Tensor, epsilon_max: float
) -> torch.Tensor:
    """CISPO's per-token loss ``−sg(min(r, ε_max))·A·ℓ`` (MiniMax-M1, arXiv:2506.13585, eq. 4, with the upper bound
    only; ``ε_max`` as in ScaleRL, arXiv:2510.13786): the importance weight is truncated and detached, so every
    token keeps its gradient ``−sg(min(r, ε_max))·A·∇ℓ``."""
    return -torch.clamp(ratio, max=epsilon_max).detach() * advantages * log_probs


def sapo_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, temperature_pos: float, temperature_neg: float
) -> torch.Tensor:
    """SAPO's per-token loss ``−(4/τ)·σ(τ(r − 1))·A`` (Soft Adaptive Policy Optimization, arXiv:2511.20347, eqs. 5–6),
    ``τ = τ_pos`` where ``A > 0`` and ``τ_neg`` elsewhere: a smooth gate in place of the hard clip (gradient ``A`` at
    ``r = 1``, decaying away from it)."""
    temperatures = torch.where(advantages > 0, temperature_pos, temperature_neg)
    return -torch.sigmoid(temperatures * (ratio - 1)) * 4 / temperatures * advantages


def vespo_weights(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    importance_sampling_ratio: torch.Tensor | None,
    config,
) -> torch.Tensor:
    """VESPO's detached weight ``φ(w) = e^λ·w^k·e^{−λw}`` of the sequence ratio ``w = Π_t r_t`` (times the sampler's
    token ratios when given), ``(k, λ)`` by the sign of ``A`` (Variational Sequence-Level Soft Policy Optimization,
    arXiv:2602.10693), ``(B, 1)`` (``(B, T)`` for per-token advantages). TRL's own ``GRPOTrainer.get_gamma_weights``
    (its clamps of the log-ratios included); ``config`` supplies ``vespo_k_pos``, ``vespo_lambda_pos``,
    ``vespo_k_neg``, ``vespo_lambda_neg``."""
    return GRPOTrainer.get_gamma_weights(
        advantages=advantages,
        log_ratio_per_token=log_probs - old_log_probs,
        mask=mask,
        importance_sampling_ratio=importance_sampling_ratio,
        k_pos=config.vespo_k_pos,
        lambda_pos=config.vespo_lambda_pos,
        k_neg=config.vespo_k_neg,
        lambda_neg=config.vespo_lambda_neg,
    )


def vespo_surrogate(log_probs: torch.Tensor, weights: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """VESPO's per-token loss ``−φ(w)·A·ℓ`` (arXiv:2602.10693), ``φ`` from :func:`vespo_weights` (detached)."""
    return -weights * advantages * log_probs


def policy_surrogate(
    loss_type: str,
    log_probs: torch.Tensor,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: tuple[float, float],
    config,
    vespo_phi: torch.Tensor | None = None,
) -> torch.Tensor:
    """The per-token surrogate of ``loss_type`` as ``trl.GRPOTrainer`` 1.16 computes it. ``config`` supplies
    ``delta``, ``sapo_temperature_pos/neg``; ``clip_range`` is ``(ε_low, ε_high)`` (CISPO's ``ε_max`` is ``ε_high``);
    ``vespo_phi`` is :func:`vespo_weights`, needed for ``"vespo"``."""
    epsilon_low, epsilon_high = clip_range
    if loss_type in PPO_CLIP_LOSS_TYPES:
        return clipped_surrogate(ratio, advantages, epsilon_low, epsilon_high, config.delta)
    if loss_type == "cispo":
        return cispo_surrogate(log_probs, ratio, advantages, epsilon_high)
    if loss_type == "sapo":
        return sapo_surrogate(ratio, advantages, config.sapo_temperature_pos, config.sapo_temperature_neg)
    if loss_type == "vespo":
        return vespo_surrogate(log_probs, vespo_phi, advantages)
    raise ValueError(f"unknown loss_type {loss_type!r}")


def surrogate_flat(
    loss_type: str,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
) -> torch.Tensor:
    """Where the surrogate of ``loss_type`` has no gradient (bool): the PPO clip's flat region for the clipped losses
    (:func:`ppo_clip_active`); no token for CISPO (its truncated weight is detached, the gradient flows through
    ``ℓ``), SAPO (a smooth gate) and VESPO (a detached weight)."""
    if loss_type in PPO_CLIP_LOSS_TYPES:
        return ppo_clip_active(ratio, advantages, epsilon_low, epsilon_high, delta)
    return torch.zeros(torch.broadcast_shapes(ratio.shape, advantages.shape), dtype=torch.bool, device=ratio.device)


def importance_ratio(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor, level: str
) -> torch.Tensor:
    """``exp(ℓ − ℓ^old)`` per token (``level="token"``, ``(B, T)``), or the exponential of its per-sequence token
    mean (``"sequence"``, GSPO's sequence-level ratio, ``(B, 1)``)."""
    log_ratio = log_probs - old_log_probs
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    return torch.exp(log_ratio)
