"""ADAPO: config, the ε_high controller, the trainer's loss against trl.GRPOTrainer's DAPO loss, checkpoints, gradient
accumulation and an end-to-end run on the toy task."""

import json
import math
import os

import pytest
import torch
from conftest import (
    build_trainer,
    loss_and_gradients,
    make_grpo_batch,
    naive_entropy,
    naive_log_probs,
    set_sync,
    split_batch,
    train_toy,
    varied_batch,
)
from trl import GRPOConfig, GRPOTrainer

from trl_entropy.adapo import ADAPOConfig, ADAPOController, ADAPOTrainer, adapo_controller_step


# ---------------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------------


def make_config(tmp_path, **options):
    return ADAPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **options)


def test_config_defaults(tmp_path):
    config = make_config(tmp_path)
    assert (config.loss_type, config.epsilon, config.epsilon_high, config.entropy_target) == ("dapo", 0.2, 0.28, None)
    assert (config.adapo_epsilon_high_step, config.adapo_epsilon_high_min, config.adapo_epsilon_high_max) == (
        0.01,
        0.1,
        0.5,
    )


@pytest.mark.parametrize(
    "options, field_name",
    [
        ({"loss_type": "grpo"}, "loss_type"),
        ({"loss_type": "bnpo"}, "loss_type"),
        ({"loss_type": "dr_grpo"}, "loss_type"),
        ({"adapo_epsilon_high_step": 0.0}, "adapo_epsilon_high_step"),
        ({"adapo_epsilon_high_step": -0.01}, "adapo_epsilon_high_step"),
        ({"adapo_epsilon_high_step": math.nan}, "adapo_epsilon_high_step"),
        ({"adapo_epsilon_high_min": -0.1}, "adapo_epsilon_high_min"),
        ({"adapo_epsilon_high_max": 0.05}, "adapo_epsilon_high_max"),  # below the minimum 0.1
        ({"adapo_epsilon_high_max": math.inf}, "adapo_epsilon_high_max"),
        ({"epsilon_high": 0.05}, "epsilon_high"),  # below the minimum
        ({"epsilon_high": 0.6}, "epsilon_high"),  # above the maximum
        ({"epsilon_high": None}, "epsilon_high"),
        ({"epsilon_high": 0.3, "adapo_epsilon_high_max": 0.29}, "epsilon_high"),
        ({"epsilon": 1.0}, "epsilon"),
        ({"epsilon": -0.1}, "epsilon"),
        ({"entropy_target": 0.0}, "entropy_target"),
        ({"entropy_target": math.nan}, "entropy_target"),
        ({"entropy_coef": 0.01}, "entropy_coef"),
        ({"use_adaptive_entropy": True}, "use_adaptive_entropy"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(tmp_path, options, field_name):
    with pytest.raises(ValueError, match=field_name):
        make_config(tmp_path, **options)


# ---------------------------------------------------------------------------------------------------------------------
# Controller
# ---------------------------------------------------------------------------------------------------------------------


def test_controller_step_function_on_explicit_cases():
    assert adapo_controller_step(0.28, 0.9, 1.0, 0.01, 0.1, 0.5) == pytest.approx(0.29)  # below target: +δ
    assert adapo_controller_step(0.28, 1.1, 1.0, 0.01, 0.1, 0.5) == pytest.approx(0.27)  # above target: −δ
    assert adapo_controller_step(0.28, 1.0, 1.0, 0.01, 0.1, 0.5) == 0.28  # on target
    assert adapo_controller_step(0.495, 0.9, 1.0, 0.01, 0.1, 0.5) == 0.5  # clamped at the maximum
    assert adapo_controller_step(0.105, 1.1, 1.0, 0.01, 0.1, 0.5) == 0.1  # clamped at the minimum


def test_controller_trajectory_on_a_scripted_entropy_sequence():
    controller = ADAPOController(epsilon_high=0.28, delta=0.01, minimum=0.25, maximum=0.31)
    entropies = [1.0, 0.9, 0.8, 0.7, 0.6, 1.2, 1.0, 1.3, 1.3, 1.3, 1.3, 1.3, 1.3]
    # Step 1 measures H* = 1.0 and holds; +δ three times up to the maximum 0.31, where it stays; −δ; on target; −δ
    # down to the minimum 0.25, where it stays.
    expected = [0.28, 0.29, 0.30, 0.31, 0.31, 0.30, 0.30, 0.29, 0.28, 0.27, 0.26, 0.25, 0.25]
    values = []
    for step, entropy in enumerate(entropies, start=1):
        controller.update(entropy, step)
        values.append(controller.epsilon_high)
        assert controller.metrics() == {"adapo/epsilon_high": controller.epsilon_high, "adapo/entropy_target": 1.0}
    assert values == pytest.approx(expected, abs=1e-12)
    assert controller.state_dict() == {"epsilon_high": values[-1], "entropy_target": 1.0, "last_step": 13}
    restored = ADAPOController(epsilon_high=0.28, delta=0.01, minimum=0.25, maximum=0.31)
    restored.load_state_dict(json.loads(json.dumps(controller.state_dict())))
    assert restored.state_dict() == controller.state_dict()


def test_controller_with_a_given_target_moves_on_the_first_step():
    controller = ADAPOController(epsilon_high=0.28, delta=0.01, minimum=0.1, maximum=0.5, entropy_target=0.5)
    controller.update(1.0, 1)
    assert (controller.epsilon_high, controller.entropy_target) == (pytest.approx(0.27), 0.5)


# ---------------------------------------------------------------------------------------------------------------------
# Trainer: loss against trl.GRPOTrainer's DAPO loss, the first-step target, gradient accumulation
# ---------------------------------------------------------------------------------------------------------------------


def test_loss_equals_grpo_trainer_dapo_with_the_controller_epsilon_high(toy_model_path, toy_tokenizer, tmp_path):
    trl_trainer = build_trainer(
        GRPOTrainer, GRPOConfig, toy_model_path, toy_tokenizer, tmp_path / "trl", loss_type="dapo", epsilon_high=0.28
    )
    ours = build_trainer(
        ADAPOTrainer,
        ADAPOConfig,
        toy_model_path,
        toy_tokenizer,
        tmp_path / "ours",
        adapo_epsilon_high_step=0.05,
        entropy_target=100.0,  # above any entropy of the toy vocabulary: ε_high rises by δ each step
    )
    # Three optimizer steps move ε_high 0.28 → 0.33 → 0.38 → 0.43.
    set_sync(ours, True)
    for seed in range(3):
        ours.compute_loss(ours.model, make_grpo_batch(ours.model, len(toy_tokenizer), seed=seed))
    epsilon_high = ours.controllers["adapo"].value
    assert epsilon_high == pytest.approx(0.43)
    assert ours._metrics["train"]["adapo/epsilon_high"] == pytest.approx([0.33, 0.38, 0.43])
    assert ours.clip_range() == (0.2, epsilon_high)

    inputs = make_grpo_batch(trl_trainer.model, len(toy_tokenizer), seed=11)
    # Log-ratios spread evenly over [−0.5, 0.5] and positive advantages: some ratios fall between 1 + 0.28 and
    # 1 + 0.43, where the two clip ranges differ.
    log_probs = naive_log_probs(trl_trainer.model, inputs).float()
    inputs["old_per_token_logps"] = log_probs - torch.linspace(-0.5, 0.5, log_probs.numel()).view_as(log_probs)
    inputs["advantages"] = inputs["advantages"].abs()
    trl_default_loss, _ = loss_and_gradients(trl_trainer, inputs)  # ε_high = 0.28
    trl_trainer.epsilon_high = epsilon_high
    set_sync(ours, False)
    our_loss, our_grads = loss_and_gradients(ours, inputs)
    trl_loss, trl_grads = loss_and_gradients(trl_trainer, inputs)
    torch.testing.assert_close(our_loss, trl_loss, rtol=1e-5, atol=1e-7)
    assert set(our_grads) == set(trl_grads)
    for name in trl_grads:
        torch.testing.assert_close(our_grads[name], trl_grads[name], rtol=1e-4, atol=1e-7, msg=name)
    for key in ("clip_ratio/high_mean", "clip_ratio/low_mean"):
        assert ours._metrics["train"][key][-1] == pytest.approx(trl_trainer._metrics["train"][key][-1], abs=1e-7)
    # The comparison has power: ε_high matters on this batch.
    assert abs(trl_default_loss.item() - our_loss.item()) > 1e-4


def test_target_is_the_first_optimizer_steps_mean_entropy(toy_model_path, toy_tokenizer, tmp_path):
    trainer = build_trainer(ADAPOTrainer, ADAPOConfig, toy_model_path, toy_tokenizer, tmp_path, accumulation=2)
    inputs = varied_batch(trainer.model, len(toy_tokenizer), seed=0)
    first, second = split_batch(inputs)
    set_sync(trainer, False)
    trainer.compute_loss(trainer.model, first)
    assert trainer.controllers["adapo"].entropy_target is None
    set_sync(trainer, True)
    trainer.compute_loss(trainer.model, second)
    entropy, mask = naive_entropy(trainer.model, inputs), inputs["completion_mask"].double()
    controller = trainer.controllers["adapo"]
    assert controller.entropy_target == pytest.approx(((entropy * mask).sum() / mask.sum()).item(), rel=1e-5)
    assert controller.epsilon_high == 0.28
    assert trainer._metrics["train"]["adapo/entropy_target"] == [controller.entropy_target]


def test_accumulation_of_two_half_batches_gives_the_same_trajectory(toy_model_path, toy_tokenizer, tmp_path):
    whole = build_trainer(ADAPOTrainer, ADAPOConfig, toy_model_path, toy_tokenizer, tmp_path / "a", 1)
    halves = build_trainer(ADAPOTrainer, ADAPOConfig, toy_model_path, toy_tokenizer, tmp_path / "b", 2)
    trajectory = []
    for seed in range(5):
        inputs = varied_batch(whole.model, len(toy_tokenizer), seed=seed)
        set_sync(whole, True)
        whole.compute_loss(whole.model, inputs)
        for sync, part in zip((False, True), split_batch(inputs), strict=True):
            set_sync(halves, sync)
            halves.compute_loss(halves.model, part)
        a, b = whole.controllers["adapo"], halves.controllers["adapo"]
        assert b.entropy_target == pytest.approx(a.entropy_target, rel=1e-6)
        assert b.epsilon_high == pytest.approx(a.epsilon_high, abs=1e-12)
        trajectory.append(a.epsilon_high)
    assert len(set(trajectory)) > 1, trajectory  # the controller moved


# ---------------------------------------------------------------------------------------------------------------------
# End to end: training on the toy task, checkpoint and resume
# ---------------------------------------------------------------------------------------------------------------------


def expected_next(epsilon_high, entropy, target, delta=0.03, low=0.1, high=0.5):
    if entropy < target:
        epsilon_high += delta
    elif entropy > target:
        epsilon_high -= delta
    return min(max(epsilon_high, low), high)


def test_train_checkpoint_and_resume(warm_toy_policy_path, tmp_path):
    options = dict(adapo_epsilon_high_step=0.03)
    trainer, _, logs = train_toy(
        ADAPOTrainer, ADAPOConfig, warm_toy_policy_path, tmp_path, "adapo/epsilon_high", **options
    )
    assert sorted(logs) == [1, 2, 3, 4]
    target = logs[1]["adapo/entropy_target"]
    assert 0 < target < math.log(len(trainer.processing_class))
    assert target == pytest.approx(logs[1]["entropy"], rel=1e-6)  # one micro-batch per optimizer step
    assert logs[1]["adapo/epsilon_high"] == pytest.approx(0.28)
    epsilon_high = 0.28
    for step in (2, 3, 4):
        assert logs[step]["adapo/entropy_target"] == target
        epsilon_high = expected_next(epsilon_high, logs[step]["entropy"], target)
        assert logs[step]["adapo/epsilon_high"] == pytest.approx(epsilon_high, abs=1e-9), step

    checkpoint = os.path.join(tmp_path, "checkpoint-2")
    with open(os.path.join(checkpoint, "trl_entropy_controllers.json")) as file:
        saved = json.load(file)
    assert saved == {
        "adapo": {"epsilon_high": logs[2]["adapo/epsilon_high"], "entropy_target": target, "last_step": 2}
    }

    resumed, recorder, resumed_logs = train_toy(
        ADAPOTrainer,
        ADAPOConfig,
        warm_toy_policy_path,
        tmp_path / "resumed",
        "adapo/epsilon_high",
        checkpoint,
        **options,
    )
    assert recorder.state == saved  # restored exactly, before the first resumed step
    assert resumed_logs[3]["adapo/entropy_target"] == target  # not measured again
    expected = expected_next(saved["adapo"]["epsilon_high"], resumed_logs[3]["entropy"], target)
    assert resumed_logs[3]["adapo/epsilon_high"] == pytest.approx(expected, abs=1e-9)
    assert resumed.controllers["adapo"].last_step == 4
