"""The independent float64 reference of the fused kernel, shared by the PyTorch and Triton kernel tests (it imports
nothing from the project, so the Triton interpreter script can use it standalone)."""

import math

import torch


def kernel_inputs(n, d, vocab, dtype=torch.float32, seed=0, bias=True, scale=1.0, weight_scale=0.7):
    """Random ``(hidden, weight, bias, targets)`` for the kernel, drawn in float64 and cast to ``dtype``: tie-free
    logits with a spread of about ``sqrt(d) * weight_scale * scale``."""
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, d, generator=g, dtype=torch.float64) * scale).to(dtype)
    weight = (torch.randn(vocab, d, generator=g, dtype=torch.float64) * weight_scale).to(dtype)
    b = (torch.randn(vocab, generator=g, dtype=torch.float64) * 0.5).to(dtype) if bias else None
    return hidden, weight, b, torch.randint(0, vocab, (n,), generator=g)


def float64_logits(hidden, weight, bias=None, temperature=1.0, logit_scale=1.0, final_logit_softcapping=None):
    """The LM head's logits as the kernel's logit map makes them: bias, scale, soft-cap, then the temperature."""
    z = hidden @ weight.T
    if bias is not None:
        z = z + bias
    z = z * logit_scale
    if final_logit_softcapping is not None:
        z = final_logit_softcapping * torch.tanh(z / final_logit_softcapping)
    return z / temperature


def reference(
    hidden,
    weight,
    targets,
    bias=None,
    temperature=1.0,
    clamp_fraction=0.0,
    logit_scale=1.0,
    final_logit_softcapping=None,
):
    """Full logits in float64; the kept set of the clamp from a full sort (no gradient through the selection)."""
    z = float64_logits(hidden, weight, bias, temperature, logit_scale, final_logit_softcapping)
    log_z = torch.logsumexp(z, -1)
    p = torch.softmax(z, -1)
    log_probs = z.gather(-1, targets[:, None]).squeeze(-1) - log_z
    entropy = log_z - (p * z).sum(-1)
    k = math.floor(clamp_fraction * z.shape[-1])
    if k == 0:
        return log_probs, entropy, entropy
    kth = z.detach().sort(-1).values[:, k - 1 : k]
    kept = z.detach() > kth
    z_kept = z.masked_fill(~kept, -math.inf)
    log_zc = torch.logsumexp(z_kept, -1)
    pc = torch.softmax(z_kept, -1)
    clamped = log_zc - (pc * z.masked_fill(~kept, 0.0)).sum(-1)
    return log_probs, entropy, clamped
