"""One training loss step of methods combined, in float64, written from the papers' formulas (not from the trainers):
the axes in their order, group baseline → rollout rejection → per-token advantage → surrogate (its clip bound) →
stop-gradient gates → the DAPO aggregation (one micro-batch: the token mean) → entropy regulariser.

This file holds GRPO's loss step and what several methods read; each method's formulas are its piece of the pair
table, ``PAIR`` at the end of its test file (``pairs.py``), and TRL's entropy bonus, which has no method module, is
``TRL`` below. ``names`` are registry names; ``s`` holds the settings of the run (``epsilon`` (ε_low), ``epsilon_high``
and each selected method's options).
"""

import functools

import torch

from _reference.float64_policy import completion_logits, entropy_of
from _reference.pairs import PairMethod, PairReference, method_references


def scores(model, inputs):
    """Float64 log-probs of the sampled tokens, entropies, and the logits, at the completion positions (with grad)."""
    logits = completion_logits(model, inputs)
    log_softmax = torch.log_softmax(logits, -1)
    log_probs = log_softmax.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    return log_probs, entropy_of(log_softmax), logits


def weighted_mean(values, weights):
    """The mean of ``values`` weighted by ``weights``, over at least one weight (0 where there is none)."""
    return (values * weights).sum() / weights.sum().clamp(min=1.0)


def covariance(log_probs, advantages, mask):
    """Clip-Cov's and KL-Cov's ``(ℓ_t − ℓ̄)(A_t − Ā)`` over the valid tokens (arXiv:2505.22617, §4.2)."""
    log_probs = log_probs.detach()
    advantages = advantages.expand_as(log_probs)
    centred_log_probs = log_probs - (log_probs * mask).sum() / mask.sum()
    centred_advantages = advantages - (advantages * mask).sum() / mask.sum()
    return centred_log_probs * centred_advantages * mask


def clip_binds(ratio, advantages, s):
    """The PPO clip binds: its clipped term strictly wins the min."""
    return ((ratio > 1 + s["epsilon_high"]) & (advantages > 0)) | ((ratio < 1 - s["epsilon"]) & (advantages < 0))


def trl_entropy_bonus(log_probs, old_log_probs, entropy, logits, sequence_advantages, mask, s):
    """TRL's entropy bonus ``−c·mean H``."""
    return -s["entropy_coef"] * weighted_mean(entropy, mask)


TRL = PairReference(
    settings=dict(entropy_coef=0.1),
    methods={"entreg": PairMethod("entropy regulariser", regulariser=trl_entropy_bonus)},
)


@functools.cache
def references() -> dict[str, PairReference]:
    """Each file that declares a piece of the pair table, from the repository root -> its piece."""
    return {"tests/_reference/combined_reference.py": TRL, **method_references()}


@functools.cache
def pieces() -> dict[str, PairMethod]:
    """Each declared registry name -> its piece."""
    found = {}
    for file, reference in references().items():
        for name, piece in reference.methods.items():
            assert name not in found, f"{name!r} is declared twice, the second time in {file}"
            found[name] = piece
    return found


def stages(names, stage: str) -> list:
    """The float64 formulas of ``names`` at ``stage`` (a field of ``PairMethod``), in the order of ``names``."""
    missing = [name for name in names if name not in pieces()]
    if missing:
        raise LookupError(
            f"no PAIR declares {missing}: test_the_table_covers_every_pair_of_the_registry names the file"
        )
    return [getattr(pieces()[name], stage) for name in names if getattr(pieces()[name], stage) is not None]


def only_stage(names, stage: str):
    """The formula of ``names`` at ``stage``, an axis of one method at a time, or None."""
    found = stages(names, stage)
    assert len(found) <= 1, (names, stage)
    return found[0] if found else None


def group_advantages(rewards, names, s):
    """One group: ``(r − b) / (std + 1e-4)``, ``b`` the mean (GRPO) or a method's group baseline, ``std`` the
    Bessel-corrected standard deviation around the mean."""
    rewards = rewards.double()
    baseline = only_stage(names, "group_baseline")
    baseline = rewards.mean() if baseline is None else baseline(rewards, s)
    return ((rewards - baseline) / (rewards.std() + 1e-4)).unsqueeze(1)


def rollout_rejection(rewards, advantages, old_entropy, mask, names, s):
    """A method's rejection of rollouts by the rollout policy's entropy; the advantages as they are otherwise."""
    reject = only_stage(names, "rollout_rejection")
    return advantages if reject is None else reject(rewards, advantages, old_entropy, mask, s)


def token_advantages(advantages, log_probs, entropy, names, s):
    """A method's per-token advantage, on detached scores; the sequence's advantage at each token otherwise."""
    log_probs, entropy = log_probs.detach(), entropy.detach()
    shape = only_stage(names, "token_advantages")
    return advantages.expand_as(log_probs) if shape is None else shape(advantages, log_probs, entropy, s)


def surrogate(log_probs, old_log_probs, advantages, mask, names, s):
    """The per-token policy loss: a method's surrogate, or the PPO clip."""
    method_surrogate = only_stage(names, "surrogate")
    if method_surrogate is not None:
        return method_surrogate(log_probs, old_log_probs, advantages, mask, s)
    ratio = torch.exp(log_probs - old_log_probs)
    low, high = 1 - s["epsilon"], 1 + s["epsilon_high"]
    return -torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)


def gates(per_token_loss, log_probs, old_log_probs, entropy, old_entropy, advantages, mask, names, s):
    """Every method's gate, one after another: a token is detached if any gate says so, and the weights multiply (in
    any order: detaching, zeroing and weighting without gradient commute)."""
    for gate in stages(names, "gate"):
        per_token_loss = gate(per_token_loss, log_probs, old_log_probs, entropy, old_entropy, advantages, mask, s)
    return per_token_loss


def regulariser(log_probs, old_log_probs, entropy, logits, sequence_advantages, mask, names, s):
    """A method's entropy regulariser, ``A`` the group advantages; none otherwise."""
    method_regulariser = only_stage(names, "regulariser")
    if method_regulariser is None:
        return 0.0
    return method_regulariser(log_probs, old_log_probs, entropy, logits, sequence_advantages, mask, s)


def combined_loss(model, inputs, rewards, names, s, sampling_ratio=None):
    """The loss of one training micro-batch of ``names`` combined (dapo, accumulation 1), with its graph.
    ``sampling_ratio``: TRL's vLLM importance-sampling ratio, which multiplies each token's policy loss after the
    gates (per token, or per sequence with shape ``(B, 1)``)."""
    log_probs, entropy, logits = scores(model, inputs)
    mask = inputs["completion_mask"].double()
    old_log_probs = inputs["old_per_token_logps"].double()
    old_entropy = inputs["old_entropy"].double()
    sequence_advantages = group_advantages(rewards, names, s)
    sequence_advantages = rollout_rejection(rewards, sequence_advantages, old_entropy, mask, names, s)
    advantages = token_advantages(sequence_advantages, log_probs, entropy, names, s)
    per_token_loss = surrogate(log_probs, old_log_probs, advantages, mask, names, s)
    per_token_loss = gates(per_token_loss, log_probs, old_log_probs, entropy, old_entropy, advantages, mask, names, s)
    if sampling_ratio is not None:
        per_token_loss = per_token_loss * sampling_ratio.double()
    loss = (per_token_loss * mask).sum() / mask.sum()
    return loss + regulariser(log_probs, old_log_probs, entropy, logits, sequence_advantages, mask, names, s)
