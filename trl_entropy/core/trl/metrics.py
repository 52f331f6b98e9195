"""TRL's loss-step metrics, restated: what ``trl.GRPOTrainer`` logs for each micro-batch, under its names, with the
entropy statistics this library adds beside them."""

from trl.trainer.utils import nanmax, nanmin

from ..statistics import covariance_from_moments, covariance_moments, global_token_mean, sequence_means
from .objectives import PPO_CLIP_LOSS_TYPES


def loss_step_metrics(
    accelerator, batch, token_advantages, ratio, per_token_kl, clip_range, loss_type="grpo"
) -> dict[str, float]:
    """What every loss step logs, as ``trl.GRPOTrainer`` names it (plus ``entropy/clamped`` and
    ``entropy/cov_logp_adv``), each reduced over all ranks: the PPO clip's fractions for the clipped loss types,
    ``cispo_clip_ratio`` for CISPO, none for SAPO and VESPO (VESPO's weight is logged where it is computed)."""
    mask = batch.mask
    metrics = {}
    if per_token_kl is not None:
        metrics["kl"] = global_token_mean(accelerator, per_token_kl, mask)
    metrics["entropy"] = global_token_mean(accelerator, batch.entropy, mask)
    if batch.clamped_entropy is not None:
        metrics["entropy/clamped"] = global_token_mean(accelerator, batch.clamped_entropy, mask)
    moments = accelerator.reduce(covariance_moments(batch.log_probs, token_advantages, mask), reduction="sum")
    metrics["entropy/cov_logp_adv"] = covariance_from_moments(moments)
    epsilon_low, epsilon_high = clip_range
    if loss_type == "cispo":
        truncated = (ratio > epsilon_high) & (token_advantages > 0)
        metrics["cispo_clip_ratio"] = global_token_mean(accelerator, truncated.float(), mask)
    if loss_type not in PPO_CLIP_LOSS_TYPES:
        return metrics
    low = (ratio < 1 - epsilon_low) & (token_advantages < 0)
    high = (ratio > 1 + epsilon_high) & (token_advantages > 0)
    metrics["clip_ratio/low_mean"] = global_token_mean(accelerator, low.float(), mask)
    metrics["clip_ratio/high_mean"] = global_token_mean(accelerator, high.float(), mask)
    metrics["clip_ratio/region_mean"] = global_token_mean(accelerator, (low | high).float(), mask)
    metrics["clip_ratio/low_min"] = nanmin(accelerator.gather(sequence_means(low.float(), mask))).item()
    metrics["clip_ratio/high_max"] = nanmax(accelerator.gather(sequence_means(high.float(), mask))).item()
    return metrics
