"""One training loss step of methods combined, in float64, written from the papers' formulas (not from the trainers):
the axes in their order, group baseline → rollout rejection → per-token advantage → surrogate (its clip bound) →
stop-gradient gates → the DAPO aggregation (one micro-batch: the token mean) → entropy regulariser.

``names`` are registry names; ``s`` holds the settings of the run (``epsilon`` (ε_low), ``epsilon_high`` and each
selected method's options).
"""

import math

import torch


def scores(model, inputs):
    """Float64 log-probs of the sampled tokens, entropies, and the logits, at the completion positions (with grad)."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, inputs["prompt_ids"].size(1) - 1 : -1]
    log_softmax = torch.log_softmax(logits, -1)
    log_probs = log_softmax.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_probs, entropy, logits


def clamped_entropy(logits, fraction):
    """AEnt (arXiv:2509.03493): the entropy of the softmax over the top (1 − p) of the vocabulary by logit."""
    k = math.floor(fraction * logits.size(-1))
    kth = logits.detach().sort(-1).values[..., k - 1 : k]
    kept = logits.detach() > kth
    log_softmax = torch.log_softmax(logits.masked_fill(~kept, -math.inf), -1)
    return -(log_softmax.exp().masked_fill(~kept, 0.0) * log_softmax.masked_fill(~kept, 0.0)).sum(-1)


def top_p_entropy(logits, p, k, include_crossing=False):
    """SIREN (arXiv:2509.25133; the authors' ``efficient_top_p_sampling``): the entropy of the softmax renormalised
    over the logits ranked down whose cumulative full-softmax mass stays below ``p``, among the ``k`` largest (the
    token whose mass crosses ``p`` left out, or kept with ``include_crossing``); 0 with no gradient on an empty set.
    Returns ``(entropy, set size)``."""
    probs = torch.softmax(logits.detach(), -1)
    ordered = probs.sort(-1, descending=True)
    mass = ordered.values.cumsum(-1)
    before = mass - ordered.values if include_crossing else mass
    rank = torch.arange(logits.size(-1))
    keep_ranked = (before < p) & (rank < k)
    kept = torch.zeros_like(keep_ranked).scatter(-1, ordered.indices, keep_ranked)
    empty = ~kept.any(-1, keepdim=True)
    log_softmax = torch.log_softmax(logits.masked_fill(~kept | empty, -math.inf).masked_fill(empty, 0.0), -1)
    log_softmax = log_softmax.masked_fill(~kept, 0.0)  # before the product: 0 · (−inf) would make the gradient NaN
    return -(log_softmax.exp().masked_fill(~kept, 0.0) * log_softmax).sum(-1), kept.sum(-1).double()


def peak_mean(values, mask, ratio):
    """SIREN's peak-entropy mask and mean: per sequence the valid values strictly above their ``ratio``-quantile
    (linear interpolation), averaged per sequence, then over the sequences (one without a kept value counts 0)."""
    means = []
    for row, valid in zip(values, mask.bool(), strict=True):
        chosen = row.detach()[valid].sort().values
        if len(chosen) == 0:
            means.append(row.sum() * 0.0)
            continue
        position = ratio * (len(chosen) - 1)
        low = math.floor(position)
        quantile = chosen[low] + (position - low) * (chosen[min(low + 1, len(chosen) - 1)] - chosen[low])
        keep = valid & (row.detach() > quantile)
        means.append((row * keep).sum() / keep.sum().clamp(min=1))
    return torch.stack(means).mean()


def group_advantages(rewards, names, s):
    """One group: ``(r − b) / (std + 1e-4)``, ``b`` the mean (GRPO) or the K-quantile (QAE, arXiv:2509.22611), ``std``
    the Bessel-corrected standard deviation around the mean."""
    rewards = rewards.double()
    if "qae" in names:
        ordered = rewards.sort().values
        position = s["qae_quantile_k"] * (len(ordered) - 1)
        low = math.floor(position)
        baseline = ordered[low] + (position - low) * (ordered[min(low + 1, len(ordered) - 1)] - ordered[low])
    else:
        baseline = rewards.mean()
    return ((rewards - baseline) / (rewards.std() + 1e-4)).unsqueeze(1)


def rollout_rejection(rewards, advantages, old_entropy, mask, names, s):
    """Entrocraft (arXiv:2604.26326), with a fixed band ``[L, U]``: the rollout policy's token-mean entropy ``H̄``
    above ``U`` rejects the negative rollouts, below ``L`` the positive ones. The authors' code takes
    ``max(R − b₀, 0)`` or ``min(R − b₀, 0)`` of the raw reward there (``entrocraft``); the sign form zeroes the
    advantages of the rejected sign (``entrocraft_sign``)."""
    if "entrocraft" not in names and "entrocraft_sign" not in names:
        return advantages
    mean_entropy = float((old_entropy * mask).sum() / mask.sum())
    above, below = mean_entropy > s["entrocraft_upper_start"], mean_entropy < s["entrocraft_lower_start"]
    if not (above or below):
        return advantages
    if "entrocraft" in names:
        shifted = (rewards.double() - s.get("entrocraft_reward_offset", 0.0)).unsqueeze(1)
        return shifted.clamp(min=0) if above else shifted.clamp(max=0)
    return advantages * ((advantages >= 0) if above else (advantages <= 0))


def token_advantages(advantages, log_probs, entropy, names, s):
    """REPO-R / REPO-D (arXiv:2603.11682, §5.1; β at its initial value, no centring) or entropy-based advantage
    shaping (arXiv:2506.14758: ``A + min(α·H, |A|/κ)``), on detached scores."""
    log_probs, entropy = log_probs.detach(), entropy.detach()
    if "repo_r" in names:
        return advantages * (1 - s["repo_beta"] * advantages.sign() * log_probs).clamp(min=0)
    if "repo_d" in names:
        return advantages - s["repo_beta"] * log_probs
    if "ent_adv" in names:
        return advantages + torch.minimum(s["ent_adv_alpha"] * entropy, advantages.abs() / s["ent_adv_kappa"])
    return advantages.expand_as(log_probs)


def covariance(log_probs, advantages, mask):
    """Clip-Cov's and KL-Cov's ``(ℓ_t − ℓ̄)(A_t − Ā)`` over the valid tokens (arXiv:2505.22617, §4.2)."""
    log_probs = log_probs.detach()
    advantages = advantages.expand_as(log_probs)
    centred_log_probs = log_probs - (log_probs * mask).sum() / mask.sum()
    centred_advantages = advantages - (advantages * mask).sum() / mask.sum()
    return centred_log_probs * centred_advantages * mask


def clip_active(ratio, advantages, s):
    return ((ratio > 1 + s["epsilon_high"]) & (advantages > 0)) | ((ratio < 1 - s["epsilon"]) & (advantages < 0))


def surrogate(log_probs, old_log_probs, advantages, mask, names, s):
    """The per-token policy loss: the PPO clip, CE-GPPO's (arXiv:2509.20712, eq. 8: clipped tokens keep ``β·(1∓ε)·A``
    as gradient through ``r / sg(r)``) or KL-Cov's (``−A·r`` plus ``β_KL·|ℓ − ℓ^old|`` on the top-κ tokens by
    covariance)."""
    ratio = torch.exp(log_probs - old_log_probs)
    low, high = 1 - s["epsilon"], 1 + s["epsilon_high"]
    if "ce_gppo" in names:
        kept = ratio / ratio.detach()
        below = (ratio < low) & (advantages < 0)
        above = (ratio > high) & (advantages > 0)
        return torch.where(
            below,
            -s["ce_gppo_beta1"] * low * kept * advantages,
            torch.where(above, -s["ce_gppo_beta2"] * high * kept * advantages, -ratio * advantages),
        )
    if "kl_cov" in names:
        selected = top_by_covariance(covariance(log_probs, advantages, mask), mask, s["kl_cov_ratio"])
        return -advantages * ratio + s["kl_cov_coef"] * (log_probs - old_log_probs).abs() * selected
    return -torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)


def top_by_covariance(cov, mask, fraction):
    count = max(math.floor(fraction * int(mask.sum())), 1)
    values = cov[mask.bool()].sort(descending=True).values
    return (cov >= values[count - 1]) & mask.bool()


def gates(per_token_loss, log_probs, old_log_probs, entropy, old_entropy, advantages, mask, names, s):
    """Clip-Cov zeroes the loss of the valid tokens whose clip does not bind and whose covariance lies in
    ``(lb, ub)`` (all of them: the tests' ratio selects every candidate); ERC detaches the loss where the entropy ratio
    ``(H + 1e-8) / (H^old + 1e-8)`` leaves ``(L, U)`` (arXiv:2512.05591); STEER multiplies it by
    ``clamp(exp(−κ|Ω|), λ_min, 1)``, ``Ω = (A / p^old)·p(1 − p)·(log p + H^old)``,
    ``κ = −ln λ_min / max(max|Ω|, 0.02)`` over the valid tokens (arXiv:2510.10150), without gradient. A token is
    detached if any gate says so."""
    if "erc" in names:
        rho = (entropy.detach() + 1e-8) / (old_entropy + 1e-8)
        keep = (rho > s["erc_low"]) & (rho < s["erc_high"])
        per_token_loss = torch.where(keep, per_token_loss, per_token_loss.detach())
    if "clip_cov" in names:
        ratio = torch.exp(log_probs - old_log_probs).detach()
        cov = covariance(log_probs, advantages, mask)
        candidates = (
            mask.bool() & ~clip_active(ratio, advantages, s) & (cov > s["clip_cov_lb"]) & (cov < s["clip_cov_ub"])
        )
        per_token_loss = torch.where(candidates, torch.zeros_like(per_token_loss), per_token_loss)
    if "steer" in names:
        p, p_old = log_probs.detach().exp(), old_log_probs.exp()
        mu = (advantages.expand_as(p) / p_old * p * (1 - p) * (p.log() + old_entropy)).abs()
        kappa = -math.log(s["steer_weight_min"]) / max(float(mu[mask.bool()].max()), 0.02)
        per_token_loss = per_token_loss * (torch.exp(-kappa * mu).clamp(s["steer_weight_min"], 1.0) * mask)
    return per_token_loss


def regulariser(log_probs, old_log_probs, entropy, logits, sequence_advantages, mask, names, s):
    """TRL's entropy bonus ``−c·mean H``, AEnt's ``−λ·mean H_clamped``, SIREN's ``c·(peak mean H^p − H_anchor)²`` or
    EntroPIC's ``α·mean_high(−r·|A|)`` with
    ``α = clip(K_p·(H̄ − H*), −1, 1)`` at the first micro-batch (arXiv:2511.15248), ``A`` the group advantages."""
    token_mean = lambda values, weights: (values * weights).sum() / weights.sum().clamp(min=1.0)  # noqa: E731
    if "entreg" in names:
        return -s["entropy_coef"] * token_mean(entropy, mask)
    if "aent" in names:
        return -s["aent_coef_init"] * token_mean(clamped_entropy(logits, s["aent_clamp_fraction"]), mask)
    if "siren" in names:
        entropy_p, _ = top_p_entropy(logits, s["siren_top_p"], s["siren_top_k"])
        return s["siren_coef"] * (peak_mean(entropy_p, mask, s["siren_mask_ratio"]) - s["siren_anchor"]) ** 2
    if "entropic" in names:
        mean_entropy = token_mean(entropy.detach(), mask).item()
        alpha = min(max(s["entropic_kp"] * (mean_entropy - s["entropic_target"]), -1.0), 1.0)
        high = ((log_probs.detach() > math.log(s["entropic_high_prob"])) & mask.bool()).double()
        return alpha * token_mean(-torch.exp(log_probs - old_log_probs) * sequence_advantages.abs(), high)
    return 0.0


def combined_loss(model, inputs, rewards, names, s):
    """The loss of one training micro-batch of ``names`` combined (dapo, accumulation 1), with its graph."""
    log_probs, entropy, logits = scores(model, inputs)
    mask = inputs["completion_mask"].double()
    old_log_probs = inputs["old_per_token_logps"].double()
    old_entropy = inputs["old_entropy"].double()
    sequence_advantages = group_advantages(rewards, names, s)
    sequence_advantages = rollout_rejection(rewards, sequence_advantages, old_entropy, mask, names, s)
    advantages = token_advantages(sequence_advantages, log_probs, entropy, names, s)
    per_token_loss = surrogate(log_probs, old_log_probs, advantages, mask, names, s)
    per_token_loss = gates(per_token_loss, log_probs, old_log_probs, entropy, old_entropy, advantages, mask, names, s)
    loss = (per_token_loss * mask).sum() / mask.sum()
    return loss + regulariser(log_probs, old_log_probs, entropy, logits, sequence_advantages, mask, names, s)
