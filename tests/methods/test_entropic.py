"""EntroPIC (Yang et al., "EntroPIC: Towards Stable Long-Term Training of LLMs via Entropy Stabilization with
Proportional-Integral Control", arXiv:2511.15248; the authors' code at commit 2470730; docs/entropic.md): the worked
example number for number (pure functions and the trainer's loss step), the controller and the term against float64
references written out here, every loss type's loss and gradients against trl.GRPOTrainer plus the float64 term, the
neutral gains against trl.GRPOTrainer, edge cases and bad values, every rank's statistics in one process (a second rank
stood in), and two processes whose ranks hold the same α and I, equal to a float64 replay over the run's micro-batches.
Resume (mid-cycle and after updates): tests/trainer/test_resume.py and tests/trainer/test_resume_changes.py; two
processes against one: tests/launch/test_distributed.py; accumulation: tests/trainer/test_accumulation.py; the
all-masked micro-batch: tests/trainer/test_bad_input.py."""

import json
import math
import re

import pytest
import torch
from _reference.combined_reference import weighted_mean
from _reference.float64_policy import completion_log_probs, float64_model
from _reference.pairs import PairMethod, PairReference, widest_gap
from _support.distributed_run import make_trainer
from _support.grpo import loss_and_gradients, make_grpo_batch, naive_entropy, toy_config
from _support.parity import TRL, assert_same_step
from _support.stand_in_rank import StandInRank

from trl_entropy.core.batch import CompletionBatch
from trl_entropy.core.trainer import LossStep
from trl_entropy.core.trl.objectives import LOSS_TYPES
from trl_entropy.methods.entropic import (
    EntroPICConfig,
    entropic_alpha,
    entropic_pi_step,
    entropic_term,
    high_probability_mask,
)


# ---------------------------------------------------------------------------------------------------------------------
# References written out from the authors' code (dp_actor.py and core_algos.py at 2470730)
# ---------------------------------------------------------------------------------------------------------------------


def reference_pi(integral, mean_entropy, target, kp, ki, weight):
    """α = clip(K_p·e + K_i·I, −1, 1) with the integral before the update, then I + e·w; e = H̄ − H*."""
    error = mean_entropy - target
    alpha = kp * error + ki * integral
    alpha = -1.0 if alpha < -1.0 else 1.0 if alpha > 1.0 else alpha
    return alpha, integral + error * weight


def reference_aggregate(values, mask, loss_type, max_completion_length):
    """The loss type's reduction of ``values`` over ``mask`` (one micro-batch, one process), in the input dtype."""
    masked = values * mask
    if loss_type in ("grpo", "sapo"):
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type in ("bnpo", "dapo", "cispo", "vespo"):  # one process, one micro-batch: the high tokens it holds
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return masked.sum() / (values.size(0) * max_completion_length)
    if loss_type == "luspo":
        return masked.sum(-1).mean()
    raise ValueError(loss_type)


# ---------------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------------


def test_defaults_are_the_authors_and_zero_gains_are_allowed():
    config = toy_config(EntroPICConfig)
    assert (config.entropic_target, config.entropic_kp, config.entropic_ki, config.entropic_high_prob) == (
        0.1,
        1.0,
        0.01,
        0.95,
    )
    neutral = toy_config(EntroPICConfig, entropic_kp=0.0, entropic_ki=0.0)
    assert (neutral.entropic_kp, neutral.entropic_ki) == (0.0, 0.0)


BAD_VALUES = (
    [("entropic_target", v) for v in (0, 0.0, -0.1, math.nan, math.inf, True, "0.1")]
    + [("entropic_kp", v) for v in (-1.0, -1e-12, math.nan, math.inf, True)]
    + [("entropic_ki", v) for v in (-0.01, math.nan, math.inf, "0.01")]
    + [("entropic_high_prob", v) for v in (0, 0.0, 1, 1.0, 1.5, -0.1, math.nan, True)]
)


@pytest.mark.parametrize("name, value", BAD_VALUES, ids=[f"{n}={v!r}" for n, v in BAD_VALUES])
def test_bad_values_are_refused_by_name(name, value):
    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r} is invalid")):
        toy_config(EntroPICConfig, **{name: value})


@pytest.mark.parametrize("option", [{"entropy_coef": 0.01}, {"use_adaptive_entropy": True}])
def test_trl_entropy_bonus_next_to_entropic_is_refused(option):
    with pytest.raises(ValueError, match=f"EntroPIC .*{next(iter(option))}"):
        toy_config(EntroPICConfig, **option)


# ---------------------------------------------------------------------------------------------------------------------
# The worked example (docs/entropic.md): H* = 0.1, K_p = 1, K_i = 0.01, two micro-batches, each half of the cycle
# ---------------------------------------------------------------------------------------------------------------------

PROBABILITIES = [0.99, 0.97, 0.5, 0.96]
ADVANTAGES_EXAMPLE = [1.0, -1.0, 1.0, 0.0]
# Token mean of the surrogate −A: −(1 − 1 + 1 + 0)/4; the term over tokens 1, 2 and 4 (p > 0.95): −(1 + 1 + 0)/3.
EXAMPLE_LOSS = -0.25 + 0.2 * (-2 / 3)
EXAMPLE_GRADIENT = [-0.25 - 0.2 / 3, 0.25 - 0.2 / 3, -0.25, 0.0]


def test_worked_example_controller_and_term_with_the_pure_functions():
    alpha, integral = entropic_pi_step(0.0, 0.30, 0.1, 1.0, 0.01, 0.5)
    assert (alpha, integral) == (pytest.approx(0.2, abs=1e-15), pytest.approx(0.1, abs=1e-15))
    alpha, integral = entropic_pi_step(integral, 0.10, 0.1, 1.0, 0.01, 0.5)
    assert (alpha, integral) == (pytest.approx(0.001, abs=1e-15), pytest.approx(0.1, abs=1e-15))
    log_probs = torch.tensor([PROBABILITIES], dtype=torch.float64).log().requires_grad_()
    mask = torch.ones(1, 4, dtype=torch.float64)
    high = high_probability_mask(log_probs, mask, 0.95)
    assert high.tolist() == [[1.0, 1.0, 0.0, 1.0]] and not high.requires_grad
    advantages = torch.tensor([ADVANTAGES_EXAMPLE], dtype=torch.float64)
    term = entropic_term(log_probs, log_probs.detach(), advantages, high, "bnpo", 4)
    assert term.item() == pytest.approx(-2 / 3, abs=1e-15)
    (0.2 * term).backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-0.2 / 3, -0.2 / 3, 0.0, 0.0]], dtype=torch.float64))


def test_the_threshold_is_strict_and_on_the_current_probability():
    tau = 0.95
    at_tau = torch.tensor([[math.log(tau), math.log(tau) + 1e-6, math.log(tau) - 1e-6]])  # float32, as the kernel's
    assert high_probability_mask(at_tau, torch.ones(1, 3), tau).tolist() == [[0.0, 1.0, 0.0]]
    masked = high_probability_mask(torch.zeros(2, 2), torch.tensor([[1, 0], [0, 1]]), tau)  # p = 1, padding left out
    assert masked.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def example_batch(entropy, probabilities=PROBABILITIES):
    log_probs = torch.tensor([probabilities]).log().requires_grad_()
    return CompletionBatch(
        log_probs=log_probs,
        old_log_probs=log_probs.detach(),  # on-policy: every ratio is 1
        entropy=torch.full((1, 4), entropy, requires_grad=True),
        clamped_entropy=None,
        mask=torch.ones(1, 4),
        group_advantages=torch.tensor([ADVANTAGES_EXAMPLE]),
    )


def with_world_means(trainer, batch):
    """What step 2 of the loss step adds to a training batch: the world means the micro-batch controllers move on."""
    if batch.mode == "train":
        batch.world_means = trainer.controller_cycle.micro_batch_means(batch)
    return batch


def loss_step(trainer, batch):
    """Steps 3 to 11 of the loss step, through the trainer's own helpers (loss_type="grpo": one completion, the token
    mean), then what follows the step."""
    metrics = []
    batch = with_world_means(trainer, batch)
    token_advantages = trainer.token_advantages(batch, metrics)
    ratio = torch.exp(batch.log_probs - batch.old_log_probs)
    per_token = trainer.surrogate(batch, ratio, token_advantages, trainer.clip_range(), metrics)
    policy_loss, loss = trainer.aggregate(batch, per_token, {})
    loss = trainer.add_regularisers(batch, loss, policy_loss, None, metrics)
    trainer.after_loss_step(LossStep(loss, batch, metrics))
    return loss


def loss_step_from_controllers_to_regularisers(trainer, batch):
    """EntroPIC's term on a training micro-batch (its α from the micro-batch's world mean entropy), then what follows
    the step: the controller moves on that mean."""
    regulariser, metrics = trainer.part("entropic").regulariser(with_world_means(trainer, batch))
    trainer.after_loss_step(LossStep(regulariser, batch, list(metrics.items())))
    return regulariser


def test_worked_example_through_the_trainers_loss_step(toy_trainer_of):
    # steps_per_generation = 2, one pass: each micro-batch is half of the generation cycle, w = 1/2
    trainer = toy_trainer_of("entropic", loss_type="grpo", steps_per_generation=2)
    controller = trainer.controllers["entropic"]
    assert (controller.value, controller.integral, controller.weight) == (0.0, 0.0, 0.5)
    metrics = trainer._metrics["train"]
    metrics.clear()

    batch = example_batch(0.30)
    loss = loss_step(trainer, batch)
    loss.backward()
    assert (controller.value, controller.integral) == (pytest.approx(0.2, abs=1e-7), pytest.approx(0.1, abs=1e-7))
    assert loss.item() == pytest.approx(EXAMPLE_LOSS, abs=1e-6)
    assert loss.item() == pytest.approx(-0.3833, abs=5e-5)  # the numbers as docs/entropic.md rounds them
    torch.testing.assert_close(batch.log_probs.grad, torch.tensor([EXAMPLE_GRADIENT]), rtol=0, atol=1e-6)
    assert batch.log_probs.grad[0].tolist() == pytest.approx([-0.3167, 0.1833, -0.25, 0.0], abs=5e-5)
    assert batch.entropy.grad is None or not batch.entropy.grad.any()  # H̄ only moves α
    assert metrics["entropic/high_prob_fraction"] == [0.75]
    assert metrics["entropic/alpha"] == [pytest.approx(0.2, abs=1e-7)]  # logged at the step's end (sync)
    assert metrics["entropic/integral"] == [pytest.approx(0.1, abs=1e-7)]

    second = example_batch(0.10)
    loss_step(trainer, second)
    assert (controller.value, controller.integral) == (pytest.approx(0.001, abs=1e-7), pytest.approx(0.1, abs=1e-7))

    # Evaluation uses the current α and moves nothing.
    evaluation = example_batch(0.70)
    evaluation.mode = "eval"
    loss_step(trainer, evaluation)
    assert (controller.value, controller.integral) == (pytest.approx(0.001, abs=1e-7), pytest.approx(0.1, abs=1e-7))


def test_a_micro_batch_moves_the_integral_by_its_share_of_a_cycle_of_every_pass(toy_trainer_of):
    """Two passes over each generation batch of two micro-batches: a cycle is four micro-batches, so each moves the
    integral by (H̄ − H*)/4 (the one-process training run's fact below, in one loss step). H̄ is the mean over the
    micro-batch's valid tokens: the padded position's 5 nats count for nothing."""
    trainer = toy_trainer_of("entropic", loss_type="grpo", steps_per_generation=2, num_iterations=2)
    entropy, mask = [[0.2, 0.5, 5.0], [0.4, 0.1, 0.3]], [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    mean = sum(h * m for row, valid in zip(entropy, mask, strict=True) for h, m in zip(row, valid, strict=True)) / 5
    log_probs = torch.tensor([[0.99, 0.5, 0.97], [0.96, 0.3, 0.2]]).log().requires_grad_()
    batch = CompletionBatch(
        log_probs=log_probs,
        old_log_probs=log_probs.detach(),
        entropy=torch.tensor(entropy),
        clamped_entropy=None,
        mask=torch.tensor(mask),
        group_advantages=torch.tensor([[1.0], [-1.0]]),
    )
    loss_step(trainer, batch)
    alpha, integral = reference_pi(0.0, mean, 0.1, 1.0, 0.01, 1 / (2 * 2))
    controller = trainer.controllers["entropic"]
    assert (controller.value, controller.integral) == (pytest.approx(alpha, abs=1e-7), pytest.approx(integral))


# ---------------------------------------------------------------------------------------------------------------------
# Every rank's statistics in one process: rank 0 of two, the second rank's sums stood in (the two-process test below
# runs the real thing)
# ---------------------------------------------------------------------------------------------------------------------

# What the second rank sends to the controller's all-reduce [Σ m·H, Σ m] and the regulariser's [Σ high, Σ m]: 4 tokens
# of mean entropy 0.5, one of them above τ. Rank 0 holds the worked example's 4 tokens at 0.30 nats, 3 of them above τ.
SECOND_RANK_SUMS = (2.0, 4.0, 1.0)


def test_alpha_and_the_token_sum_normaliser_take_every_ranks_tokens(monkeypatch, toy_trainer_of):
    """α comes from the entropy mean over both ranks' tokens (0.4 nats, not rank 0's 0.30), and a token-sum loss type
    divides the term by both ranks' high-probability tokens per rank, (3 + 1) / 2, as DDP averages the ranks'
    gradients."""
    trainer = toy_trainer_of("entropic", loss_type="dapo", steps_per_generation=2)
    entropy_sum, tokens, high_tokens = SECOND_RANK_SUMS
    second_rank = [torch.tensor([[entropy_sum, tokens]]), torch.tensor([high_tokens, tokens])]
    monkeypatch.setattr(trainer, "accelerator", StandInRank(trainer.accelerator, 0, 2, second_rank))
    metrics = trainer._metrics["train"]
    metrics.clear()
    batch = example_batch(0.30)
    regulariser = loss_step_from_controllers_to_regularisers(trainer, batch)

    rank_zero_sums = (4 * 0.30, 4.0, 3.0)
    entropy_sum, tokens, high_tokens = (a + b for a, b in zip(rank_zero_sums, SECOND_RANK_SUMS, strict=True))
    alpha, integral = reference_pi(0.0, entropy_sum / tokens, 0.1, 1.0, 0.01, 0.5)  # the defaults; w = 1/2
    controller = trainer.controllers["entropic"]
    assert (controller.value, controller.integral) == (pytest.approx(alpha, abs=1e-7), pytest.approx(integral))
    # Σ −r·|A| over rank 0's high tokens is −(1 + 1 + 0) (ratio 1); the normaliser is 2 tokens per rank.
    assert regulariser.item() == pytest.approx(alpha * -2 / (high_tokens / 2), abs=1e-6)
    assert metrics["entropic/high_prob_fraction"] == [pytest.approx(high_tokens / tokens)]


# ---------------------------------------------------------------------------------------------------------------------
# The controller against the float64 reference
# ---------------------------------------------------------------------------------------------------------------------

GAINS = [(0.1, 1.0, 0.01), (0.5, 0.3, 0.2), (2.0, 4.0, 0.0), (0.05, 0.0, 0.5)]


@pytest.mark.parametrize("target, kp, ki", GAINS)
def test_controller_follows_the_float64_reference(target, kp, ki):
    generator = torch.Generator().manual_seed(int(target * 100))
    entropies = (torch.rand(40, generator=generator, dtype=torch.float64) * 3 * target).tolist() + [0.0, 50.0]
    integral = expected_integral = 0.0
    clipped = 0
    for mean_entropy in entropies:
        expected_alpha, expected_integral = reference_pi(expected_integral, mean_entropy, target, kp, ki, 0.25)
        assert entropic_alpha(integral, mean_entropy, target, kp, ki) == pytest.approx(expected_alpha, abs=1e-15)
        alpha, integral = entropic_pi_step(integral, mean_entropy, target, kp, ki, 0.25)
        assert (alpha, integral) == (pytest.approx(expected_alpha, abs=1e-12), pytest.approx(expected_integral))
        clipped += abs(alpha) == 1.0
    assert clipped > 0 or kp == 0  # the entropy of 50 nats clips α at 1 wherever K_p > 0


def test_zero_entropy_gives_a_finite_negative_alpha():
    alpha, integral = entropic_pi_step(0.3, 0.0, 0.1, 1.0, 0.01, 1.0)
    assert alpha == pytest.approx(-0.1 + 0.003) and integral == pytest.approx(0.2)


# ---------------------------------------------------------------------------------------------------------------------
# The trainer on a real batch: every loss type against trl.GRPOTrainer plus the float64 term
# ---------------------------------------------------------------------------------------------------------------------

ADVANTAGES = torch.tensor([0.9, -0.5, 0.0, -1.6])
# A target below the random toy model's entropy (about 3.8 nats) and a preset integral: α ≈ 0.5·0.3 + 0.05·2 = 0.25,
# unclipped, with both parts acting.
TARGET, KP, KI, INTEGRAL = 3.5, 0.5, 0.05, 2.0
LOSS_CASES = {
    "grpo": {"delta": 1.2},
    "bnpo": {"beta": 0.04},
    "dr_grpo": {},
    "dapo": {"importance_sampling_level": "sequence"},  # the term keeps the token ratio
    "cispo": {"epsilon_high": 1.2},
    "sapo": {},
    "luspo": {"importance_sampling_level": "sequence"},
    "vespo": {},
}
assert set(LOSS_CASES) == set(LOSS_TYPES)  # every loss type: EntroPIC refuses none


def float64_scores(path, inputs):
    """A float64 copy of the model, its differentiable log-probs of the completion tokens and its detached entropy."""
    model = float64_model(path)
    return model, completion_log_probs(model, inputs), naive_entropy(model, inputs)


def threshold_from_the_batch(log_probs, mask, advantages):
    """τ between two neighbouring probabilities of the batch's valid tokens, with a margin far above float32 rounding,
    such that tokens of a positive and of a negative advantage lie above it and valid tokens lie below it."""
    values = sorted(log_probs[mask.bool()].tolist())
    rows = advantages.unsqueeze(1).expand_as(log_probs)
    for low, high in zip(values, values[1:], strict=False):
        if high - low < 1e-3:
            continue
        cut = (low + high) / 2
        above = (log_probs > cut) & mask.bool()
        if (above & (rows > 0)).any() and (above & (rows < 0)).any() and (mask.bool() & ~above).sum() >= 3:
            return math.exp(cut), above.double()
    raise AssertionError("no threshold of the batch separates tokens of both signs")


@pytest.mark.parametrize("loss_type", LOSS_CASES)
def test_loss_and_gradients_equal_grpo_trainer_plus_the_float64_term(
    toy_model_path, toy_tokenizer, cached_trl_trainer, loss_type, toy_trainer_of
):
    options = {"loss_type": loss_type, **LOSS_CASES[loss_type]}
    trl_trainer = cached_trl_trainer(**options)
    inputs = make_grpo_batch(trl_trainer.model, len(toy_tokenizer), seed=list(LOSS_CASES).index(loss_type))
    inputs["advantages"] = ADVANTAGES.clone()
    model64, log_probs, entropy = float64_scores(toy_model_path, inputs)
    mask = inputs["completion_mask"].double()
    tau, high = threshold_from_the_batch(log_probs.detach(), mask, ADVANTAGES)

    ours = toy_trainer_of(
        "entropic", "ours", entropic_target=TARGET, entropic_kp=KP, entropic_ki=KI, entropic_high_prob=tau, **options
    )
    controller = ours.controllers["entropic"]
    controller.integral = INTEGRAL
    our_loss, our_grads = loss_and_gradients(ours, inputs)
    trl_loss, trl_grads = loss_and_gradients(trl_trainer, inputs)

    mean_entropy = ((entropy * mask).sum() / mask.sum()).item()
    alpha, integral = reference_pi(INTEGRAL, mean_entropy, TARGET, KP, KI, 1.0)  # one micro-batch per cycle: w = 1
    assert 0.1 < alpha < 0.9
    assert (controller.value, controller.integral) == (pytest.approx(alpha, rel=1e-5), pytest.approx(integral))
    ratio = torch.exp(log_probs - inputs["old_per_token_logps"].double())  # per token, unclipped
    advantages = ADVANTAGES.double().unsqueeze(1)
    term = reference_aggregate(-ratio * advantages.abs(), high, loss_type, 6)
    (alpha * term).backward()
    assert abs(alpha * term.item()) > 1e-3, "the term is too small for the comparison to mean anything"
    torch.testing.assert_close(our_loss.double(), trl_loss.double() + alpha * term.detach(), rtol=1e-5, atol=1e-7)
    assert set(our_grads) == set(trl_grads)
    for name, parameter in model64.named_parameters():
        expected = trl_grads[name].double() + parameter.grad
        torch.testing.assert_close(our_grads[name].double(), expected, rtol=1e-4, atol=1e-6, msg=name)
    fraction = (high.sum() / mask.sum()).item()
    assert ours._metrics["train"]["entropic/high_prob_fraction"] == [pytest.approx(fraction, abs=1e-12)]

    # The comparison has power: A instead of |A|, every valid token instead of the high ones, and α from the integral
    # after its update each give another loss.
    others = {
        "signed_advantage": alpha * reference_aggregate(-ratio * advantages, high, loss_type, 6),
        "every_token": alpha * reference_aggregate(-ratio * advantages.abs(), mask, loss_type, 6),
        "alpha_after_update": reference_pi(integral, mean_entropy, TARGET, KP, KI, 1.0)[0] * term,
    }
    for name, other in others.items():
        assert abs(other.item() - alpha * term.item()) > 1e-4, name


@pytest.mark.parametrize(
    "options",
    [{"loss_type": "grpo", "beta": 0.04, "delta": 1.2}, {"loss_type": "dapo"}, {"loss_type": "sapo"}],
    ids=lambda options: options["loss_type"],
)
def test_zero_gains_equal_grpo_trainer(toy_tokenizer, options, toy_trainer_of):
    trl_trainer = toy_trainer_of(TRL, "trl", **options)
    ours = toy_trainer_of(
        "entropic",
        "ours",
        entropic_kp=0.0,
        entropic_ki=0.0,
        entropic_high_prob=1e-4,  # below every probability of the batch: the term covers every token, times α = 0
        **options,
    )
    inputs = make_grpo_batch(trl_trainer.model, len(toy_tokenizer), seed=5)
    assert_same_step(trl_trainer, ours, inputs)
    controller = ours.controllers["entropic"]
    assert controller.value == 0.0 and controller.integral > 3  # the integral still moves (H̄ ≈ 3.8, H* = 0.1)
    assert ours._metrics["train"]["entropic/high_prob_fraction"] == [1.0]


def test_an_empty_high_probability_set_adds_nothing(toy_tokenizer, toy_trainer_of):
    """τ above every probability of the batch: the term is exactly 0, no NaN, and the step is trl.GRPOTrainer's."""
    trl_trainer = toy_trainer_of(TRL, "trl")
    ours = toy_trainer_of("entropic", "ours", entropic_high_prob=0.5)
    inputs = make_grpo_batch(trl_trainer.model, len(toy_tokenizer), seed=7)
    assert_same_step(trl_trainer, ours, inputs)
    controller = ours.controllers["entropic"]
    # The toy's 3.8 nats against H* = 0.1: α is at its bound, and still has nothing to act on.
    assert controller.value == 1.0
    assert ours._metrics["train"]["entropic/high_prob_fraction"] == [0.0]
    batch = example_batch(0.0, probabilities=[0.1, 0.2, 0.3, 0.4])
    term, _ = ours.part("entropic").regulariser(with_world_means(ours, batch))
    term.backward()
    assert term.item() == 0.0 and torch.isfinite(batch.log_probs.grad).all() and not batch.log_probs.grad.any()


def test_zero_entropy_micro_batch_gives_a_finite_loss(toy_trainer_of):
    trainer = toy_trainer_of("entropic", loss_type="grpo")
    batch = example_batch(0.0)
    loss = loss_step(trainer, batch)
    loss.backward()
    controller = trainer.controllers["entropic"]
    assert controller.value == pytest.approx(-0.1) and controller.integral == pytest.approx(-0.1)
    # α < 0: the term pushes the confident tokens' probabilities down, −α·|A|/3 on each.
    assert loss.item() == pytest.approx(-0.25 - 0.1 * (-2 / 3), abs=1e-6)
    assert torch.isfinite(batch.log_probs.grad).all()


# ---------------------------------------------------------------------------------------------------------------------
# Training: α and I per micro-batch, against the float64 replay
# ---------------------------------------------------------------------------------------------------------------------


def world_rank(model: str, output_dir: str) -> None:
    """One rank of a two-process run: three optimizer steps of two micro-batches each (a cycle is two micro-batches,
    w = 1/2); after every training micro-batch it records this rank's float64 [Σ m·H, Σ m] (from the weights the step
    used) and the controller's α and I."""
    trainer = make_trainer(
        "entropic", model, output_dir, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=3
    )
    records = record_micro_batches(trainer)
    trainer.train()
    with open(f"{output_dir}/rank{trainer.accelerator.process_index}.json", "w") as file:
        json.dump({"settings": controller_settings(trainer), "records": records}, file)


def record_micro_batches(trainer) -> list[dict]:
    """After every training loss step of ``trainer``: this rank's float64 entropy sums and the controller's state."""
    records, compute = [], trainer._compute_loss
    controller = trainer.controllers["entropic"]

    def recording(model, inputs):
        entropy = naive_entropy(trainer.accelerator.unwrap_model(model), inputs)
        mask = inputs["completion_mask"].double()
        loss = compute(model, inputs)
        if model.training:
            sums = [(entropy * mask).sum().item(), mask.sum().item()]
            records.append({"sums": sums, "alpha": controller.value, "integral": controller.integral})
        return loss

    trainer._compute_loss = recording
    return records


def controller_settings(trainer) -> dict:
    """What the replay needs from the run's config: the target, the gains, and w (as the batch layout gives it)."""
    args = trainer.args
    weight = 1 / (args.steps_per_generation * args.num_iterations)
    return {"target": args.entropic_target, "kp": args.entropic_kp, "ki": args.entropic_ki, "weight": weight}


def replay(sums_per_micro_batch, weight, target, kp, ki):
    """The float64 controller over the world's sums of each micro-batch: ``[(α, I)]``."""
    integral, states = 0.0, []
    for total, count in sums_per_micro_batch:
        alpha, integral = reference_pi(integral, total / count, target, kp, ki, weight)
        states.append((alpha, integral))
    return states


def assert_states_replayed(records, states):
    assert len(records) == len(states)
    for index, (record, (alpha, integral)) in enumerate(zip(records, states, strict=True)):
        assert record["alpha"] == pytest.approx(alpha, rel=1e-5, abs=1e-7), index
        assert record["integral"] == pytest.approx(integral, rel=1e-5, abs=1e-7), index
    alphas = [record["alpha"] for record in records]
    assert all(abs(alpha) < 1 for alpha in alphas) and len(set(alphas)) == len(alphas), "the check would be weak"


def test_one_process_controller_is_the_float64_replay_of_its_micro_batches(warm_toy_policy_path, tmp_path):
    """Two passes over each generation batch of two micro-batches: a cycle is four micro-batches, w = 1/4, and the
    integral moves at every one of them."""
    trainer = make_trainer(
        "entropic",
        warm_toy_policy_path,
        str(tmp_path),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_iterations=2,
        max_steps=3,
    )
    settings = controller_settings(trainer)
    assert settings["weight"] == trainer.controllers["entropic"].weight == 0.25
    records = record_micro_batches(trainer)
    trainer.train()
    assert len(records) == 6
    assert_states_replayed(records, replay([record["sums"] for record in records], **settings))


# two processes, three steps (a launch-tier test, tests/methods/conftest.py)
def test_every_rank_holds_the_float64_replay_of_the_world_micro_batches(two_ranks, warm_toy_policy_path, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    two_ranks.run(world_rank, warm_toy_policy_path, str(out))
    written = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    settings, ranks = written[0]["settings"], [rank["records"] for rank in written]
    assert settings["weight"] == 0.5  # two micro-batches per cycle
    assert len(ranks[0]) == len(ranks[1]) == 6  # three steps of two micro-batches
    # Bit for bit: both take α and I from the same all-reduced sums.
    assert [(r["alpha"], r["integral"]) for r in ranks[0]] == [(r["alpha"], r["integral"]) for r in ranks[1]]
    world = [[a + b for a, b in zip(r0["sums"], r1["sums"], strict=True)] for r0, r1 in zip(*ranks, strict=True)]
    assert_states_replayed(ranks[0], replay(world, **settings))
    # Each rank's own mean differs from the world's: a rank-local controller would give another trajectory.
    local = [total / count for total, count in (r["sums"] for r in ranks[0])]
    assert max(abs(mean - total / count) for mean, (total, count) in zip(local, world, strict=True)) > 1e-3


# The pair table's piece (tests/compose/test_pairs.py): the regulariser and its probability threshold.


def pair_entropic_regulariser(log_probs, old_log_probs, entropy, logits, sequence_advantages, mask, s):
    """EntroPIC (arXiv:2511.15248): ``α·mean_high(−r·|A|)`` with ``α = clip(K_p·(H̄ − H*), −1, 1)`` at the first
    micro-batch, ``A`` the group advantages."""
    mean_entropy = weighted_mean(entropy.detach(), mask).item()
    alpha = min(max(s["entropic_kp"] * (mean_entropy - s["entropic_target"]), -1.0), 1.0)
    high = ((log_probs.detach() > math.log(s["entropic_high_prob"])) & mask.bool()).double()
    return alpha * weighted_mean(-torch.exp(log_probs - old_log_probs) * sequence_advantages.abs(), high)


def pair_entropic_high_probability(log_probs, advantages, mask):
    """The probability threshold in the widest gap of the batch's token probabilities."""
    probability, _ = widest_gap(log_probs[mask.bool()].exp())
    return dict(entropic_high_prob=probability)


PAIR = PairReference(
    settings=dict(entropic_kp=0.5, entropic_target=0.1),
    methods={
        "entropic": PairMethod(
            "entropy regulariser", regulariser=pair_entropic_regulariser, thresholds=pair_entropic_high_probability
        )
    },
)
