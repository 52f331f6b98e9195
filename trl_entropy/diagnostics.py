"""Pure functions for the masked statistics every trainer shares (the covariance whose sign predicts the entropy
change: Cui et al., arXiv:2505.22617, Thm. 1; Petrenko et al., arXiv:2603.11682, Cor. 1)."""

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-weighted mean of ``values`` over the positions where ``mask`` is set (0 when none is)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def token_covariance(log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token covariance terms ``(ℓ_t − ℓ̄)(A_t − Ā)``, means taken over the valid tokens; 0 at masked positions.

    ``log_probs`` is ``(B, T)``; ``advantages`` is ``(B,)``, ``(B, 1)`` or ``(B, T)``. Nothing is differentiated
    through (the covariance only selects or measures tokens).
    """
    log_probs = log_probs.detach().float()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    advantages = advantages.detach().float().expand_as(log_probs)
    mask = mask.to(torch.float32)
    centred_log_probs = log_probs - masked_mean(log_probs, mask)
    centred_advantages = advantages - masked_mean(advantages, mask)
    return centred_log_probs * centred_advantages * mask


def covariance_moments(log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[Σm, Σmℓ, ΣmA, ΣmℓA]`` in float64: sums that add across micro-batches and ranks."""
    log_probs = log_probs.detach().double()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    advantages = advantages.detach().double().expand_as(log_probs)
    mask = mask.double()
    return torch.stack(
        [mask.sum(), (mask * log_probs).sum(), (mask * advantages).sum(), (mask * log_probs * advantages).sum()]
    )


def covariance_from_moments(moments: torch.Tensor) -> float:
    """Token-weighted covariance of ℓ and A from summed moments; 0.0 when no token is valid."""
    count, sum_log_probs, sum_advantages, sum_products = moments.tolist()
    if count <= 0:
        return 0.0
    return sum_products / count - (sum_log_probs / count) * (sum_advantages / count)
