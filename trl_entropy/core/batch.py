"""``CompletionBatch``: what every seam of the loss step sees about one micro-batch of completions."""

from dataclasses import dataclass, field

import torch


# The generation batch's key for the rollout policy's full entropy H^old, (B, T): kept only where a method's part
# declares ``needs_rollout_entropy`` (computed in the pass that computes TRL's old_per_token_logps; TRL's shuffle and
# split carry it to the micro-batches with the rest of the batch).
OLD_ENTROPY_KEY = "old_entropy"


@dataclass
class CompletionBatch:
    """One micro-batch of completions as the loss step sees it. Per-token tensors are ``(B, T)``: ``B`` completions,
    ``T`` completion positions (right-padded).

    Attributes:
        log_probs: ``ℓ_t``, log-probability of each sampled token under the policy being trained; differentiable.
        old_log_probs: ``ℓ^old_t``, the same under the rollout policy; detached. Equal to ``log_probs.detach()`` when
            training is on-policy (TRL then skips computing them).
        entropy: ``H_t``, the full entropy of the policy at each position; differentiable.
        clamped_entropy: ``H^c_t``, the entropy renormalised over the logits left after dropping the ``floor(p·V)``
            smallest, when a part's ``clamp_fraction()`` is above 0; ``None`` otherwise. Differentiable.
        mask: ``m_t``, 1 on the tokens that count (the completion mask times TRL's tool mask), 0 elsewhere.
        group_advantages: ``A``, one advantage per completion, ``(B, 1)``: its reward against its prompt group's
            baseline (TRL's mean, or a part's ``group_baseline``), scaled as TRL scales it; computed once per
            generation batch. Step 3 of the loss step turns them into the token advantages the surrogate multiplies.
        mode: ``"train"`` or ``"eval"``: the key of the trainer's metric dict the hooks log into.
        entropy_mask: the tokens TRL's high-entropy filter keeps (``top_entropy_quantile < 1``), or ``None`` (all).
            Set by the base before any hook sees the batch.
        importance_sampling_ratio: TRL's vLLM importance-sampling ratios of this micro-batch (vLLM with
            ``vllm_importance_sampling_correction``), or ``None``; VESPO folds them into its sequence weight.
        old_entropy: ``H^old_t``, the full entropy of the rollout policy at each position, detached, where a method's
            part declares ``needs_rollout_entropy`` (``None`` otherwise). Computed in the same pass as
            ``old_log_probs``; equal to ``entropy.detach()`` when training is on-policy (TRL then computes neither).
        top_p_entropy: ``H^p_t``, the entropy renormalised over the top-p set of the full softmax (a part's
            ``top_p_rule()``; the empty set gives 0), or ``None``. Differentiable.
        top_p_set_size: ``|S_t|``, the size of that set (no gradient), or ``None``.
        carried: the per-token tensors of this micro-batch that the parts asked to carry from its generation batch
            (the keys of their ``carried_token_keys``, each ``(B, T)``), e.g. a selection made once per generation
            batch.
        world_means: in training, ``{statistic: token mean over every rank}`` of this micro-batch for each statistic
            a controller of cadence ``"micro_batch"`` reads (EntroPIC's entropy); it moves on them after the step.
    """

    log_probs: torch.Tensor
    old_log_probs: torch.Tensor
    entropy: torch.Tensor
    clamped_entropy: torch.Tensor | None
    mask: torch.Tensor
    group_advantages: torch.Tensor
    mode: str = "train"
    entropy_mask: torch.Tensor | None = None
    importance_sampling_ratio: torch.Tensor | None = None
    old_entropy: torch.Tensor | None = None
    top_p_entropy: torch.Tensor | None = None
    top_p_set_size: torch.Tensor | None = None
    carried: dict[str, torch.Tensor] = field(default_factory=dict)
    world_means: dict[str, float] = field(default_factory=dict)
