"""What the Clip-Cov, KL-Cov and covariance-selection tests share: an independent implementation of the paper's
formulas (arXiv:2505.22617, §4.2, eqs. 10–14; docs/clip_cov.md, docs/kl_cov.md) that selects tokens with plain-Python
loops over float64 values and computes the loss from the model's full logits in float64 (a fresh copy of the model
loaded in float64), so neither the kernel, the base trainer nor the selection functions under test enter it; and the
trainer builders of those tests."""

import math

import torch
from _reference.float64_policy import completion_log_probs, float64_model
from transformers import AutoModelForCausalLM
from trl import GRPOConfig

from _support.grpo import make_grpo_batch, naive_log_probs, toy_dataset, toy_trainer
from _support.parity import ACCUMULATION


LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]
EPSILON = 0.2  # GRPOConfig's default, the paper's ε
# The reference's KL term is TRL's default one: the k3 estimator times the ratio.
assert GRPOConfig.__dataclass_fields__["use_bias_correction_kl"].default


# ---------------------------------------------------------------------------------------------------------------------
# The independent reference (the paper's eqs. 10–14 and docs/clip_cov.md, docs/kl_cov.md, written out)
# ---------------------------------------------------------------------------------------------------------------------


def reference_covariance(log_probs, advantages, mask):
    """{(i, t): (ℓ_t − ℓ̄)(A_i − Ā)} over the valid tokens, float64 plain Python; A is one value per sequence."""
    valid = [(i, t) for i in range(len(mask)) for t in range(len(mask[i])) if mask[i][t]]
    if not valid:
        return {}
    mean_log_prob = sum(log_probs[i][t] for i, t in valid) / len(valid)
    mean_advantage = sum(advantages[i] for i, t in valid) / len(valid)
    return {(i, t): (log_probs[i][t] - mean_log_prob) * (advantages[i] - mean_advantage) for i, t in valid}


def reference_clip_active(ratio, advantage, epsilon_low=EPSILON, epsilon_high=EPSILON):
    """The PPO clip is active: its clipped term strictly wins the min (verl's clip_by_origin)."""
    return (ratio > 1 + epsilon_high and advantage > 0) or (ratio < 1 - epsilon_low and advantage < 0)


def reference_count(ratio, num_valid):
    return max(math.floor(ratio * num_valid), 1) if num_valid else 0


def reference_aggregate(per_token, mask, loss_type, inputs, max_completion_length):
    """TRL's loss types written out, for a training micro-batch (ACCUMULATION steps = steps_per_generation)."""
    masked = per_token * mask
    if loss_type == "grpo":
        return sum(masked[i].sum() / mask[i].sum() for i in range(mask.size(0))) / mask.size(0) / ACCUMULATION
    if loss_type == "bnpo":
        return masked.sum() / mask.sum() / ACCUMULATION
    if loss_type == "dr_grpo":
        return masked.sum() / (mask.size(0) * max_completion_length) / ACCUMULATION
    return masked.sum() / inputs["num_items_in_batch"].double()  # dapo: the generation batch's tokens, one window


class Reference:
    """Float64 log-probs of a micro-batch from a float64 copy of the model, and the paper's per-token quantities."""

    def __init__(self, path, inputs, temperature=1.0):
        self.model = float64_model(path)
        self.inputs = inputs
        self.temperature = temperature
        self.mask = inputs["completion_mask"].double()
        self.old = inputs["old_per_token_logps"].double()
        self.advantages = inputs["advantages"].double()
        with torch.no_grad():
            log_probs = self.detached_log_probs = self.log_probs()
        self.mask_list = self.mask.tolist()
        self.log_prob_list = log_probs.tolist()
        self.ratio_list = torch.exp(log_probs - self.old).tolist()
        self.advantage_list = self.advantages.tolist()
        self.cov = reference_covariance(self.log_prob_list, self.advantage_list, self.mask_list)
        self.valid = sorted(self.cov)

    def log_probs(self):
        return completion_log_probs(self.model, self.inputs, self.temperature)

    def clip_active(self, i, t):
        return reference_clip_active(self.ratio_list[i][t], self.advantage_list[i])

    def loss(self, per_token_loss_fn, loss_type, max_completion_length, beta=0.0):
        """The float64 loss alone (no backward pass; the log-probs computed once)."""
        return self._loss(self.detached_log_probs, per_token_loss_fn, loss_type, max_completion_length, beta)

    def loss_and_gradients(self, per_token_loss_fn, loss_type, max_completion_length, beta=0.0):
        """Loss and float64 parameter gradients for ``per_token_loss_fn(ℓ, ℓ_old, r, A) -> (B, T)``."""
        self.model.zero_grad(set_to_none=True)
        loss = self._loss(self.log_probs(), per_token_loss_fn, loss_type, max_completion_length, beta)
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in self.model.named_parameters() if p.grad is not None}

    def _loss(self, log_probs, per_token_loss_fn, loss_type, max_completion_length, beta):
        ratio = torch.exp(log_probs - self.old)
        per_token = per_token_loss_fn(log_probs, self.old, ratio, self.advantages.unsqueeze(1))
        if beta:  # TRL's k3 estimator, times the ratio (GRPOConfig's default use_bias_correction_kl)
            ref_log_ratio = self.inputs["ref_per_token_logps"].double() - log_probs
            per_token = per_token + beta * (torch.exp(ref_log_ratio) - ref_log_ratio - 1) * ratio
        return reference_aggregate(per_token, self.mask, loss_type, self.inputs, max_completion_length)


def token_mask(shape, tokens):
    mask = torch.zeros(shape, dtype=torch.float64)
    for i, t in tokens:
        mask[i, t] = 1.0
    return mask


def clipped_surrogate(ratio, advantages, epsilon_low=EPSILON, epsilon_high=EPSILON):
    return -torch.min(ratio * advantages, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * advantages)


# ---------------------------------------------------------------------------------------------------------------------
# One loss step against the reference
# ---------------------------------------------------------------------------------------------------------------------


def assert_same(loss, gradients, expected_loss, expected_gradients):
    torch.testing.assert_close(loss.double(), expected_loss, rtol=1e-5, atol=1e-8)
    assert set(gradients) == set(expected_gradients)
    assert any(g.abs().max() > 0 for g in expected_gradients.values()), "no gradient: the case tests nothing"
    for name, expected in expected_gradients.items():
        torch.testing.assert_close(gradients[name].double(), expected, rtol=2e-4, atol=1e-7, msg=name)


def batch(path, tokenizer, seed, **options):
    model = AutoModelForCausalLM.from_pretrained(path)
    return make_grpo_batch(model, len(tokenizer), seed=seed, **options)


def constructed_case():
    """A (2, 8) micro-batch whose candidate set is known: lb=1, ub=5, clip active at two in-range tokens."""
    cov = torch.tensor(
        [
            [0.5, 1.5, 2.0, 1.0, 5.0, 6.0, 3.0, 4.0],  # 1.0 and 5.0 sit on the (exclusive) bounds
            [2.5, 3.5, -2.0, 4.5, 1.2, 2.2, 0.0, 4.9],
        ]
    )
    mask = torch.ones(2, 8)
    mask[1, 5:] = 0  # padding: 2.2 and 4.9 are in range but masked
    clip_active = torch.zeros(2, 8, dtype=torch.bool)
    clip_active[0, 2] = clip_active[1, 3] = True  # in range, but their PPO clip already acts
    return cov, mask, clip_active


def reference_candidates(cov, mask, clip_active, lb, ub):
    return {
        (i, t)
        for i in range(cov.size(0))
        for t in range(cov.size(1))
        if mask[i, t] and not clip_active[i, t] and lb < cov[i, t].item() < ub
    }


def selected_set(selected):
    return {tuple(index) for index in selected.nonzero().tolist()}


# Configs
# ---------------------------------------------------------------------------------------------------------------------


def on_policy_warnings(caught):
    return [w for w in caught if "on-policy" in str(w.message)]


# End to end
# ---------------------------------------------------------------------------------------------------------------------


def train_options(tmp_path, name, **options):
    return {
        "output_dir": str(tmp_path / name),
        "max_steps": 3,
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 8,
        "learning_rate": 1e-4,
        "logging_steps": 1,
        "report_to": [],
        "use_cpu": True,
        "bf16": False,
        "save_strategy": "no",
        **options,
    }


def run_training(trainer_class, config, path):
    from transformers import AutoTokenizer

    trainer = toy_trainer(
        trainer_class, config, path, AutoTokenizer.from_pretrained(path), train_dataset=toy_dataset(64)
    )
    trainer.train()
    return trainer


# Covariance selection over the generation batch (cov_selection_scope="generation_batch")
# ---------------------------------------------------------------------------------------------------------------------


def generation_batch(path, tokenizer, seed, on_policy):
    """A generation batch of 8 completions; on-policy, TRL leaves ``old_per_token_logps`` out."""
    return batch(path, tokenizer, seed, batch=8, old_noise=None if on_policy else 0.4)


def reference_pooled_covariance(path, inputs):
    """{(i, t): Cov_t} over the whole generation batch in float64, from ℓ^old (a float64 model's if TRL skips it)."""
    if "old_per_token_logps" in inputs:
        rollout_log_probs = inputs["old_per_token_logps"].double()
    else:
        rollout_log_probs = naive_log_probs(float64_model(path), inputs)
    advantages = inputs["advantages"].double().tolist()
    return reference_covariance(rollout_log_probs.tolist(), advantages, inputs["completion_mask"].tolist())


def window_around(values, low_index, high_index):
    """(lb, ub) strictly between sorted neighbours, so that exactly values[low_index:high_index] fall inside."""
    values = sorted(values)
    lb = -1e9 if low_index == 0 else (values[low_index - 1] + values[low_index]) / 2
    ub = 1e9 if high_index == len(values) else (values[high_index - 1] + values[high_index]) / 2
    gaps = [abs(v - bound) for v in values for bound in (lb, ub)]
    assert min(gaps) > 1e-5, "fp32 and fp64 could disagree on the candidate set"
    return lb, ub


def clip_cov_reference(reference, lb, ub):
    """The candidate set of eq. 11: valid, clip not active, lb < Cov < ub (plain Python over float64)."""
    for i, t in reference.valid:
        for bound in (1 - EPSILON, 1 + EPSILON):
            assert abs(reference.ratio_list[i][t] - bound) > 1e-5, "fp32 and fp64 could disagree on the clip"
    return {(i, t) for i, t in reference.valid if not reference.clip_active(i, t) and lb < reference.cov[(i, t)] < ub}


def clip_cov_loss_fn(detached):
    def per_token_loss(log_probs, old, ratio, advantages):
        keep = 1 - token_mask(ratio.shape, detached)
        return clipped_surrogate(ratio, advantages) * keep

    return per_token_loss


def kl_cov_loss_fn(penalised, coef):
    def per_token_loss(log_probs, old, ratio, advantages):
        return -advantages * ratio + coef * (log_probs - old).abs() * token_mask(ratio.shape, penalised)

    return per_token_loss
