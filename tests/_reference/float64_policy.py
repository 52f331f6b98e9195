"""The policy scored in float64 from its full logits: a float64 copy of the model (its own float64 gradients with it)
and the log-probs and entropies of a GRPO micro-batch's completion tokens, what the trainers' losses are held
against."""

import torch
from transformers import AutoModelForCausalLM


def float64_model(path):
    """A float64 copy of the model saved at ``path``."""
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)


def completion_logits(model, inputs):
    """The full logits that predict each completion token of the GRPO micro-batch ``inputs``, in float64;
    differentiable."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.double()
    return logits[:, inputs["prompt_ids"].size(1) - 1 : -1]


def completion_log_softmax(model, inputs, temperature=1.0):
    """Log-softmax of :func:`completion_logits` over the vocabulary at ``temperature``; differentiable."""
    return torch.log_softmax(completion_logits(model, inputs) / temperature, -1)


def completion_log_probs(model, inputs, temperature=1.0):
    """Per-token log-probs of the sampled completion tokens, in float64; differentiable."""
    log_softmax = completion_log_softmax(model, inputs, temperature)
    return log_softmax.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)


def entropy_of(log_softmax):
    """The entropy of each position's distribution, from its log-softmax."""
    return -(log_softmax.exp() * log_softmax).sum(-1)
