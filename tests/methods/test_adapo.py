"""ADAPO: config (renamed target, the on-policy warning), the ε_high controller, the trainer's loss against
trl.GRPOTrainer's DAPO loss. Checkpoints: tests/trainer/test_resume.py; accumulation and cycle timing:
tests/trainer/test_accumulation.py; invalid config values: tests/trainer/test_bad_input.py."""

import json
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from _reference.pairs import PairMethod, PairReference
from _support.grpo import (
    loss_and_gradients,
    make_grpo_batch,
    naive_log_probs,
    on_policy_warnings,
    set_sync,
    toy_config,
)
from _support.parity import TRL
from trl import GRPOConfig

from trl_entropy.methods.adapo import ADAPOConfig, ADAPOController, adapo_controller_step


# ---------------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------------


def test_config_defaults():
    config = toy_config(ADAPOConfig, num_iterations=2)
    assert (config.loss_type, config.epsilon, config.epsilon_high, config.adapo_entropy_target) == (
        "dapo",
        0.2,
        0.28,
        None,
    )
    assert (config.adapo_epsilon_high_step, config.adapo_epsilon_high_min, config.adapo_epsilon_high_max) == (
        0.01,
        0.1,
        0.5,
    )
    assert config.entropy_target == GRPOConfig.entropy_target  # TRL's own field keeps TRL's default and meaning


ON_POLICY = "ADAPO with fully on-policy updates"


def test_warns_once_at_construction_when_on_policy(tmp_path, toy_model_path, toy_tokenizer):
    """On TRL's defaults (one pass, steps_per_generation = gradient_accumulation_steps). The other layouts, on-policy
    or not, for every method: tests/trainer/test_base.py (the same warning on each on-policy one, none off-policy)."""
    messages = on_policy_warnings("adapo", toy_model_path, toy_tokenizer, tmp_path)
    assert len(messages) == 1, messages  # ADAPO's own warning, not also the base's clip warning
    # it names the settings that make ADAPO act
    assert ON_POLICY in messages[0]
    assert "num_iterations > 1" in messages[0]
    assert "steps_per_generation > gradient_accumulation_steps" in messages[0]


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
    assert controller.state_dict() == {"epsilon_high": values[-1], "entropy_target": 1.0}
    restored = ADAPOController(epsilon_high=0.28, delta=0.01, minimum=0.25, maximum=0.31)
    restored.load_state_dict(json.loads(json.dumps(controller.state_dict())))
    assert restored.state_dict() == controller.state_dict()


def test_controller_with_a_given_target_moves_on_the_first_step():
    controller = ADAPOController(epsilon_high=0.28, delta=0.01, minimum=0.1, maximum=0.5, entropy_target=0.5)
    controller.update(1.0, 1)
    assert (controller.epsilon_high, controller.entropy_target) == (pytest.approx(0.27), 0.5)


# ---------------------------------------------------------------------------------------------------------------------
# Trainer: loss against trl.GRPOTrainer's DAPO loss
# ---------------------------------------------------------------------------------------------------------------------


def test_loss_and_gradients_equal_grpo_trainer_dapo_with_the_controller_epsilon_high(toy_tokenizer, toy_trainer_of):
    trl_trainer = toy_trainer_of(TRL, "trl", loss_type="dapo", epsilon_high=0.28)
    ours = toy_trainer_of(
        "adapo",
        "ours",
        adapo_epsilon_high_step=0.05,
        adapo_entropy_target=100.0,  # above any entropy of the toy vocabulary: ε_high rises by δ each cycle
    )
    # Three cycles (one optimizer step each) move ε_high 0.28 → 0.33 → 0.38 → 0.43.
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


# The pair table's piece (tests/compose/test_pairs.py): the clip bound, read by the PPO clip.


def test_the_mai_thinking_preset_loads_validates_and_moves_k_by_the_reports_rule():
    """examples/configs/adapo_mai_thinking.yaml: the MAI-Thinking-1 report's values (as others' notes of it quote
    them), valid for ADAPO and off-policy, and ADAPO's controller moving epsilon_high = eps / (1 - eps) + k as the
    report moves k: k <- clip(k + delta_k * sign(H* - H), 0, k_max), with eps 0.6, delta_k 0.25, k_max 2.5, H* 0.3."""
    preset = Path(__file__).resolve().parents[2] / "examples" / "configs" / "adapo_mai_thinking.yaml"
    values = yaml.safe_load(preset.read_text())
    assert values.pop("method") == "adapo"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = toy_config(ADAPOConfig, **values)
    assert not [str(w.message) for w in caught if "ADAPO" in str(w.message)]  # off-policy: no on-policy warning
    eps, delta_k, k_max, target = 0.6, 0.25, 2.5, 0.3
    assert config.loss_type == "dapo" and config.delta == 50.0
    assert (config.epsilon, config.epsilon_high) == (eps, pytest.approx(eps / (1 - eps)))
    settings = ("epsilon_high", "adapo_epsilon_high_step", "adapo_epsilon_high_min", "adapo_epsilon_high_max")
    controller = ADAPOController(*(getattr(config, name) for name in settings), config.adapo_entropy_target)
    k, trace = 0.0, []
    entropies = [0.1] * 12 + [0.3] + [0.9] * 13  # below the target to the cap, at it, above it to the floor
    for step, entropy in enumerate(entropies, start=1):
        gap = target - entropy
        k = min(max(k + delta_k * ((gap > 0) - (gap < 0)), 0.0), k_max)
        controller.update(entropy, step)
        assert controller.value == pytest.approx(eps / (1 - eps) + k, abs=1e-12), step
        trace.append(controller.value)
    assert max(trace) == pytest.approx(4.0) and trace[-1] == pytest.approx(1.5) and trace[11] == trace[12]


# At the first step ADAPO's ε_high is the config's: the reference's PPO clip is ADAPO's clip bound.
PAIR = PairReference(settings={}, methods={"adapo": PairMethod("clip bound", acts_through_clip=True)})
