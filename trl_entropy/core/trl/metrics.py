"""TRL's loss-step metrics, restated: what ``trl.GRPOTrainer`` logs for each micro-batch, under its names, with the
entropy statistics this library adds beside them."""

from trl.trainer.utils import nanmax, nanmin

from ..statistics import Gathered, TokenMean, WorldSum, covariance_from_moments, covariance_moments, sequence_means
from .objectives import PPO_CLIP_LOSS_TYPES


def loss_step_metrics(batch, token_advantages, ratio, per_token_kl, clip_range, loss_type="grpo") -> list[tuple]:
    """What every loss step logs, as ``trl.GRPOTrainer`` names it (plus ``entropy/clamped`` and
    ``entropy/cov_logp_adv``), each to be reduced over all ranks (``core.statistics.reduce_metrics``): the PPO clip's
    fractions for the clipped loss types, ``cispo_clip_ratio`` for CISPO, none for SAPO and VESPO (VESPO's weight is
    logged where it is computed)."""
    mask = batch.mask
    metrics = []
    if per_token_kl is not None:
        metrics.append(("kl", TokenMean(per_token_kl, mask)))
    metrics.append(("entropy", TokenMean(batch.entropy, mask)))
    if batch.clamped_entropy is not None:
        metrics.append(("entropy/clamped", TokenMean(batch.clamped_entropy, mask)))
    moments = covariance_moments(batch.log_probs, token_advantages, mask)
    metrics.append(("entropy/cov_logp_adv", WorldSum(moments, covariance_from_moments)))
    epsilon_low, epsilon_high = clip_range
    if loss_type == "cispo":
        truncated = (ratio > epsilon_high) & (token_advantages > 0)
        metrics.append(("cispo_clip_ratio", TokenMean(truncated.float(), mask)))
    if loss_type not in PPO_CLIP_LOSS_TYPES:
        return metrics
    low = (ratio < 1 - epsilon_low) & (token_advantages < 0)
    high = (ratio > 1 + epsilon_high) & (token_advantages > 0)
    metrics += [
        ("clip_ratio/low_mean", TokenMean(low.float(), mask)),
        ("clip_ratio/high_mean", TokenMean(high.float(), mask)),
        ("clip_ratio/region_mean", TokenMean((low | high).float(), mask)),
        ("clip_ratio/low_min", Gathered(sequence_means(low.float(), mask), lambda means: nanmin(means).item())),
        ("clip_ratio/high_max", Gathered(sequence_means(high.float(), mask), lambda means: nanmax(means).item())),
    ]
    return metrics
