"""The entropy head: per-token log-prob, entropy and clamped (or SIREN's top-p) entropy of the completion, from the
fused kernel.

The head is installed by patching the model's ``forward`` (as TRL does for its own fused head), so the call still goes
through whatever wraps the model (DDP, FSDP, DeepSpeed, PEFT) and gradient synchronisation stays intact. Called
with ``entropy_head=EntropyHeadRequest(...)`` the forward runs the backbone only, then the kernel on the completion
positions whose mask is set; the ``(tokens × vocabulary)`` logits never exist. Without it, the forward is the
previous one, so generation and TRL's own fused head keep working.

The head scores the policy the model samples from: its logits are rescaled (``logit_scale`` and its aliases) and
soft-capped (``final_logit_softcapping``) as the model does it, both read the way TRL 1.16's fused head reads them.
The LM-head weight is made whole for the kernel: a DTensor (FSDP2) through ``full_tensor()``, a ZeRO-3 partition
through TRL's ``maybe_gather_lm_head_ctx`` (the kernel gathers it again in its recomputing backward). For a
Mixture-of-Experts model the forward also returns the router load-balancing loss, computed as TRL computes it.

:func:`score_completions` is how the trainer scores: every forward of the loss step, the rollout and the reference
log-probs goes through it, so the on-policy ratio is exactly 1.
"""

import contextlib
import functools
import types
from dataclasses import dataclass

import torch
import transformers
from accelerate.utils import extract_model_from_parallel, is_peft_model
from torch.distributed.tensor import DTensor, Partial
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import ModelOutput
from trl.trainer.utils import maybe_gather_lm_head_ctx

from trl_entropy.kernels import chunked_logprob_entropy

from .multimodal import check_image_tokens, explained_mismatch, multimodal_inputs, rows_of


@dataclass(frozen=True)
class EntropyHeadRequest:
    """What one call of the entropy head computes.

    Args:
        logits_to_keep: number of trailing positions (the completion) to score.
        clamp_fraction: fraction of the vocabulary (smallest logits) dropped for the clamped entropy; 0 skips it.
        chunk_size: kernel chunk size in tokens (None: the kernel's default).
        backend: kernel backend, "auto", "torch" or "triton".
        compute_aux_loss: also return the MoE router load-balancing loss (the model must have a router).
        top_p: SIREN's mass ``p`` in ``(0, 1]``: also compute the entropy over each position's top-p set (the token
            whose mass crosses ``p`` left out) and the set's size; None skips it. Needs ``clamp_fraction == 0``.
        top_k: with ``top_p``, the set is within the ``top_k`` largest logits (None: the whole vocabulary).
        include_crossing: with ``top_p``, also keep the token whose mass crosses ``p`` (the standard nucleus).
    """

    logits_to_keep: int
    clamp_fraction: float = 0.0
    chunk_size: int | None = None
    backend: str = "auto"
    compute_aux_loss: bool = False
    top_p: float | None = None
    top_k: int | None = None
    include_crossing: bool = False


@dataclass
class EntropyHeadOutput(ModelOutput):
    """Per-token statistics of the scored completion positions, shape ``(B, logits_to_keep)``, zero where masked."""

    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    clamped_entropy: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None  # the router load-balancing loss, when requested
    top_p_entropy: torch.Tensor | None = None  # with top_p
    top_p_set_size: torch.Tensor | None = None  # with top_p: float, no gradient


def logit_transform(text_config) -> tuple[float, float | None]:
    """``(logit_scale, final_logit_softcapping)`` of a model's logits, read as TRL 1.16's fused head reads them.

    The scale multiplies the LM-head output. Its attribute depends on the family: ``logit_scale`` (Cohere; None means
    unscaled), ``output_multiplier``, ``lm_head_multiplier`` (Falcon-H1), else ``logits_scaling``, which Granite and
    MiniCPM3 divide by and HyperCLOVA X multiplies by. The first attribute that is set wins.
    """
    scale = None
    for attribute in ("logit_scale", "output_multiplier", "lm_head_multiplier"):
        scale = getattr(text_config, attribute, None)
        if scale is not None:
            break
    divisor = getattr(text_config, "logits_scaling", None)
    if scale is None and divisor is not None:
        scale = divisor if text_config.model_type == "hyperclovax" else 1 / divisor
    return (1.0 if scale is None else float(scale)), getattr(text_config, "final_logit_softcapping", None)


def router_load_balancing_loss(model, router_logits, attention_mask) -> torch.Tensor:
    """The MoE load-balancing loss of one forward, with the function and expert counts TRL 1.16 uses."""
    # Mixtral's loss is the one every MoE family in transformers shares.
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    text_config = model.config.get_text_config()
    return load_balancing_loss_func(
        router_logits, text_config.num_experts, text_config.num_experts_per_tok, attention_mask
    )


def unsupported_head_reason(model) -> str | None:
    """Why the entropy head cannot score ``model`` exactly, or None when it can."""
    if model.get_output_embeddings() is None:
        with_head = "AutoModelForCausalLM"
        if getattr(model.config, "vision_config", None) is not None:  # a vision-language backbone (AutoModel's)
            with_head = "AutoModelForImageTextToText (the *ForConditionalGeneration class)"
        return (
            f"{type(model).__name__} has no output embedding (`get_output_embeddings()` is None): the entropy head "
            f"needs the LM-head weight to compute log-probs and entropies. Load the model with {with_head}, which "
            "has the LM head"
        )
    return None


def gather_lm_head(weight, bias):
    """The kernel's ``gather_parameters``: TRL's ZeRO-3 gather of the LM-head parameters (a null context without
    ZeRO-3). Only parameters are gathered: a copy converted by the head is already whole."""
    return maybe_gather_lm_head_ctx(*(p for p in (weight, bias) if isinstance(p, torch.nn.Parameter)))


def install_entropy_head(model, temperature: float, cast_lm_head_to_fp32: bool = False) -> None:
    """Patch ``model.forward`` to accept ``entropy_head=EntropyHeadRequest(...)`` (see the module docstring)."""
    reason = unsupported_head_reason(model)
    if reason is not None:
        raise ValueError(reason)
    previous_forward = model.forward
    logit_scale, final_logit_softcapping = logit_transform(model.config.get_text_config())

    @functools.wraps(type(model).forward)  # `generate` validates its kwargs against this signature
    def forward(self, *args, entropy_head: EntropyHeadRequest | None = None, **kwargs):
        if entropy_head is None:
            return previous_forward(*args, **kwargs)
        input_ids, attention_mask = kwargs["input_ids"], kwargs["attention_mask"]
        kwargs["use_cache"] = False
        if entropy_head.compute_aux_loss:
            kwargs["output_router_logits"] = True
        # The backbone and head are looked up on every call: PEFT and FSDP replace modules after patching. A
        # vision-language model's backbone takes the multimodal inputs and returns the language model's states.
        try:
            backbone_outputs = self.base_model(*args, **kwargs)
        except ValueError as error:
            explained = explained_mismatch(self, error)
            if explained is None:
                raise
            raise explained from error
        hidden_states = backbone_outputs.last_hidden_state
        keep = entropy_head.logits_to_keep
        # The state at position j predicts token j + 1.
        hidden_states = hidden_states[:, -keep - 1 : -1]
        targets = input_ids[:, -keep:]
        mask = attention_mask[:, -keep:].bool()
        lm_head = self.get_output_embeddings()
        # PEFT wrappers of the head (e.g. for `trainable_token_indices`) expose `weight` but may have no `bias`.
        weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
        # FSDP2 shards the head as DTensors; the kernel multiplies plain tensors. `full_tensor()` all-gathers the
        # weight. Each rank scores its own batch, so the gradient differs between ranks: declared a partial to average,
        # it is reduce-scattered in the backward (the default, a replicated gradient, would leave each shard with its
        # own rank's gradient). FSDP's own reduction never sees it: the head module itself is not called.
        if isinstance(weight, DTensor):
            weight = weight.full_tensor(grad_placements=[Partial("avg")] * len(weight.placements))
        if isinstance(bias, DTensor):
            bias = bias.full_tensor(grad_placements=[Partial("avg")] * len(bias.placements))
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
        # Under ZeRO-3 the head's own gather hook never fires (the module is not called): gather its parameters here,
        # before a dtype conversion would copy the empty partition (the kernel gathers again in its backward).
        with torch.autocast(device, enabled=False), maybe_gather_lm_head_ctx(weight, bias):
            per_token = chunked_logprob_entropy(
                hidden_states[mask].to(compute_dtype),
                weight.to(compute_dtype),
                targets[mask],
                bias=None if bias is None else bias.to(compute_dtype),
                temperature=temperature,
                clamp_fraction=entropy_head.clamp_fraction,
                chunk_size=entropy_head.chunk_size,
                backend=entropy_head.backend,
                logit_scale=logit_scale,
                final_logit_softcapping=final_logit_softcapping,
                gather_parameters=gather_lm_head,
                top_p=entropy_head.top_p,
                top_k=entropy_head.top_k,
                include_crossing=entropy_head.include_crossing,
                return_kept_count=entropy_head.top_p is not None,
            )
        # `masked_scatter` keeps an all-masked micro-batch connected to the graph (a differentiable zero).
        log_probs, entropy, third, *set_size = (
            mask.new_zeros(mask.shape, dtype=torch.float32).masked_scatter(mask, x) for x in per_token
        )
        aux_loss = None
        if entropy_head.compute_aux_loss:
            aux_loss = router_load_balancing_loss(self, backbone_outputs.router_logits, attention_mask)
        top_p = entropy_head.top_p is not None
        return EntropyHeadOutput(
            log_probs=log_probs,
            entropy=entropy,
            clamped_entropy=third if entropy_head.clamp_fraction > 0 else None,
            aux_loss=aux_loss,
            top_p_entropy=third if top_p else None,
            top_p_set_size=set_size[0] if top_p else None,
        )

    model.forward = types.MethodType(forward, model)


@dataclass
class ScoredCompletions:
    """Per-token statistics of the completions, ``(B, T)``, and the MoE router loss when it was asked for. With
    ``top_p`` requested, also the top-p set's entropy (differentiable) and size (float, no gradient); else None."""

    log_probs: torch.Tensor
    entropy: torch.Tensor
    clamped_entropy: torch.Tensor | None
    router_loss: torch.Tensor | None
    top_p_entropy: torch.Tensor | None = None
    top_p_set_size: torch.Tensor | None = None


def score_completions(
    model,
    input_ids,
    attention_mask,
    request: EntropyHeadRequest,
    batch_size: int | None = None,
    autocast=None,
    multimodal: dict | None = None,
) -> ScoredCompletions:
    """Run the entropy head over ``input_ids`` in slices of ``batch_size`` rows (all at once when None), under
    ``autocast`` (a context manager factory, e.g. the accelerator's). A vision-language model also gets the batch's
    ``multimodal`` inputs (``core/multimodal.py``), each slice its own rows' images. The router loss is averaged over
    the slices, as TRL averages it over its forward passes."""
    multimodal = multimodal_inputs(multimodal or {})
    check_image_tokens(
        unwrapped(model), input_ids, attention_mask, request.logits_to_keep, "pixel_values" in multimodal
    )
    rows = input_ids.size(0)
    batch_size = batch_size or rows
    outputs = []
    for start in range(0, rows, batch_size):
        end = min(start + batch_size, rows)
        with autocast() if autocast is not None else contextlib.nullcontext():
            outputs.append(
                model(
                    input_ids=input_ids[start:end],
                    attention_mask=attention_mask[start:end],
                    entropy_head=request,
                    **rows_of(multimodal, start, end),
                )
            )
    return ScoredCompletions(
        log_probs=torch.cat([o.log_probs for o in outputs]),
        entropy=torch.cat([o.entropy for o in outputs]),
        clamped_entropy=torch.cat([o.clamped_entropy for o in outputs]) if request.clamp_fraction > 0 else None,
        router_loss=torch.stack([o.aux_loss for o in outputs]).mean() if request.compute_aux_loss else None,
        top_p_entropy=torch.cat([o.top_p_entropy for o in outputs]) if request.top_p is not None else None,
        top_p_set_size=torch.cat([o.top_p_set_size for o in outputs]) if request.top_p is not None else None,
    )


def unwrapped(model):
    """The transformers model inside what wraps it for training (DDP, DeepSpeed, PEFT)."""
    model = extract_model_from_parallel(model)
    return model.get_base_model() if is_peft_model(model) else model


# (path, trust_remote_code, config as JSON) -> unsupported_head_reason of the class that config names
_HEAD_REASONS: dict[tuple[str, bool, str], str | None] = {}


def unsupported_head_reason_at(name_or_path: str, trust_remote_code: bool = False) -> str | None:
    """:func:`unsupported_head_reason` for the model TRL would load from ``name_or_path`` (the class its config names),
    checked on that class built on the meta device, without loading weights. The answer is kept per path and config
    (a process that builds many trainers from one checkpoint builds the meta model once)."""
    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    key = (str(name_or_path), trust_remote_code, config.to_json_string())
    if key not in _HEAD_REASONS:
        _HEAD_REASONS[key] = unsupported_head_reason(_weightless_model(config, trust_remote_code))
    return _HEAD_REASONS[key]


def _weightless_model(config, trust_remote_code: bool):
    architecture = getattr(transformers, (config.architectures or [""])[0], None) or AutoModelForCausalLM
    with torch.device("meta"):
        if architecture is AutoModelForCausalLM:
            return architecture.from_config(config, trust_remote_code=trust_remote_code)
        return architecture(config)
