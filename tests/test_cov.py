"""Clip-Cov and KL-Cov (arXiv:2505.22617, §4.2, eqs. 10–14; docs/clip_cov.md, docs/kl_cov.md, including the selection
over the generation batch), checked against an independent implementation of the paper's formulas.

The reference below selects tokens with plain-Python loops over float64 values and computes the loss from the
model's full logits in float64 (a fresh copy of the model loaded in float64), so neither the kernel, the base trainer
nor the selection functions under test enter it.
"""

import dataclasses
import itertools
import math
import os
import warnings
from pathlib import Path

import pytest
import torch
from conftest import build_trainer as build_toy_trainer
from conftest import loss_and_gradients, make_grpo_batch, naive_log_probs, toy_config
from cov_scope_run import FRACTION, METHOD_OPTIONS, METHODS, load_records, train_recording, update_difference
from distributed_run import finish, launch_two_processes, make_trainer, ranked_reward
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from trl_entropy.core.statistics import covariance_moments, pooled_covariance
from trl_entropy.core.surrogates import ppo_clip_active
from trl_entropy.methods.clip_cov import (
    CLIP_COV_GENERATOR_FILE,
    ClipCovConfig,
    ClipCovTrainer,
    clip_cov_selection,
    generation_batch_seed,
)
from trl_entropy.methods.cov_selection import COV_SELECTION_KEY, COV_SELECTION_SCOPES, selection_count
from trl_entropy.methods.kl_cov import KLCovConfig, KLCovTrainer, kl_cov_selection
from trl_entropy.toy import build_toy_dataset, toy_reward


HERE = Path(__file__).resolve().parent
ACCUMULATION = 2
LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]
EPSILON = 0.2  # GRPOConfig's default, the paper's ε


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
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
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
        prompt_length = self.inputs["prompt_ids"].size(1)
        input_ids = torch.cat([self.inputs["prompt_ids"], self.inputs["completion_ids"]], 1)
        attention_mask = torch.cat([self.inputs["prompt_mask"], self.inputs["completion_mask"]], 1)
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits[:, prompt_length - 1 : -1]
        log_probs = torch.log_softmax(logits.double() / self.temperature, -1)
        return log_probs.gather(-1, self.inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)

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
        if beta:  # TRL's k3 estimator, times the ratio (GRPOConfig's default use_bias_correction_kl=True)
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
# Trainer construction and one loss step
# ---------------------------------------------------------------------------------------------------------------------


def build_trainer(trainer_class, config_class, path, tokenizer, tmp_path, name="run", **options):
    options = {
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 6,
        "report_to": [],
        "use_cpu": True,
        "bf16": False,
        "gradient_accumulation_steps": ACCUMULATION,
        "steps_per_generation": ACCUMULATION,
        **options,
    }
    args = config_class(output_dir=str(tmp_path / name), **options)
    assert args.use_bias_correction_kl  # the reference's KL term assumes TRL's default
    trainer = trainer_class(
        model=path,
        reward_funcs=toy_reward,
        args=args,
        train_dataset=build_toy_dataset(8, seed=0),
        processing_class=tokenizer,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = ACCUMULATION
    return trainer


def trainer_step(trainer, inputs):
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, dict(inputs))
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}


def assert_same(loss, gradients, expected_loss, expected_gradients):
    torch.testing.assert_close(loss.double(), expected_loss, rtol=1e-5, atol=1e-8)
    assert set(gradients) == set(expected_gradients)
    assert any(g.abs().max() > 0 for g in expected_gradients.values()), "no gradient: the case tests nothing"
    for name, expected in expected_gradients.items():
        torch.testing.assert_close(gradients[name].double(), expected, rtol=2e-4, atol=1e-7, msg=name)


def batch(path, tokenizer, seed, **options):
    model = AutoModelForCausalLM.from_pretrained(path)
    return make_grpo_batch(model, len(tokenizer), seed=seed, **options)


# ---------------------------------------------------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("delta", [None, 1.5, 1.1])
def test_ppo_clip_active_is_where_the_surrogate_is_flat(delta):
    """Active exactly where the base surrogate (with TRL's delta) has zero derivative in r; verl's rule without it."""
    generator = torch.Generator().manual_seed(0)
    ratio = torch.empty(4000, dtype=torch.float64).uniform_(0.3, 2.0, generator=generator).requires_grad_()
    advantages = torch.randn(4000, dtype=torch.float64, generator=generator)
    advantages[:50] = 0.0
    capped = ratio if delta is None else torch.clamp(ratio, max=delta)
    loss = -torch.min(capped * advantages, torch.clamp(ratio, 0.8, 1.28) * advantages)
    (slope,) = torch.autograd.grad(loss.sum(), ratio)
    active = ppo_clip_active(ratio.detach(), advantages, 0.2, 0.28, delta)
    nonzero_advantage = advantages != 0
    assert torch.equal(active[nonzero_advantage], (slope == 0)[nonzero_advantage])
    assert not active[~nonzero_advantage].any()  # A = 0: nothing is clipped (verl: the two terms tie)
    assert 0 < active.float().mean() < 1
    if delta is None:
        expected = [reference_clip_active(r, a, 0.2, 0.28) for r, a in zip(ratio.tolist(), advantages.tolist())]
        assert active.tolist() == expected


def test_selection_count():
    for ratio, num_valid in [(2e-4, 0), (2e-4, 1), (2e-4, 4999), (2e-4, 5000), (2e-4, 12345), (0.25, 8), (1.0, 7)]:
        assert selection_count(ratio, num_valid) == reference_count(ratio, num_valid)
    assert selection_count(2e-4, 12345) == 2 and selection_count(2e-4, 0) == 0


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


def test_clip_cov_selection_takes_every_candidate_when_few():
    cov, mask, clip_active = constructed_case()
    candidates = reference_candidates(cov, mask, clip_active, 1.0, 5.0)
    assert candidates == {(0, 1), (0, 6), (0, 7), (1, 0), (1, 1), (1, 4)}
    # N_valid = 13 (the 3 padded tokens do not count): ratio 0.5 -> 6 tokens, ratio 0.9 -> 11: every candidate.
    for ratio in (0.5, 0.9):
        generator = torch.Generator().manual_seed(0)
        before = generator.get_state()
        selected = clip_cov_selection(cov, mask, clip_active, ratio, 1.0, 5.0, generator)
        assert selected.dtype == torch.bool and selected.shape == cov.shape
        assert selected_set(selected) == candidates
        assert torch.equal(generator.get_state(), before)  # no random choice was needed


def test_clip_cov_selection_counts_only_valid_tokens():
    cov, mask, clip_active = constructed_case()
    # N_valid = 13: ratio 0.25 -> floor(3.25) = 3 tokens (16 positions would give 4).
    for seed in range(20):
        selected = clip_cov_selection(cov, mask, clip_active, 0.25, 1.0, 5.0, torch.Generator().manual_seed(seed))
        chosen = selected_set(selected)
        assert len(chosen) == reference_count(0.25, 13) == 3
        assert chosen <= reference_candidates(cov, mask, clip_active, 1.0, 5.0)
        assert not (selected & ~mask.bool()).any()


def test_clip_cov_selection_is_uniform_and_seeded():
    cov, mask, clip_active = constructed_case()
    candidates = sorted(reference_candidates(cov, mask, clip_active, 1.0, 5.0))
    ratio = 2 / 13  # two of the six candidates
    draws = 3000
    generator = torch.Generator().manual_seed(0)
    counts = dict.fromkeys(candidates, 0)
    subsets = set()
    for _ in range(draws):
        chosen = selected_set(clip_cov_selection(cov, mask, clip_active, ratio, 1.0, 5.0, generator))
        assert len(chosen) == 2
        subsets.add(frozenset(chosen))
        for token in chosen:
            counts[token] += 1
    # Each candidate is chosen with probability 2/6: expected 1000, standard deviation ~26.
    for token, count in counts.items():
        assert abs(count - draws / 3) < 130, (token, count)
    assert len(subsets) == math.comb(6, 2)  # every pair occurs
    # Same seed, same choice; another seed, another sequence of choices.
    first = clip_cov_selection(cov, mask, clip_active, ratio, 1.0, 5.0, torch.Generator().manual_seed(7))
    again = clip_cov_selection(cov, mask, clip_active, ratio, 1.0, 5.0, torch.Generator().manual_seed(7))
    assert torch.equal(first, again)
    sequences = set()
    for seed in range(5):
        generator = torch.Generator().manual_seed(seed)
        sequences.add(
            tuple(
                frozenset(selected_set(clip_cov_selection(cov, mask, clip_active, ratio, 1.0, 5.0, generator)))
                for _ in range(4)
            )
        )
    assert len(sequences) > 1


def test_clip_cov_selection_empty_cases():
    cov, mask, clip_active = constructed_case()
    generator = torch.Generator().manual_seed(0)
    # No valid token at all.
    assert not clip_cov_selection(cov, torch.zeros_like(mask), clip_active, 0.5, 1.0, 5.0, generator).any()
    # Zero covariance (all-equal advantages) and lb = 1 > 0: no candidate.
    zero = torch.zeros_like(cov)
    assert not clip_cov_selection(zero, mask, torch.zeros_like(clip_active), 1.0, 1.0, 5.0, generator).any()
    # Every in-range token clipped already.
    in_range = (cov > 1) & (cov < 5)
    assert not clip_cov_selection(cov, mask, in_range, 1.0, 1.0, 5.0, generator).any()


def test_kl_cov_selection_against_sorting():
    generator = torch.Generator().manual_seed(0)
    cov = torch.randn(5, 11, generator=generator)
    mask = torch.ones(5, 11)
    mask[1, 4:] = 0
    mask[3, :] = 0
    cov[3, 0] = 100.0  # the largest value, masked: never chosen
    valid = [(i, t) for i in range(5) for t in range(11) if mask[i, t]]
    for ratio in (1e-3, 0.05, 0.2, 0.5, 1.0):
        count = reference_count(ratio, len(valid))
        expected = set(sorted(valid, key=lambda it: cov[it].item(), reverse=True)[:count])
        assert selected_set(kl_cov_selection(cov, mask, ratio)) == expected
    assert len(selected_set(kl_cov_selection(cov, mask, 0.1))) == math.floor(0.1 * len(valid))  # not 0.1 * 55
    assert not kl_cov_selection(cov, torch.zeros_like(mask), 0.5).any()
    # All-equal advantages: zero covariance everywhere, still k valid tokens.
    chosen = selected_set(kl_cov_selection(torch.zeros(5, 11), mask, 0.1))
    assert len(chosen) == reference_count(0.1, len(valid)) and chosen <= set(valid)


def test_kl_cov_selection_breaks_ties_by_position():
    """Tokens tied at the k-th value: the earliest in row-major order are chosen, whatever the size of the tensor."""
    cov = torch.tensor([[0.5, 2.0, 1.0, 1.0], [1.0, 3.0, 1.0, 0.0]])
    mask = torch.ones(2, 4)
    mask[0, 2] = 0  # a masked tie is skipped
    # 7 valid tokens, k = 4: 3.0, 2.0, then two of the three valid 1.0s, the first two in row-major order.
    assert selected_set(kl_cov_selection(cov, mask, 4 / 7)) == {(1, 1), (0, 1), (0, 3), (1, 0)}
    wide = torch.cat([torch.full((2, 4), -1.0), cov], 1)  # the same tokens in a wider tensor, after lower values
    wide_mask = torch.cat([torch.zeros(2, 4), mask], 1)
    assert selected_set(kl_cov_selection(wide, wide_mask, 4 / 7)) == {(1, 5), (0, 5), (0, 7), (1, 4)}


def test_pooled_covariance_centres_over_the_whole_pool():
    """Two halves of a batch, each centred with the moments summed over both, give the whole batch's covariance."""
    generator = torch.Generator().manual_seed(3)
    log_probs = -torch.rand(6, 5, generator=generator) * 3
    advantages = torch.randn(6, generator=generator)
    mask = torch.ones(6, 5)
    mask[1, 2:] = 0
    mask[4, 1:] = 0
    expected = reference_covariance(log_probs.tolist(), advantages.tolist(), mask.tolist())
    halves = [slice(0, 2), slice(2, 6)]  # unequal, like two ranks with different numbers of tokens
    moments = sum(covariance_moments(log_probs[rows], advantages[rows], mask[rows]) for rows in halves)
    pooled = torch.cat([pooled_covariance(log_probs[rows], advantages[rows], mask[rows], moments) for rows in halves])
    assert pooled.dtype == torch.float64
    for (i, t), value in expected.items():
        assert pooled[i, t].item() == pytest.approx(value, rel=1e-12, abs=1e-12)
    assert not pooled[~mask.bool()].any()
    # Centred on a half alone, the terms differ: the pool's means matter.
    alone = pooled_covariance(
        log_probs[:2], advantages[:2], mask[:2], covariance_moments(*(x[:2] for x in (log_probs, advantages, mask)))
    )
    assert not torch.allclose(alone, pooled[:2])


# ---------------------------------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------------------------------


def make_config(config_class, tmp_path, **options):
    return toy_config(config_class, tmp_path, **options)


def test_config_defaults(tmp_path):
    clip = make_config(ClipCovConfig, tmp_path)
    assert (clip.clip_cov_ratio, clip.clip_cov_lb, clip.clip_cov_ub, clip.epsilon) == (2e-4, 1.0, 5.0, 0.2)
    kl = make_config(KLCovConfig, tmp_path, num_iterations=2)
    assert (kl.kl_cov_ratio, kl.kl_cov_coef) == (2e-3, 1.0)
    assert clip.cov_selection_scope == kl.cov_selection_scope == "micro_batch"  # the authors' code
    for config_class in (ClipCovConfig, KLCovConfig):
        for config_field in dataclasses.fields(config_class):
            assert config_field.metadata.get("help"), config_field.name


@pytest.mark.parametrize(
    "config_class, options, message",
    [
        (ClipCovConfig, {"clip_cov_ratio": 0.0}, "clip_cov_ratio"),
        (ClipCovConfig, {"clip_cov_ratio": -0.1}, "clip_cov_ratio"),
        (ClipCovConfig, {"clip_cov_ratio": 1.5}, "clip_cov_ratio"),
        (ClipCovConfig, {"clip_cov_ratio": float("nan")}, "clip_cov_ratio"),
        (ClipCovConfig, {"clip_cov_lb": 5.0}, "clip_cov_lb"),
        (ClipCovConfig, {"clip_cov_lb": 2.0, "clip_cov_ub": 1.0}, "clip_cov_ub=1.0"),
        (ClipCovConfig, {"clip_cov_lb": float("nan")}, "clip_cov_lb=nan"),
        (ClipCovConfig, {"importance_sampling_level": "sequence"}, "importance_sampling_level='sequence'"),
        (ClipCovConfig, {"cov_selection_scope": "global"}, "cov_selection_scope='global'"),
        (KLCovConfig, {"cov_selection_scope": "rank"}, "cov_selection_scope='rank'"),
        (KLCovConfig, {"kl_cov_ratio": 0.0}, "kl_cov_ratio"),
        (KLCovConfig, {"kl_cov_ratio": 2.0}, "kl_cov_ratio"),
        (KLCovConfig, {"kl_cov_coef": -1.0}, "kl_cov_coef=-1.0"),
        (KLCovConfig, {"kl_cov_coef": float("inf")}, "kl_cov_coef=inf"),
        (KLCovConfig, {"kl_cov_coef": float("nan")}, "kl_cov_coef=nan"),
        (KLCovConfig, {"importance_sampling_level": "sequence"}, "importance_sampling_level='sequence'"),
        (KLCovConfig, {"delta": 1.5}, "delta=1.5"),
    ],
)
def test_config_rejects_bad_values(tmp_path, config_class, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_config(config_class, tmp_path, num_iterations=2, **options)


def test_config_accepts_supported_options(tmp_path):
    for loss_type, scope in zip(LOSS_TYPES, itertools.cycle(["micro_batch", "generation_batch"])):
        make_config(
            ClipCovConfig, tmp_path, loss_type=loss_type, delta=1.5, epsilon_high=0.28, cov_selection_scope=scope
        )
        make_config(
            KLCovConfig, tmp_path, loss_type=loss_type, num_iterations=2, kl_cov_coef=0.0, cov_selection_scope=scope
        )
    make_config(ClipCovConfig, tmp_path, clip_cov_ratio=1.0, clip_cov_lb=-1.0, clip_cov_ub=float("inf"))
    unbounded = make_config(ClipCovConfig, tmp_path, clip_cov_lb=-math.inf, clip_cov_ub=math.inf)
    assert (unbounded.clip_cov_lb, unbounded.clip_cov_ub) == (-math.inf, math.inf)


def on_policy_warnings(caught):
    return [w for w in caught if "on-policy" in str(w.message)]


def test_kl_cov_warns_once_per_trainer_when_fully_on_policy(warm_toy_policy_path, tmp_path):
    """Fully on-policy (the penalty is identically 0): one warning when the trainer is built, none from the config or
    the training steps; off-policy settings: none."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every occurrence, not once per code location
        make_config(KLCovConfig, tmp_path)  # steps_per_generation = gradient_accumulation_steps, one iteration
        assert not on_policy_warnings(caught)
        trainer = make_trainer("kl_cov", warm_toy_policy_path, str(tmp_path / "on"), num_iterations=1, max_steps=2)
        assert len(on_policy_warnings(caught)) == 1
        trainer.train()
        assert len(on_policy_warnings(caught)) == 1
    assert len(logged(trainer, "loss")) == 2  # the steps ran
    for name, options in {"later": {"gradient_accumulation_steps": 2, "steps_per_generation": 4}, "twice": {}}.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make_trainer(
                "kl_cov", warm_toy_policy_path, str(tmp_path / name), **options
            )  # num_iterations=2 by default
        assert not on_policy_warnings(caught), options


# ---------------------------------------------------------------------------------------------------------------------
# Clip-Cov: loss and gradients
# ---------------------------------------------------------------------------------------------------------------------


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


@pytest.mark.parametrize("loss_type, beta", [("grpo", 0.0), ("bnpo", 0.04), ("dr_grpo", 0.0), ("dapo", 0.04)])
def test_clip_cov_loss_and_gradients(toy_model_path, toy_tokenizer, tmp_path, loss_type, beta):
    """Every candidate detached (n >= candidates): loss and gradients equal the float64 reference."""
    inputs = batch(toy_model_path, toy_tokenizer, seed=LOSS_TYPES.index(loss_type))
    reference = Reference(toy_model_path, inputs)
    eligible = [reference.cov[token] for token in reference.valid if not reference.clip_active(*token)]
    lb, ub = window_around(eligible, len(eligible) - 5, len(eligible) - 1)  # four candidates, the top one excluded
    detached = clip_cov_reference(reference, lb, ub)
    assert len(detached) == 4
    trainer = build_trainer(
        ClipCovTrainer,
        ClipCovConfig,
        toy_model_path,
        toy_tokenizer,
        tmp_path,
        loss_type=loss_type,
        beta=beta,
        clip_cov_ratio=0.5,  # n = 8 of the 16 valid tokens >= 4 candidates
        clip_cov_lb=lb,
        clip_cov_ub=ub,
    )
    loss, gradients = trainer_step(trainer, inputs)
    expected_loss, expected_gradients = reference.loss_and_gradients(
        clip_cov_loss_fn(detached), loss_type, 6, beta=beta
    )
    assert_same(loss, gradients, expected_loss, expected_gradients)
    # Detaching changed the loss (the case can fail), and the fraction counts valid tokens only.
    undetached_loss = reference.loss(clip_cov_loss_fn(set()), loss_type, 6, beta=beta)
    assert abs(undetached_loss - expected_loss) > 1e-4
    fraction = trainer._metrics["train"]["clip_cov/detached_fraction"]
    assert fraction == [pytest.approx(4 / len(reference.valid))]
    assert trainer._metrics["train"]["entropy/cov_logp_adv"][-1] == pytest.approx(
        sum(reference.cov.values()) / len(reference.valid), rel=1e-4, abs=1e-7
    )


def test_clip_cov_random_choice_is_seeded(toy_model_path, toy_tokenizer, tmp_path):
    """n < candidates: the detached pair is one of the C(c, 2) candidate pairs, fixed by the seed."""
    inputs = batch(toy_model_path, toy_tokenizer, seed=11)
    reference = Reference(toy_model_path, inputs)
    eligible = [reference.cov[token] for token in reference.valid if not reference.clip_active(*token)]
    lb, ub = window_around(eligible, len(eligible) - 6, len(eligible))  # the six largest eligible covariances
    candidates = sorted(clip_cov_reference(reference, lb, ub))
    assert len(candidates) == 6
    num_valid = len(reference.valid)
    ratio = 2.5 / num_valid  # n = 2
    subsets = list(itertools.combinations(candidates, 2))
    subset_losses = [reference.loss(clip_cov_loss_fn(set(s)), "bnpo", 6) for s in subsets]
    assert min(abs(a - b) for a, b in itertools.combinations(subset_losses, 2)) > 1e-5  # each pair is identifiable

    def chosen_pair(seed, name, check_gradients=False):
        trainer = build_trainer(
            ClipCovTrainer,
            ClipCovConfig,
            toy_model_path,
            toy_tokenizer,
            tmp_path,
            name=name,
            loss_type="bnpo",
            seed=seed,
            clip_cov_ratio=ratio,
            clip_cov_lb=lb,
            clip_cov_ub=ub,
        )
        loss, gradients = trainer_step(trainer, inputs)
        matches = [k for k, value in enumerate(subset_losses) if abs(value - loss.double()) < 1e-6]
        assert len(matches) == 1, "the loss matches no pair of candidates"
        if check_gradients:
            expected_loss, expected_gradients = reference.loss_and_gradients(
                clip_cov_loss_fn(set(subsets[matches[0]])), "bnpo", 6
            )
            assert_same(loss, gradients, expected_loss, expected_gradients)
        assert trainer._metrics["train"]["clip_cov/detached_fraction"] == [pytest.approx(2 / num_valid)]
        return matches[0]

    first = chosen_pair(0, "a", check_gradients=True)
    assert chosen_pair(0, "b") == first
    assert any(chosen_pair(seed, f"s{seed}") != first for seed in range(1, 6))


def test_clip_cov_evaluation_does_not_shift_training_draws(toy_model_path, toy_tokenizer, tmp_path):
    """Both generators start from args.seed (+ process index 0); evaluation draws from its own."""
    inputs = batch(toy_model_path, toy_tokenizer, seed=12)
    trainer = build_trainer(
        ClipCovTrainer,
        ClipCovConfig,
        toy_model_path,
        toy_tokenizer,
        tmp_path,
        seed=3,
        clip_cov_ratio=0.1,
        clip_cov_lb=-1e9,
        clip_cov_ub=1e9,
    )
    seeded = torch.Generator().manual_seed(3).get_state()
    generators = trainer._clip_cov_generators
    assert all(torch.equal(generators[mode].get_state(), seeded) for mode in ("train", "eval"))
    trainer.model.eval()
    with torch.no_grad():
        trainer.compute_loss(trainer.model, dict(inputs))
    assert torch.equal(generators["train"].get_state(), seeded)
    assert not torch.equal(generators["eval"].get_state(), seeded)
    assert trainer._metrics["eval"]["clip_cov/detached_fraction"] == [pytest.approx(1 / 16)]  # n = floor(1.6) = 1
    trainer.model.train()
    trainer.compute_loss(trainer.model, dict(inputs))
    assert not torch.equal(generators["train"].get_state(), seeded)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("case", ["no_candidate", "equal_advantages"])
def test_clip_cov_without_candidates_equals_grpo_trainer(toy_model_path, toy_tokenizer, tmp_path, loss_type, case):
    """No candidate (bounds above every covariance, or zero covariance with lb=1): exactly trl.GRPOTrainer."""
    inputs = batch(toy_model_path, toy_tokenizer, seed=20 + LOSS_TYPES.index(loss_type))
    options = {"loss_type": loss_type, "beta": 0.04, "clip_cov_ratio": 1.0}
    if case == "no_candidate":
        options.update(clip_cov_lb=1e3, clip_cov_ub=1e4)
    else:
        inputs["advantages"] = torch.full_like(inputs["advantages"], 0.7)  # defaults lb=1, ub=5
    ours = build_trainer(ClipCovTrainer, ClipCovConfig, toy_model_path, toy_tokenizer, tmp_path, "ours", **options)
    trl_options = {k: v for k, v in options.items() if not k.startswith("clip_cov")}
    trl = build_trainer(GRPOTrainer, GRPOConfig, toy_model_path, toy_tokenizer, tmp_path, "trl", **trl_options)
    loss, gradients = trainer_step(ours, inputs)
    trl_loss, trl_gradients = trainer_step(trl, inputs)
    assert_same(loss, gradients, trl_loss.double(), {k: v.double() for k, v in trl_gradients.items()})
    assert ours._metrics["train"]["clip_cov/detached_fraction"] == [0.0]


def test_clip_cov_detaches_any_token_of_a_surrogate_without_clip(toy_model_path, toy_tokenizer, tmp_path):
    """With every token a candidate, Clip-Cov detaches all of them under CISPO, SAPO and VESPO (none is flat), but
    only the clip-inactive ones under LUSPO's PPO clip."""
    model = AutoModelForCausalLM.from_pretrained(toy_model_path)
    inputs = make_grpo_batch(model, len(toy_tokenizer), seed=3, old_noise=0.3)
    for loss_type in ("cispo", "sapo", "vespo", "luspo"):
        trainer = build_toy_trainer(
            ClipCovTrainer,
            ClipCovConfig,
            toy_model_path,
            toy_tokenizer,
            tmp_path / loss_type,
            loss_type=loss_type,
            clip_cov_ratio=1.0,
            clip_cov_lb=-1e9,
            clip_cov_ub=1e9,
        )
        loss, grads = loss_and_gradients(trainer, inputs)
        fraction = trainer._metrics["train"]["clip_cov/detached_fraction"][-1]
        if loss_type == "luspo":
            assert 0 < fraction < 1
        else:
            assert fraction == 1.0 and loss.item() == 0.0
            assert all(g.abs().max() == 0 for g in grads.values())


def test_clip_cov_with_delta(toy_model_path, toy_tokenizer, tmp_path):
    """TRL's delta: the surrogate caps the ratio, and delta-capped tokens are no candidates."""
    delta = 1.25
    inputs = batch(toy_model_path, toy_tokenizer, seed=1, old_noise=0.5)
    reference = Reference(toy_model_path, inputs)
    assert all(abs(reference.ratio_list[i][t] - delta) > 1e-5 for i, t in reference.valid)

    def flat(i, t):
        ratio, advantage = reference.ratio_list[i][t], reference.advantage_list[i]
        return reference.clip_active(i, t) or (advantage < 0 and ratio > delta)

    capped = [token for token in reference.valid if flat(*token) and not reference.clip_active(*token)]
    assert capped, "no delta-capped token: the case tests nothing"
    candidates = {token for token in reference.valid if not flat(*token)}
    lb, ub = window_around([reference.cov[t] for t in reference.valid], 0, len(reference.valid))  # all in range
    trainer = build_trainer(
        ClipCovTrainer,
        ClipCovConfig,
        toy_model_path,
        toy_tokenizer,
        tmp_path,
        loss_type="bnpo",
        delta=delta,
        clip_cov_ratio=1.0,
        clip_cov_lb=lb,
        clip_cov_ub=ub,
    )
    loss, gradients = trainer_step(trainer, inputs)

    def per_token_loss(log_probs, old, ratio, advantages):
        surrogate = -torch.min(torch.clamp(ratio, max=delta) * advantages, torch.clamp(ratio, 0.8, 1.2) * advantages)
        return surrogate * (1 - token_mask(ratio.shape, candidates))

    expected_loss, expected_gradients = reference.loss_and_gradients(per_token_loss, "bnpo", 6)
    torch.testing.assert_close(loss.double(), expected_loss, rtol=1e-5, atol=1e-8)
    for name, expected in expected_gradients.items():
        torch.testing.assert_close(gradients[name].double(), expected, rtol=2e-4, atol=1e-7, msg=name)
    assert trainer._metrics["train"]["clip_cov/detached_fraction"] == [
        pytest.approx(len(candidates) / len(reference.valid))
    ]


# ---------------------------------------------------------------------------------------------------------------------
# KL-Cov: loss and gradients
# ---------------------------------------------------------------------------------------------------------------------


def kl_cov_loss_fn(penalised, coef):
    def per_token_loss(log_probs, old, ratio, advantages):
        return -advantages * ratio + coef * (log_probs - old).abs() * token_mask(ratio.shape, penalised)

    return per_token_loss


@pytest.mark.parametrize("loss_type, beta", [("grpo", 0.04), ("bnpo", 0.0), ("dr_grpo", 0.04), ("dapo", 0.0)])
def test_kl_cov_loss_and_gradients(toy_model_path, toy_tokenizer, tmp_path, loss_type, beta):
    inputs = batch(toy_model_path, toy_tokenizer, seed=30 + LOSS_TYPES.index(loss_type), old_noise=0.4)
    reference = Reference(toy_model_path, inputs)
    num_valid = len(reference.valid)
    ratio = 0.3
    count = reference_count(ratio, num_valid)
    ranked = sorted(reference.valid, key=lambda token: reference.cov[token], reverse=True)
    assert reference.cov[ranked[count - 1]] - reference.cov[ranked[count]] > 1e-5  # no near-tie at the cut
    penalised = set(ranked[:count])
    assert any(reference.clip_active(*token) for token in reference.valid), (
        "no clipped token: KL-Cov's no-clip untested"
    )
    coef = 0.7
    trainer = build_trainer(
        KLCovTrainer,
        KLCovConfig,
        toy_model_path,
        toy_tokenizer,
        tmp_path,
        loss_type=loss_type,
        beta=beta,
        num_iterations=2,
        kl_cov_ratio=ratio,
        kl_cov_coef=coef,
    )
    loss, gradients = trainer_step(trainer, inputs)
    expected_loss, expected_gradients = reference.loss_and_gradients(
        kl_cov_loss_fn(penalised, coef), loss_type, 6, beta=beta
    )
    assert_same(loss, gradients, expected_loss, expected_gradients)
    assert trainer._metrics["train"]["kl_cov/penalised_fraction"] == [pytest.approx(count / num_valid)]
    # The penalty matters in this case: without it the loss differs.
    unpenalised_loss = reference.loss(kl_cov_loss_fn(set(), coef), loss_type, 6, beta=beta)
    assert abs(unpenalised_loss - expected_loss) > 1e-4


def test_kl_cov_equal_advantages_penalises_one_zero_covariance_token(toy_model_path, toy_tokenizer, tmp_path):
    """Zero covariance everywhere: KL-Cov still penalises k = 1 valid token (any of them)."""
    inputs = batch(toy_model_path, toy_tokenizer, seed=40, old_noise=0.4)
    inputs["advantages"] = torch.full_like(inputs["advantages"], -0.3)
    reference = Reference(toy_model_path, inputs)
    assert max(abs(c) for c in reference.cov.values()) < 1e-12
    trainer = build_trainer(
        KLCovTrainer, KLCovConfig, toy_model_path, toy_tokenizer, tmp_path, loss_type="bnpo", num_iterations=2
    )
    loss, _ = trainer_step(trainer, inputs)
    options = [reference.loss(kl_cov_loss_fn({t}, 1.0), "bnpo", 6) for t in reference.valid]
    assert min(abs(value - loss.double()) for value in options) < 1e-6
    assert trainer._metrics["train"]["kl_cov/penalised_fraction"] == [pytest.approx(1 / len(reference.valid))]


def test_kl_cov_without_penalty_is_unclipped_policy_gradient(toy_model_path, toy_tokenizer, tmp_path):
    """kl_cov_coef = 0: −A·r for every token, which differs from GRPO's clipped loss when some ratio is clipped."""
    inputs = batch(toy_model_path, toy_tokenizer, seed=41, old_noise=0.4)
    reference = Reference(toy_model_path, inputs)
    trainer = build_trainer(
        KLCovTrainer,
        KLCovConfig,
        toy_model_path,
        toy_tokenizer,
        tmp_path,
        loss_type="dapo",
        num_iterations=2,
        kl_cov_coef=0.0,
    )
    loss, gradients = trainer_step(trainer, inputs)
    expected_loss, expected_gradients = reference.loss_and_gradients(kl_cov_loss_fn(set(), 0.0), "dapo", 6)
    assert_same(loss, gradients, expected_loss, expected_gradients)
    clipped_loss = reference.loss(lambda lp, old, r, a: clipped_surrogate(r, a), "dapo", 6)
    assert abs(clipped_loss - expected_loss) > 1e-4


# ---------------------------------------------------------------------------------------------------------------------
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

    trainer = trainer_class(
        model=path,
        reward_funcs=toy_reward,
        args=config,
        train_dataset=build_toy_dataset(64, seed=0),
        processing_class=AutoTokenizer.from_pretrained(path),
    )
    trainer.train()
    return trainer


def logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def test_clip_cov_trains_end_to_end(warm_toy_policy_path, tmp_path):
    config = ClipCovConfig(**train_options(tmp_path, "clip", clip_cov_ratio=0.05, clip_cov_lb=0.0, num_iterations=2))
    trainer = run_training(ClipCovTrainer, config, warm_toy_policy_path)
    fractions = logged(trainer, "clip_cov/detached_fraction")
    assert len(fractions) == 3 and all(0 <= f <= 0.5 for f in fractions)
    assert any(f > 0 for f in fractions)
    assert len(logged(trainer, "entropy/cov_logp_adv")) == 3
    assert all(math.isfinite(loss) for loss in logged(trainer, "loss"))


def test_kl_cov_trains_end_to_end(warm_toy_policy_path, tmp_path):
    config = KLCovConfig(**train_options(tmp_path, "kl", kl_cov_ratio=0.05, num_iterations=2))
    trainer = run_training(KLCovTrainer, config, warm_toy_policy_path)
    fractions = logged(trainer, "kl_cov/penalised_fraction")
    assert len(fractions) == 3 and all(0 < f <= 0.5 for f in fractions)
    assert any(value > 0 for value in logged(trainer, "kl_cov/abs_log_ratio"))  # the second iteration is off-policy
    assert len(logged(trainer, "entropy/cov_logp_adv")) == 3


def test_clip_cov_generator_state_in_checkpoints(warm_toy_policy_path, tmp_path):
    """Each checkpoint holds the generator's state; resuming continues the random stream instead of restarting it."""
    options = train_options(
        tmp_path, "full", clip_cov_ratio=0.05, clip_cov_lb=-1e9, clip_cov_ub=1e9, save_strategy="steps", save_steps=1
    )
    options["max_steps"] = 2
    full = run_training(ClipCovTrainer, ClipCovConfig(**options), warm_toy_policy_path)
    seed_state = torch.Generator().manual_seed(full.args.seed).get_state()
    saved = [
        torch.load(
            os.path.join(options["output_dir"], f"checkpoint-{step}", CLIP_COV_GENERATOR_FILE.format(process_index=0))
        )
        for step in (1, 2)
    ]
    assert not torch.equal(saved[0], seed_state) and not torch.equal(saved[0], saved[1])  # the stream advanced
    assert torch.equal(saved[1], full._clip_cov_generators["train"].get_state())

    resumed_options = dict(options, output_dir=str(tmp_path / "resumed"))
    resumed = ClipCovTrainer(
        model=warm_toy_policy_path,
        reward_funcs=toy_reward,
        args=ClipCovConfig(**resumed_options),
        train_dataset=build_toy_dataset(64, seed=0),
        processing_class=full.processing_class,
    )
    resumed.train(resume_from_checkpoint=os.path.join(options["output_dir"], "checkpoint-1"))
    # The resumed run's second step drew from checkpoint-1's state, so it ends where the uninterrupted run ended.
    assert torch.equal(resumed._clip_cov_generators["train"].get_state(), saved[1])


# ---------------------------------------------------------------------------------------------------------------------
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
        rollout_log_probs = naive_log_probs(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64), inputs)
    advantages = inputs["advantages"].double().tolist()
    return reference_covariance(rollout_log_probs.tolist(), advantages, inputs["completion_mask"].tolist())


@pytest.mark.parametrize("on_policy", [True, False], ids=["on_policy", "off_policy"])
def test_kl_cov_generation_batch_selection_equals_float64_reference(
    toy_model_path, toy_tokenizer, tmp_path, on_policy
):
    """The top k of the whole generation batch by Cov_t from ℓ^old, centred over the whole batch."""
    inputs = generation_batch(toy_model_path, toy_tokenizer, seed=60, on_policy=on_policy)
    cov = reference_pooled_covariance(toy_model_path, inputs)
    ratio = 0.2
    count = reference_count(ratio, len(cov))
    ranked = sorted(cov, key=lambda token: cov[token], reverse=True)
    assert cov[ranked[count - 1]] - cov[ranked[count]] > 1e-5  # no near-tie at the cut
    trainer = build_trainer(
        KLCovTrainer,
        KLCovConfig,
        toy_model_path,
        toy_tokenizer,
        tmp_path,
        num_iterations=2,
        kl_cov_ratio=ratio,
        cov_selection_scope="generation_batch",
    )
    selected = trainer.select_over_generation_batch(dict(inputs))
    assert selected.shape == inputs["completion_mask"].shape
    assert selected_set(selected) == set(ranked[:count])
    # The micro-batch rule on each half (its own means, its own k) picks other tokens: the pooling matters.
    per_half = set()
    for start in (0, 4):
        half = {
            key: value[start : start + 4] for key, value in inputs.items() if torch.is_tensor(value) and value.dim()
        }
        half_cov = reference_pooled_covariance(toy_model_path, half)
        half_ranked = sorted(half_cov, key=lambda token: half_cov[token], reverse=True)
        per_half |= {(i + start, t) for i, t in half_ranked[: reference_count(ratio, len(half_cov))]}
    assert per_half != set(ranked[:count])


@pytest.mark.parametrize("on_policy", [True, False], ids=["on_policy", "off_policy"])
def test_clip_cov_generation_batch_selection_equals_float64_reference(
    toy_model_path, toy_tokenizer, tmp_path, on_policy
):
    """Candidates lb < Cov_t < ub over the whole generation batch (every ratio is 1 at the rollout, so no clip is
    active); n of them drawn by ``randperm`` from a generator seeded with the training seed and the step."""
    inputs = generation_batch(toy_model_path, toy_tokenizer, seed=61, on_policy=on_policy)
    cov = reference_pooled_covariance(toy_model_path, inputs)
    lb, ub = window_around(list(cov.values()), len(cov) - 9, len(cov) - 1)  # eight candidates, the top one excluded
    candidates = sorted(token for token in cov if lb < cov[token] < ub)  # row-major: the pool's order
    assert len(candidates) == 8
    options = dict(clip_cov_lb=lb, clip_cov_ub=ub, cov_selection_scope="generation_batch", seed=5)
    trainer = build_trainer(
        ClipCovTrainer, ClipCovConfig, toy_model_path, toy_tokenizer, tmp_path, clip_cov_ratio=1.0, **options
    )
    assert selected_set(trainer.select_over_generation_batch(dict(inputs))) == set(candidates)  # n >= candidates
    trainer = build_trainer(
        ClipCovTrainer,
        ClipCovConfig,
        toy_model_path,
        toy_tokenizer,
        tmp_path,
        clip_cov_ratio=3.5 / len(cov),
        **options,
    )
    draws = []
    for step in (0, 1, 0):
        trainer.state.global_step = step
        generator = torch.Generator().manual_seed(generation_batch_seed(5, step))
        expected = {candidates[k] for k in torch.randperm(len(candidates), generator=generator)[:3].tolist()}
        draws.append(selected_set(trainer.select_over_generation_batch(dict(inputs))))
        assert draws[-1] == expected, step
    assert draws[0] != draws[1] and draws[0] == draws[2]  # a function of the step, not of a stream
    assert generation_batch_seed(5, 0) != generation_batch_seed(6, 0)


@pytest.mark.parametrize("method", METHODS)
def test_generation_scope_loss_uses_the_carried_selection(toy_model_path, toy_tokenizer, tmp_path, method):
    """The loss step applies the mask carried with the batch, on an off-policy micro-batch: KL-Cov penalises exactly
    the carried tokens; Clip-Cov detaches the carried tokens whose clip is not active at this step (a clip-active
    token already has no policy gradient, and its clipped loss stays)."""
    inputs = batch(toy_model_path, toy_tokenizer, seed=62, old_noise=0.5)
    reference = Reference(toy_model_path, inputs)
    carried = set(reference.valid[::2])
    common = dict(loss_type="bnpo", num_iterations=2, cov_selection_scope="generation_batch")
    if method == "clip_cov":
        clip_cov_reference(reference, -1e9, 1e9)  # no ratio within rounding of the clip boundaries
        trainer = build_trainer(ClipCovTrainer, ClipCovConfig, toy_model_path, toy_tokenizer, tmp_path, **common)
        affected = {token for token in carried if not reference.clip_active(*token)}
        assert set() != affected != carried, "the case must hold clip-active and free carried tokens"
        loss_fn, metric = clip_cov_loss_fn(affected), "clip_cov/detached_fraction"
    else:
        trainer = build_trainer(KLCovTrainer, KLCovConfig, toy_model_path, toy_tokenizer, tmp_path, **common)
        affected = carried
        loss_fn, metric = kl_cov_loss_fn(carried, 1.0), "kl_cov/penalised_fraction"
    with pytest.raises(KeyError, match="select_over_generation_batch"):
        trainer.compute_loss(trainer.model, dict(inputs))  # a hand-built batch without the mask
    inputs[COV_SELECTION_KEY] = token_mask(inputs["completion_mask"].shape, carried).bool()
    trainer._metrics["train"].clear()
    loss, gradients = trainer_step(trainer, inputs)
    expected_loss, expected_gradients = reference.loss_and_gradients(loss_fn, "bnpo", 6)
    assert_same(loss, gradients, expected_loss, expected_gradients)
    assert trainer._metrics["train"][metric] == [pytest.approx(len(affected) / len(reference.valid))]


# Rounding alone (plain GRPO, or the generation-batch scope) moves the two layouts' weights apart by ~1e-6 of the
# update in these runs; a different selection by ~1e-3 (KL-Cov) to ~0.5 (Clip-Cov).
SAME_WEIGHTS, DIFFERENT_WEIGHTS = 1e-4, 1e-3


@pytest.mark.parametrize("method", METHODS)
def test_selection_and_weights_do_not_depend_on_accumulation(warm_toy_policy_path, tmp_path, method):
    """(micro-batch 8 × accumulation 1) against (4 × 2), same generation batches: the generation-batch scope selects
    the same tokens and trains the same weights; the micro-batch scope trains other weights."""
    records = {}
    for scope in ("micro_batch", "generation_batch"):
        for per_device, accumulation in ((8, 1), (4, 2)):
            records[scope, per_device] = train_recording(
                method,
                warm_toy_policy_path,
                str(tmp_path / f"{scope}_{per_device}"),
                scope,
                per_device_train_batch_size=per_device,
                gradient_accumulation_steps=accumulation,
            )
    whole, split = records["generation_batch", 8], records["generation_batch", 4]
    iterations = 2 if method == "kl_cov" else 1  # KL-Cov trains twice on each generation batch
    assert len(whole["selection"]) == 4 // iterations  # one selection per generation batch
    assert split["selection"] == whole["selection"]
    # One micro-batch per step, on-policy (Clip-Cov) or penalised in both passes (KL-Cov): the logged fraction is the
    # generation batch's selected fraction. (With two micro-batches it is the mean of their fractions.)
    selected_fractions = [
        sum(len(chosen) for _, chosen in rows) / sum(len(ids) for ids, _ in rows) for rows in whole["selection"]
    ]
    assert all(fraction > 0 for fraction in selected_fractions)
    assert whole["fraction"] == pytest.approx([f for f in selected_fractions for _ in range(iterations)], rel=1e-6)
    assert update_difference(whole, split) < SAME_WEIGHTS
    micro = update_difference(records["micro_batch", 8], records["micro_batch", 4])
    assert micro > DIFFERENT_WEIGHTS


@pytest.fixture(scope="module")
def two_process_records(warm_toy_policy_path, tmp_path_factory):
    """``{(method, scope): (one_process_record, [rank0_record, rank1_record])}``: cov_scope_run.py launched on two CPU
    processes (gloo) with 4 completions each, and run here on one process with 8, while the two ranks run."""
    two = tmp_path_factory.mktemp("cov_two_processes")
    options = ["--model", warm_toy_policy_path, "--out", str(two), "--per-device-batch-size", "4"]
    launched = launch_two_processes(HERE / "cov_scope_run.py", options, two)
    try:  # the one-process runs go on here while the two ranks run
        one = {
            (method, scope): train_recording(
                method, warm_toy_policy_path, str(two / f"one_{method}_{scope}"), scope, per_device_train_batch_size=8
            )
            for method in METHODS
            for scope in COV_SELECTION_SCOPES
        }
    finally:
        finish(launched, two)
    return {
        (method, scope): (record, load_records(str(two), method, scope)) for (method, scope), record in one.items()
    }


# About 70 s on two shared CPU cores; test_selection_and_weights_do_not_depend_on_accumulation is the fast check.
@pytest.mark.parametrize("method", METHODS)
def test_two_processes_select_and_train_like_one(two_process_records, method):
    """Two processes × 4 completions against one process × 8, the same completions: the generation-batch scope
    selects the same tokens (the ranks' parts in rank order) and trains the same weights; the micro-batch scope
    does not."""
    for scope in COV_SELECTION_SCOPES:
        one, two = two_process_records[method, scope]
        assert (one["num_processes"], two["num_processes"]) == (1, 2)
        assert two["replicas_equal"]  # DDP keeps the replicas identical
    one, two = two_process_records[method, "generation_batch"]
    assert one["selection"] and all(any(chosen for _, chosen in rows) for rows in one["selection"])
    assert two["selection"] == one["selection"]
    assert update_difference(one, two) < SAME_WEIGHTS
    one, two = two_process_records[method, "micro_batch"]
    assert update_difference(one, two) > DIFFERENT_WEIGHTS


@pytest.mark.parametrize("method, checkpoint", [("clip_cov", 2), ("kl_cov", 2), ("kl_cov", 3)])
def test_generation_scope_resume_reproduces_the_straight_run(warm_toy_policy_path, tmp_path, method, checkpoint):
    """4 steps straight against a checkpoint and the rest resumed (sampled completions). Clip-Cov's draw is seeded by
    the step, so nothing but the step has to come back; KL-Cov's checkpoint 3 lies inside a generation cycle (two
    iterations per generation batch), where the buffered batch, its selection included, comes back with it."""

    def train(name, resume=None):
        trainer = make_trainer(
            method,
            warm_toy_policy_path,
            str(tmp_path / name),
            rollout=None,
            reward=ranked_reward,  # advantages at every step, whatever is sampled
            cov_selection_scope="generation_batch",
            max_steps=4,
            save_strategy="steps",
            save_steps=1,
        )
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    straight = train("straight")
    folder = tmp_path / "straight" / f"checkpoint-{checkpoint}"
    assert not (folder / CLIP_COV_GENERATOR_FILE.format(process_index=0)).exists()  # no random state to restore
    resumed = train("resumed", resume=str(folder))
    later = range(checkpoint + 1, 5)
    for key in ("loss", FRACTION[method]):
        values = {entry["step"]: entry[key] for entry in straight.state.log_history if key in entry}
        again = {entry["step"]: entry[key] for entry in resumed.state.log_history if key in entry}
        assert sorted(values) == [1, 2, 3, 4]
        assert [again[step] for step in later] == pytest.approx([values[step] for step in later], rel=1e-5)
    assert len(set(logged(straight, "loss"))) == 4, "identical losses: the comparison would be weak"
    assert all(value > 0 for value in logged(straight, FRACTION[method]))  # tokens were selected at every step
    for (name, weight), resumed_weight in zip(
        straight.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        torch.testing.assert_close(resumed_weight, weight, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("method", METHODS)
def test_generation_scope_evaluation_selects_over_the_evaluation_batch(warm_toy_policy_path, tmp_path, method):
    """``evaluate()``: each evaluation batch is a generation batch; its selection reaches the evaluation loss, whose
    logged fraction is that batch's selected fraction (on-policy, no clip is active)."""
    trainer = make_trainer(
        method,
        warm_toy_policy_path,
        str(tmp_path / "run"),
        cov_selection_scope="generation_batch",
        per_device_eval_batch_size=8,
        trainer_kwargs={"eval_dataset": build_toy_dataset(2, seed=1)},  # 2 prompts × 4 completions
        **METHOD_OPTIONS[method],
    )
    selections = []
    generate = trainer._generate_and_score_completions

    def generate_and_record(inputs):
        output = generate(inputs)
        selections.append((output[COV_SELECTION_KEY], output["completion_mask"]))
        return output

    trainer._generate_and_score_completions = generate_and_record
    metrics = trainer.evaluate()
    ((selected, mask),) = selections  # one evaluation batch of 8
    assert 0 < selected.sum() < mask.sum()
    assert metrics[f"eval_{FRACTION[method]}"] == pytest.approx((selected.sum() / mask.sum()).item(), rel=1e-6)
