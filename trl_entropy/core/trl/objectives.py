"""The loss terms of the base trainer around its surrogate, as pure functions: the loss types and what each implies,
the k3 KL estimator, the aggregation of each ``loss_type``, and the step of TRL's adaptive entropy coefficient. The
surrogates are in ``core/trl/surrogates.py``, the group advantages in ``core/trl/advantages.py``; together,
``EntropyGRPOTrainer`` computes exactly ``trl.GRPOTrainer``'s loss for every one of its eight loss types
(docs/loss_types.md)."""

import torch


# The loss types whose surrogate is GRPO's clipped surrogate (LUSPO: the same surrogate, aggregated per sequence).
PPO_CLIP_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
# The loss types normalised by the valid tokens of the generation batch (``num_items_in_batch``).
TOKEN_SUM_LOSS_TYPES = ("dapo", "cispo", "vespo")


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

    Returns the loss and whether it still has to be divided by the gradient-accumulation steps: the normaliser of
    ``"dapo"``, ``"cispo"`` and ``"vespo"`` (the generation batch's valid tokens on this rank, brought to one
    accumulation window) already spans the window.
    """
    masked = per_token_loss * mask
    if loss_type in ("grpo", "sapo"):  # mean over each sequence's tokens, then over sequences
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean(), True
    if loss_type == "bnpo":  # mean over the micro-batch's tokens
        return masked.sum() / mask.sum().clamp(min=1.0), True
    if loss_type == "dr_grpo":  # a constant normaliser: sequences × maximal completion length
        return masked.sum() / (per_token_loss.size(0) * max_completion_length), True
    if loss_type in TOKEN_SUM_LOSS_TYPES:
        return masked.sum() / dapo_normaliser, False
    if loss_type == "luspo":  # sum over each sequence's tokens, mean over sequences (arXiv:2602.05261)
        return masked.sum(-1).mean(), True
    raise ValueError(f"unknown loss_type {loss_type!r}")


def adaptive_entropy_coef_step(
    coef: float, mean_entropy: float, target: float, step: float, coef_min: float, coef_max: float
) -> float:
    """One step of TRL's adaptive entropy coefficient (Skywork-OR1, arXiv:2505.22312): up by ``step`` while the mean
    entropy is at or below the target, down otherwise, clipped to ``[coef_min, coef_max]``."""
    coef = coef + (step if mean_entropy <= target else -step)
    return min(max(coef, coef_min), coef_max)
