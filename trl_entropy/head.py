"""The entropy head: per-token log-prob, entropy and clamped entropy of the completion, from the fused kernel.

The head is installed by patching the model's ``forward`` (as TRL does for its own fused head), so the call still goes
through whatever wraps the model (DDP, FSDP, DeepSpeed, PEFT) and gradient synchronisation stays intact. Called
with ``entropy_head=EntropyHeadRequest(...)`` the forward runs the backbone only, then the kernel on the completion
positions whose mask is set; the ``(tokens × vocabulary)`` logits never exist. Without it, the forward is the
previous one, so generation and TRL's own fused head keep working.
"""

import functools
import types
from dataclasses import dataclass

import torch
from transformers.utils import ModelOutput

from trl_entropy.kernels import chunked_logprob_entropy


@dataclass(frozen=True)
class EntropyHeadRequest:
    """What one call of the entropy head computes.

    Args:
        logits_to_keep: number of trailing positions (the completion) to score.
        clamp_fraction: fraction of the vocabulary (smallest logits) dropped for the clamped entropy; 0 skips it.
        chunk_size: kernel chunk size in tokens (None: the kernel's default).
        backend: kernel backend, "auto", "torch" or "triton".
    """

    logits_to_keep: int
    clamp_fraction: float = 0.0
    chunk_size: int | None = None
    backend: str = "auto"


@dataclass
class EntropyHeadOutput(ModelOutput):
    """Per-token statistics of the scored completion positions, shape ``(B, logits_to_keep)``, zero where masked."""

    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    clamped_entropy: torch.Tensor | None = None


def unsupported_head_reason(model) -> str | None:
    """Why the entropy head cannot score ``model`` exactly, or None when it can."""
    if model.get_output_embeddings() is None:
        return (
            f"{type(model).__name__} has no output embedding (`get_output_embeddings()` is None): the entropy head "
            "needs the LM-head weight to compute log-probs and entropies"
        )
    text_config = model.config.get_text_config()
    if getattr(text_config, "final_logit_softcapping", None) is not None:
        return (
            f"{type(model).__name__} soft-caps its logits (`final_logit_softcapping`); the entropy kernel computes "
            "log-probs and entropies of the uncapped logits, so it would score a different policy"
        )
    for scale_attribute in ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling"):
        if getattr(text_config, scale_attribute, None) not in (None, 1, 1.0):
            return (
                f"{type(model).__name__} rescales its logits (`{scale_attribute}`); the entropy kernel does not apply "
                "that scale, so it would score a different policy"
            )
    return None


def install_entropy_head(model, temperature: float, cast_lm_head_to_fp32: bool = False) -> None:
    """Patch ``model.forward`` to accept ``entropy_head=EntropyHeadRequest(...)`` (see the module docstring)."""
    reason = unsupported_head_reason(model)
    if reason is not None:
        raise ValueError(reason)
    previous_forward = model.forward

    @functools.wraps(type(model).forward)  # `generate` validates its kwargs against this signature
    def forward(self, *args, entropy_head: EntropyHeadRequest | None = None, **kwargs):
        if entropy_head is None:
            return previous_forward(*args, **kwargs)
        input_ids, attention_mask = kwargs["input_ids"], kwargs["attention_mask"]
        kwargs["use_cache"] = False
        # The backbone and head are looked up on every call: PEFT and FSDP replace modules after patching.
        hidden_states = self.base_model(*args, **kwargs).last_hidden_state
        keep = entropy_head.logits_to_keep
        # The state at position j predicts token j + 1.
        hidden_states = hidden_states[:, -keep - 1 : -1]
        targets = input_ids[:, -keep:]
        mask = attention_mask[:, -keep:].bool()
        lm_head = self.get_output_embeddings()
        # PEFT wrappers of the head (e.g. for `trainable_token_indices`) expose `weight` but may have no `bias`.
        weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
        device = weight.device.type
        hidden_states, mask, targets = (
            hidden_states.to(weight.device),
            mask.to(weight.device),
            targets.to(weight.device),
        )
        # The kernel accumulates in fp32 whatever its inputs, and runs outside autocast. Under autocast it gets the
        # operands autocast would give a matmul (the autocast dtype), unless the head is kept in fp32.
        if cast_lm_head_to_fp32:
            compute_dtype = torch.float32
        elif torch.is_autocast_enabled(device):
            compute_dtype = torch.get_autocast_dtype(device)
        else:
            compute_dtype = weight.dtype
        with torch.autocast(device, enabled=False):
            per_token = chunked_logprob_entropy(
                hidden_states[mask].to(compute_dtype),
                weight.to(compute_dtype),
                targets[mask],
                bias=None if bias is None else bias.to(compute_dtype),
                temperature=temperature,
                clamp_fraction=entropy_head.clamp_fraction,
                chunk_size=entropy_head.chunk_size,
                backend=entropy_head.backend,
            )
        # `masked_scatter` keeps an all-masked micro-batch connected to the graph (a differentiable zero).
        log_probs, entropy, clamped_entropy = (
            mask.new_zeros(mask.shape, dtype=torch.float32).masked_scatter(mask, x) for x in per_token
        )
        return EntropyHeadOutput(
            log_probs=log_probs,
            entropy=entropy,
            clamped_entropy=clamped_entropy if entropy_head.clamp_fraction > 0 else None,
        )

    model.forward = types.MethodType(forward, model)
