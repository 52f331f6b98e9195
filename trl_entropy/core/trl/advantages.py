"""The group advantages as pure functions: TRL's ``sum_then_normalize`` reward of each completion and its advantage
around its prompt group's baseline, computed once per generation batch (a method's part may supply the baseline,
``MethodPart.group_baseline``)."""

import torch
from trl.trainer.utils import nanstd


def summed_rewards(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """TRL's ``sum_then_normalize`` reward of each completion: the weighted ``nansum`` over the reward functions, NaN
    where every function returned None (unscorable)."""
    rewards = (rewards_per_func * reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


def advantages_around_baseline(
    rewards: torch.Tensor, num_generations: int, scale_rewards: str, baseline: torch.Tensor | None = None
) -> torch.Tensor:
    """TRL's advantages (``multi_objective_aggregation="sum_then_normalize"``) around a given group baseline.

    ``rewards`` holds every rank's completions, groups of ``num_generations`` consecutive rows, NaN for unscorable
    ones. ``A_i = r_i − b_g``, divided by ``std + 1e-4`` where ``std`` is the group's (``scale_rewards="group"``) or
    the batch's (``"batch"``) Bessel-corrected standard deviation around the mean (``trl.trainer.utils.nanstd``), not
    divided for ``"none"``; NaN advantages (unscorable completions, empty groups) become 0. ``baseline``:
    ``(groups,)``; ``None`` is TRL's group ``nanmean``, and gives TRL's advantages exactly.
    """
    grouped = rewards.view(-1, num_generations)
    centre = torch.nanmean(grouped, dim=1) if baseline is None else baseline.to(rewards.dtype)
    advantages = rewards - centre.repeat_interleave(num_generations, dim=0)
    if scale_rewards == "group":
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations, dim=0) if num_generations > 1 else None
    elif scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else None
    elif scale_rewards == "none":
        return torch.nan_to_num(advantages, nan=0.0)
    else:
        raise ValueError(f"scale_rewards must be one of 'batch', 'group', 'none', got {scale_rewards!r}.")
    advantages = advantages / ((torch.zeros_like(rewards) if std is None else std) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)
