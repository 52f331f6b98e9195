"""TRL's entropy coefficient on a schedule, through the trainer: at every step the loss and every gradient equal
``trl.GRPOTrainer``'s with that step's coefficient as its constant ``entropy_coef``; the bonus's gradient is there
wherever the coefficient is not 0 (what TRL's PRs #5595/#5596 lacked: their bonus changed the loss, never its
gradient); a schedule from 0 still switches the bonus on; evaluation reads the current value and moves nothing; and a
resumed run continues the sequence, warning when the schedule or ``max_steps`` changed."""

import os

import pytest
from _support.distributed_run import logged
from _support.grpo import build_trainer, loss_and_gradients, make_grpo_batch
from _support.parity import ACCUMULATION, TRL, assert_same_step
from _support.resume import CHECKPOINT, step_values, train

from trl_entropy.core.schedules import Schedule


# Warm-up over the first step from 0, then linear from 0.02 to 0 at the end of 4 steps: 0, 0.02, 0.0133, 0.0067.
SCHEDULE = dict(
    entropy_coef=0.02,
    entropy_coef_schedule="linear",
    entropy_coef_final=0.0,
    entropy_coef_warmup_steps=1,
    entropy_coef_warmup_start=0.0,
)
MAX_STEPS = 4
VALUES = [0.0, 0.02, 0.02 * 2 / 3, 0.02 / 3]


def trainers(path, tokenizer, tmp_path, coefficient, **schedule):
    ours = build_trainer("grpo", path, tokenizer, tmp_path / "ours", ACCUMULATION, max_steps=MAX_STEPS, **schedule)
    ours.state.max_steps = MAX_STEPS
    trl = build_trainer(TRL, path, tokenizer, tmp_path / "trl", ACCUMULATION, entropy_coef=coefficient)
    return trl, ours


def test_the_schedules_values_are_the_formulas():
    schedule = Schedule("linear", start=0.02, final=0.0, warmup_steps=1, warmup_start=0.0)
    assert [schedule.value(step, MAX_STEPS) for step in range(MAX_STEPS)] == pytest.approx(VALUES, abs=1e-15)


@pytest.mark.parametrize("step", range(MAX_STEPS))
def test_each_step_equals_grpo_trainer_with_that_steps_coefficient(step, toy_model_path, toy_tokenizer, tmp_path):
    trl_trainer, ours = trainers(toy_model_path, toy_tokenizer, tmp_path, VALUES[step], **SCHEDULE)
    ours.state.global_step = step
    inputs = make_grpo_batch(ours.model, len(toy_tokenizer), seed=10 + step)
    assert_same_step(trl_trainer, ours, inputs)
    assert ours.entropy_coef == pytest.approx(VALUES[step], abs=1e-15)  # TRL's attribute, which TRL logs


def test_the_generation_cycle_clock_counts_every_pass_over_the_batch(toy_tokenizer, toy_trainer_of):
    """Two passes over each generation batch: a cycle is steps_per_generation · num_iterations = 4 micro-batches, two
    optimizer steps of accumulation 2, so step 3 of 10 is cycle ⌊3·2/4⌋ = 1 of ⌊10·2/4⌋ = 5 and the coefficient is
    0.02·(1 − 1/5). A clock that dropped the passes would read cycle 3 of 10 (0.014)."""
    cycle, cycles = 3 * 2 // (2 * 2), 10 * 2 // (2 * 2)
    coefficient = 0.02 + (0.0 - 0.02) * cycle / cycles
    schedule = dict(SCHEDULE, entropy_coef_warmup_steps=0, entropy_schedule_unit="generation_cycle")
    ours = toy_trainer_of("grpo", "ours", accumulation=ACCUMULATION, max_steps=10, num_iterations=2, **schedule)
    ours.state.max_steps, ours.state.global_step = 10, 3
    trl_trainer = toy_trainer_of(TRL, "trl", accumulation=ACCUMULATION, num_iterations=2, entropy_coef=0.016)
    assert (cycle, cycles) == (1, 5) and coefficient == pytest.approx(0.016, abs=1e-15)
    assert_same_step(trl_trainer, ours, make_grpo_batch(ours.model, len(toy_tokenizer), seed=4))
    assert ours.entropy_coef == pytest.approx(coefficient, abs=1e-15)


def test_the_bonus_has_a_gradient_wherever_its_coefficient_is_not_zero(
    toy_model_path, toy_tokenizer, tmp_path, toy_trainer_of
):
    """The bonus's part of the gradient, against the same step without a bonus, scales with the coefficient."""
    _, ours = trainers(toy_model_path, toy_tokenizer, tmp_path, 0.0, **SCHEDULE)
    without = toy_trainer_of("grpo", "plain", accumulation=ACCUMULATION)
    inputs = make_grpo_batch(ours.model, len(toy_tokenizer), seed=3)
    _, base = loss_and_gradients(without, inputs)
    shares = []
    for step, value in enumerate(VALUES):
        ours.state.global_step = step
        _, grads = loss_and_gradients(ours, inputs)
        difference = sum(float((grads[name] - base[name]).abs().sum()) for name in base)
        shares.append(difference)
        assert (difference > 0) == (value != 0), (step, value, difference)
    # Linear in the coefficient: the bonus's gradient at 0.0133 is two thirds of that at 0.02.
    assert shares[2] / shares[1] == pytest.approx(2 / 3, rel=1e-3)


def test_a_schedule_from_zero_switches_the_bonus_on(toy_model_path, toy_tokenizer, tmp_path):
    """TRL decides at construction from entropy_coef alone; a schedule rising from 0 must still apply its bonus."""
    rising = dict(entropy_coef=0.0, entropy_coef_schedule="linear", entropy_coef_final=0.03)
    trl_trainer, ours = trainers(toy_model_path, toy_tokenizer, tmp_path, 0.015, **rising)
    assert not ours._entropy_bonus_enabled and ours.entropy_bonus_enabled  # TRL's decision, and ours
    ours.state.global_step = 2  # halfway: 0.015
    assert_same_step(trl_trainer, ours, make_grpo_batch(ours.model, len(toy_tokenizer), seed=5))


def test_evaluation_reads_the_current_value_and_moves_nothing(toy_model_path, toy_tokenizer, tmp_path):
    trl_trainer, ours = trainers(toy_model_path, toy_tokenizer, tmp_path, VALUES[2], **SCHEDULE)
    ours.state.global_step = 2
    ours.entropy_coef = 0.5  # what training last wrote, here a stand-in that evaluation must not touch
    inputs = make_grpo_batch(ours.model, len(toy_tokenizer), seed=7)
    for trainer in (trl_trainer, ours):
        trainer.model.eval()
    import torch

    with torch.no_grad():
        expected = trl_trainer.compute_loss(trl_trainer.model, dict(inputs))
        got = ours.compute_loss(ours.model, dict(inputs))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    assert ours.entropy_coef == 0.5 and "entropy/schedule_progress" not in ours._metrics["eval"]


RESUMED = dict(SCHEDULE, entropy_coef_warmup_steps=0, max_steps=4)  # 0.02, 0.015, 0.01, 0.005


def test_a_resumed_run_continues_the_coefficients_sequence(warm_toy_policy_path, tmp_path):
    straight, _ = train("entreg", warm_toy_policy_path, str(tmp_path / "straight"), **RESUMED)
    checkpoint = os.path.join(tmp_path / "straight", f"checkpoint-{CHECKPOINT}")
    resumed, _ = train("entreg", warm_toy_policy_path, str(tmp_path / "resumed"), resume_from=checkpoint, **RESUMED)
    expected = {step: 0.02 - 0.005 * (step - 1) for step in range(1, 5)}  # logged at the end of each step
    assert step_values(straight, "entropy_coef") == pytest.approx(expected)

    def after_checkpoint(trainer, key):  # a resumed run's history begins with the checkpoint's
        return {step: value for step, value in step_values(trainer, key).items() if step > CHECKPOINT}

    assert after_checkpoint(resumed, "entropy_coef") == pytest.approx(after_checkpoint(straight, "entropy_coef"))
    assert after_checkpoint(resumed, "loss") == pytest.approx(after_checkpoint(straight, "loss"), rel=1e-5)
    assert logged(straight, "entropy/schedule_progress") == pytest.approx([0.0, 0.25, 0.5, 0.75])


@pytest.mark.parametrize(
    ("changed", "named"),
    [({"entropy_coef_final": 0.01}, "entropy_coef_final: 0.0 → 0.01"), ({"max_steps": 6}, "max_steps: 4 → 6")],
)
def test_a_changed_schedule_on_resume_is_named(changed, named, warm_toy_policy_path, tmp_path):
    train("entreg", warm_toy_policy_path, str(tmp_path / "first"), **RESUMED)
    checkpoint = os.path.join(tmp_path / "first", f"checkpoint-{CHECKPOINT}")
    with pytest.warns(UserWarning, match=named):
        train(
            "entreg", warm_toy_policy_path, str(tmp_path / "again"), resume_from=checkpoint, **{**RESUMED, **changed}
        )
