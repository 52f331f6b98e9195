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


def assert_step_is_float64(loss, gradients, expected_loss, model):
    """One loss step (``loss``, ``gradients`` by parameter name) against ``expected_loss``, computed in float64 from
    ``model``, whose backward pass runs here: the loss to rtol 1e-5, every parameter's gradient to rtol 1e-3."""
    expected_loss.backward()
    torch.testing.assert_close(loss.double(), expected_loss.detach(), rtol=1e-5, atol=1e-7)
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(gradients[name].double(), parameter.grad, rtol=1e-3, atol=1e-6, msg=name)
