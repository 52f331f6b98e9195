"""Each ``loss_type`` of TRL 1.16 in float64, written from its paper's formula as TRL computes it: the per-token
surrogate, a method's change to it, TRL's k3 KL term, then the loss type's aggregation (one micro-batch, one process).
The methods' tests give their own change (a gate, a weight) and compare their trainer's loss and gradients with it;
their float64 log-probs come from ``combined_reference.scores``."""

import torch


# Every loss type with options that make its branches act: the clipped ones with TRL's dual clip (delta), the KL term
# or the sequence-level ratio, CISPO with an ε_max low enough to truncate noisy ratios.
LOSS_TYPE_CASES = {
    "grpo": {"delta": 1.2},
    "bnpo": {"beta": 0.04},
    "dr_grpo": {"epsilon_high": 0.28},
    "dapo": {"importance_sampling_level": "sequence"},
    "cispo": {"epsilon_high": 1.2},
    "sapo": {},
    "luspo": {"importance_sampling_level": "sequence"},
    "vespo": {},
}


def float64_loss(loss_type, args, log_probs, inputs, change=lambda surrogate: surrogate):
    """The loss of ``loss_type`` with ``args`` (its clip, ``delta``, KL, importance-sampling level and the loss
    types' own settings) from float64 ``log_probs``; ``change`` maps the per-token surrogate ``(B, T)`` to what is
    aggregated (a method's gate or weight), before the KL term is added."""
    mask = inputs["completion_mask"].double()
    advantages = inputs["advantages"].double().unsqueeze(1)
    token_log_ratio = log_probs - inputs["old_per_token_logps"].double()
    log_ratio = token_log_ratio
    if args.importance_sampling_level == "sequence":
        log_ratio = ((token_log_ratio * mask).sum(-1) / mask.sum(-1)).unsqueeze(1)
    ratio = torch.exp(log_ratio)
    epsilon_low = args.epsilon
    epsilon_high = args.epsilon if args.epsilon_high is None else args.epsilon_high
    if loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        capped = ratio if args.delta is None else torch.clamp(ratio, max=args.delta)
        clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
        surrogate = -torch.minimum(capped * advantages, clipped * advantages)
    elif loss_type == "cispo":
        surrogate = -torch.clamp(ratio, max=epsilon_high).detach() * advantages * log_probs
    elif loss_type == "sapo":
        tau = torch.where(advantages > 0, args.sapo_temperature_pos, args.sapo_temperature_neg).double()
        surrogate = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * advantages
    else:  # vespo
        w = torch.exp((token_log_ratio * mask).sum(-1, keepdim=True)).detach()
        positive = advantages >= 0
        k = torch.where(positive, args.vespo_k_pos, args.vespo_k_neg).double()
        lam = torch.where(positive, args.vespo_lambda_pos, args.vespo_lambda_neg).double()
        surrogate = -(torch.exp(lam) * w**k * torch.exp(-lam * w)) * advantages * log_probs
    per_token = change(surrogate.expand_as(mask))
    if args.beta:
        reference_log_ratio = inputs["ref_per_token_logps"].double() - log_probs
        kl = torch.exp(reference_log_ratio) - reference_log_ratio - 1
        per_token = per_token + args.beta * (kl * ratio if args.use_bias_correction_kl else kl)
    masked = per_token * mask
    if loss_type in ("grpo", "sapo"):
        return (masked.sum(-1) / mask.sum(-1)).mean()
    if loss_type == "bnpo":
        return masked.sum() / mask.sum()
    if loss_type == "dr_grpo":
        return masked.sum() / (mask.size(0) * args.max_completion_length)
    if loss_type == "luspo":
        return masked.sum(-1).mean()
    return masked.sum() / inputs["num_items_in_batch"]  # dapo, cispo, vespo: the generation batch's tokens
