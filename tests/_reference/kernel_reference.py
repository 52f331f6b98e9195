"""Reference implementation with full logits: simple, memory-hungry, differentiable through autograd.

For the tests and the benchmarks (``benchmarks/`` puts this folder on ``sys.path``); not part of the package. It
materialises the whole ``(N, V)`` logits (and several same-sized intermediates for autograd), which is what the
chunked kernel avoids.
"""

from __future__ import annotations

import math

import torch


def naive_logprob_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    clamp_fraction: float = 0.0,
    logit_scale: float = 1.0,
    final_logit_softcapping: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same outputs as :func:`chunked_logprob_entropy`, computed in fp32 from the full logits.

    The clamped entropy keeps the ``V - floor(clamp_fraction * V)`` largest logits of each row with ``torch.topk``;
    autograd through the gathered values gives the gradient with the kept set held fixed.
    """
    logits = hidden.float() @ weight.float().t()
    if bias is not None:
        logits = logits + bias.float()
    logits = logits * logit_scale
    if final_logit_softcapping is not None:
        logits = final_logit_softcapping * torch.tanh(logits / final_logit_softcapping)
    z = logits / temperature
    log_p = torch.log_softmax(z, dim=-1)
    log_probs = log_p.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    vocab = z.shape[-1]
    k = int(math.floor(clamp_fraction * vocab))
    if k == 0:
        clamped = entropy.clone()
    else:
        kept = torch.topk(z, vocab - k, dim=-1, largest=True, sorted=False).values
        log_pk = torch.log_softmax(kept, dim=-1)
        clamped = -(log_pk.exp() * log_pk).sum(-1)
    return log_probs, entropy, clamped
