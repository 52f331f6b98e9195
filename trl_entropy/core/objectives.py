"""The loss arithmetic of the base trainer, as pure functions: GRPO's clipped surrogate, where its clip is active, the
importance ratio, the k3 KL estimator, the aggregation of each ``loss_type``, and the step of TRL's adaptive entropy
coefficient. With these, ``EntropyGRPOTrainer`` computes exactly ``trl.GRPOTrainer``'s loss."""

import math

import torch


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


def importance_ratio(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor, level: str
) -> torch.Tensor:
    """``exp(ℓ − ℓ^old)`` per token (``level="token"``, ``(B, T)``), or the exponential of its per-sequence token
    mean (``"sequence"``, GSPO's sequence-level ratio, ``(B, 1)``)."""
    log_ratio = log_probs - old_log_probs
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    return torch.exp(log_ratio)


def k3_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of ``KL(π_θ ‖ π_ref)`` per token: ``exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1`` (≥ 0)."""
    ref_log_ratio = ref_log_probs - log_probs
    return torch.exp(ref_log_ratio) - ref_log_ratio - 1


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    max_completion_length: int,
    dapo_normaliser: torch.Tensor | None = None,
) -> tuple[torch.Tensor, bool]:
    """Reduce the per-token loss as ``loss_type`` prescribes.

    Returns the loss and whether it still has to be divided by the gradient-accumulation steps: ``"dapo"``'s
    normaliser (the generation batch's valid tokens on this rank, brought to one accumulation window) already spans
    the window.
    """
    masked = per_token_loss * mask
    if loss_type == "grpo":  # mean over each sequence's tokens, then over sequences
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean(), True
    if loss_type == "bnpo":  # mean over the micro-batch's tokens
        return masked.sum() / mask.sum().clamp(min=1.0), True
    if loss_type == "dr_grpo":  # a constant normaliser: sequences × maximal completion length
        return masked.sum() / (per_token_loss.size(0) * max_completion_length), True
    if loss_type == "dapo":
        return masked.sum() / dapo_normaliser, False
    raise ValueError(f"unknown loss_type {loss_type!r}")


def adaptive_entropy_coef_step(
    coef: float, mean_entropy: float, target: float, step: float, coef_min: float, coef_max: float
) -> float:
    """One step of TRL's adaptive entropy coefficient (Skywork-OR1, arXiv:2505.22312): up by ``step`` while the mean
    entropy is at or below the target, down otherwise, clipped to ``[coef_min, coef_max]``."""
    coef = coef + (step if mean_entropy <= target else -step)
    return min(max(coef, coef_min), coef_max)
