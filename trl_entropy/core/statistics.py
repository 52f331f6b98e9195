"""The masked statistics every trainer shares: token means, per-sequence means, and the covariance of log-prob and
advantage whose sign predicts the entropy change (Cui et al., "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models", arXiv:2505.22617, Thm. 1; Petrenko et al., "Entropy-Preserving Reinforcement Learning",
arXiv:2603.11682, Cor. 1). Pure functions, except :func:`global_token_mean`, which reduces across ranks; and the
metrics that are reduced across ranks after the loss step (``TokenMean``, ``WorldSum``, ``Gathered``), each a value of
this rank with the rule that makes it the same on every rank."""

from collections.abc import Callable
from dataclasses import dataclass

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


def pooled_covariance(
    log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, moments: torch.Tensor
) -> torch.Tensor:
    """``Cov_t = (ℓ_t − ℓ̄)(A_t − Ā)`` in float64 with the means of a larger pool of tokens; 0 at masked positions.

    ``moments`` are :func:`covariance_moments` summed over the pool (the whole generation batch on every rank), so
    ``ℓ̄ = Σmℓ / Σm`` and ``Ā = ΣmA / Σm`` are the pool's token-weighted means, not this tensor's. ``log_probs`` is
    ``(B, T)``; ``advantages`` is ``(B,)``, ``(B, 1)`` or ``(B, T)``.
    """
    count, sum_log_probs, sum_advantages = moments[:3].double().tolist()
    count = max(count, 1.0)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    centred_log_probs = log_probs.detach().double() - sum_log_probs / count
    centred_advantages = advantages.detach().double() - sum_advantages / count
    return centred_log_probs * centred_advantages * mask.double()


def token_sums(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[Σ m·v, Σ m]`` (float32), sums that add across micro-batches and ranks; ``(B, 1)`` values count once per
    sequence."""
    if values.size(1) == 1:
        return torch.stack([values.detach().float().sum(), torch.tensor(float(values.size(0)), device=values.device)])
    return torch.stack([(values.detach().float() * mask).sum(), mask.float().sum()])


def sequence_means(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence token mean (NaN for a sequence with no valid token); ``(B, 1)`` values stay as they are."""
    if values.size(1) == 1:
        return values.squeeze(1)
    return (values * mask).sum(-1) / mask.sum(-1)


def global_token_mean(accelerator, values: torch.Tensor, mask: torch.Tensor) -> float:
    """Token-weighted mean of ``values`` over all ranks (see :func:`token_sums`); every rank must call it."""
    totals = accelerator.reduce(token_sums(values, mask), reduction="sum")
    return (totals[0] / totals[1].clamp(min=1.0)).item()


def replace_tail(log, values: list) -> None:
    """Replace the last ``len(values)`` entries of ``log`` (a deque, possibly bounded) by ``values``."""
    for _ in range(min(len(values), len(log))):
        log.pop()
    log.extend(values)


@dataclass
class TokenMean:
    """A metric logged as the mean of ``values`` over the valid tokens of every rank (``mask``: the tokens counted)."""

    values: torch.Tensor
    mask: torch.Tensor

    def reduce(self, accelerator) -> float:
        return global_token_mean(accelerator, self.values, self.mask)


@dataclass
class WorldSum:
    """A metric logged as ``finish`` of ``sums``, added over every rank."""

    sums: torch.Tensor
    finish: Callable[[torch.Tensor], float]

    def reduce(self, accelerator) -> float:
        return self.finish(accelerator.reduce(self.sums, reduction="sum"))


@dataclass
class Gathered:
    """A metric logged as ``finish`` of ``values`` gathered from every rank (``for_metrics``: as
    ``accelerator.gather_for_metrics`` gathers, without an evaluation's padded duplicates)."""

    values: torch.Tensor
    finish: Callable[[torch.Tensor], float]
    for_metrics: bool = False

    def reduce(self, accelerator) -> float:
        gather = accelerator.gather_for_metrics if self.for_metrics else accelerator.gather
        return self.finish(gather(self.values))


REDUCED_ACROSS_RANKS = (TokenMean, WorldSum, Gathered)
# A seam's metrics: name -> a number already the same on every rank, or one of the above, reduced after the step.
Metrics = dict[str, "float | TokenMean | WorldSum | Gathered"]


def reduce_metrics(accelerator, metrics: list[tuple[str, object]]) -> list[tuple[str, float]]:
    """Every metric ``(name, value)`` as the same number on every rank. The reductions run here, in the metrics'
    order: every rank holds the same names in the same order, so the collectives match."""
    return [
        (name, value.reduce(accelerator) if isinstance(value, REDUCED_ACROSS_RANKS) else value)
        for name, value in metrics
    ]
