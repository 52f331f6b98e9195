"""Batches a real vLLM engine generated (vLLM's CPU build, TRL's colocate mode), each made in a forked child
(``_support/vllm_engine.py``): parity with ``trl.GRPOTrainer``, TRL's importance-sampling correction against a float64
loss step, and the rollout entropy of the methods that read it."""

import os

import pytest
import torch
from _reference import combined_reference as reference
from _support.distributed_run import make_trainer
from _support.grpo import build_trainer, loss_and_gradients
from _support.vllm_engine import (
    VLLM_OPTIONS,
    alternating_reward,
    capture_generation_batch,
    count_syncs,
    in_child,
)
from transformers import AutoModelForCausalLM

from trl_entropy import EntropyGRPOTrainer
from trl_entropy.methods import combination
from trl_entropy.toy import build_toy_dataset


IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
CORRECTED_METHODS = ("aent", "ce_gppo", "clip_cov", "erc", "kl_cov", "steer")
ROLLOUT_ENTROPY = ("entrocraft", "erc", "steer")
PERTURBATION = 0.03  # the rollout weights' distance from the saved ones: ratios well outside [0.9, 1.1] and the clip
ROWS = [build_toy_dataset(8)[index] for index in (0, 0, 0, 0, 1, 1, 1, 1)]  # two prompts, a group of 4 each


# ---------------------------------------------------------------------------------------------------------------------
# Parity with trl.GRPOTrainer on a vLLM batch
# ---------------------------------------------------------------------------------------------------------------------


def generate_and_step(method, path, output_dir, result, batch_file=None):
    """Make a generation batch with vLLM (or read ``batch_file``), then one loss step on it: batch, loss and every
    gradient to ``result``. ``"trl"`` is ``trl.GRPOTrainer``, built with the CPU platform's plain weights."""
    from trl_entropy.core.trl.vllm import plain_cpu_weights

    with plain_cpu_weights(method == "trl"):
        trainer = make_trainer(method, path, output_dir, reward=alternating_reward, beta=0.04, **VLLM_OPTIONS)
    batch = torch.load(batch_file) if batch_file else capture_generation_batch(trainer, ROWS)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    loss, gradients = loss_and_gradients(trainer, dict(batch))
    torch.save({"batch": batch, "loss": loss, "gradients": gradients}, result)


def test_the_base_with_control_off_equals_grpo_trainer_on_a_vllm_batch(vllm_toy_path, tmp_path):
    ours, theirs = str(tmp_path / "ours.pt"), str(tmp_path / "trl.pt")
    in_child(generate_and_step, "grpo", vllm_toy_path, str(tmp_path), ours)
    torch.save(torch.load(ours)["batch"], tmp_path / "batch.pt")
    in_child(generate_and_step, "trl", vllm_toy_path, str(tmp_path), theirs, str(tmp_path / "batch.pt"))
    ours, theirs = torch.load(ours), torch.load(theirs)
    assert (ours["batch"]["importance_sampling_ratio"] != 1).any()  # vLLM's own log-probs, not the trainer's
    torch.testing.assert_close(ours["loss"], theirs["loss"], rtol=1e-5, atol=1e-7)
    assert any(gradient.abs().max() > 0 for gradient in theirs["gradients"].values())
    for name, expected in theirs["gradients"].items():
        atol = max(1e-7, 1e-5 * expected.abs().max().item())
        torch.testing.assert_close(ours["gradients"][name], expected, rtol=1e-4, atol=atol, msg=name)


# ---------------------------------------------------------------------------------------------------------------------
# TRL's importance-sampling correction on a captured vLLM batch, against float64
# ---------------------------------------------------------------------------------------------------------------------


def perturbed(trainer, seed: int = 7) -> None:
    """Move the trainer's weights by a fixed, seeded amount (vLLM keeps the saved ones: its sync is skipped)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in trainer.model.parameters():
            parameter.add_(PERTURBATION * torch.randn(parameter.shape, generator=generator))


def capture_off_sync(method, path, output_dir, result, **overrides):
    """A generation batch made by TRL's vLLM path while vLLM samples from the saved weights and the trainer scores
    with perturbed ones: the gap the correction exists for, made large by construction. Writes the batch, the
    perturbed weights (``rollout/``) and SIREN's anchor where there is one."""
    trainer = make_trainer(method, path, output_dir, reward=alternating_reward, **{**VLLM_OPTIONS, **overrides})
    perturbed(trainer)
    syncs = count_syncs(trainer)
    trainer.vllm_generation.sync_weights = lambda: syncs.append(trainer.state.global_step)
    batch = capture_generation_batch(trainer, ROWS)
    trainer.model.save_pretrained(os.path.join(output_dir, "rollout"))
    trainer.processing_class.save_pretrained(os.path.join(output_dir, "rollout"))
    anchors = [part.anchor for part in trainer.parts if hasattr(part, "anchor")]
    torch.save({"batch": batch, "anchors": anchors}, result)


@pytest.fixture(scope="module")
def captured(vllm_toy_path, tmp_path_factory):
    """One batch per importance-sampling mode, made by ERC's trainer (which keeps the rollout entropy)."""
    batches = {}
    for mode in IS_MODES:
        folder = str(tmp_path_factory.mktemp(f"capture_{mode}"))
        options = dict(
            vllm_importance_sampling_mode=mode,
            vllm_importance_sampling_clip_max=1.1,  # tight enough for the truncation or the mask to act
            vllm_importance_sampling_clip_min=0.9 if mode.endswith("mask") else None,
        )
        in_child(capture_off_sync, "erc", vllm_toy_path, folder, os.path.join(folder, "batch.pt"), **options)
        batches[mode] = torch.load(os.path.join(folder, "batch.pt"))["batch"]
    return batches


def chosen_settings(model, inputs, rewards, name):
    """The pair table's settings of ``name`` (its piece in ``tests/methods/``), with the thresholds it chooses from
    this batch's own values."""
    references = reference.references()
    settings = dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0)
    for declared in references.values():
        if name in declared.methods:
            settings |= declared.settings
    with torch.no_grad():
        log_probs, entropy, _ = reference.scores(model, inputs)
        advantages = reference.group_advantages(rewards, (name,), settings)
        advantages = reference.token_advantages(advantages, log_probs, entropy, (name,), settings)
    for choose in reference.stages((name,), "thresholds"):
        settings |= choose(log_probs, advantages, inputs["completion_mask"].double())
    return settings


@pytest.mark.filterwarnings("ignore:.*on-policy")
@pytest.mark.parametrize("mode", IS_MODES)
@pytest.mark.parametrize("name", CORRECTED_METHODS)
def test_the_captured_correction_reaches_each_methods_loss(name, mode, captured, vllm_toy_path, tmp_path):
    """On a batch vLLM generated, each method's loss and gradients are the float64 loss step with TRL's ratio
    multiplying each token's policy loss after the gates. The loss step runs with the saved weights, the batch's
    old log-probs are the perturbed rollout weights': the PPO ratio, the clip and the gates act too."""
    inputs = dict(captured[mode])
    ratio = inputs["importance_sampling_ratio"]
    clipped = (ratio == 0) if mode.endswith("mask") else (ratio == 1.1)
    assert clipped.any() and (ratio != 1).any()
    rewards = torch.tensor(alternating_reward(range(len(ROWS))))
    float64_model = AutoModelForCausalLM.from_pretrained(vllm_toy_path, dtype=torch.float64)
    settings = chosen_settings(float64_model, inputs, rewards, name)
    inputs["advantages"] = reference.group_advantages(rewards, (), settings).squeeze(1).float()  # as the pair table
    fields = combination([name]).config_class.__dataclass_fields__
    options = {key: value for key, value in settings.items() if key in fields}
    trainer = build_trainer(
        (EntropyGRPOTrainer, combination([name]).config_class),
        vllm_toy_path,
        None,
        tmp_path,
        entropy_control=[name],
        **options,
    )
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True  # as TRL's vLLM path sets them
    our_loss, our_grads = loss_and_gradients(trainer, inputs)
    loss = reference.combined_loss(float64_model, inputs, rewards, (name,), settings, sampling_ratio=ratio)
    loss.backward()
    torch.testing.assert_close(our_loss.double(), loss.detach(), rtol=1e-5, atol=1e-7)
    uncorrected = reference.combined_loss(float64_model, inputs, rewards, (name,), settings)
    assert abs(uncorrected.item() - loss.item()) > 1e-3 * abs(loss.item())  # the correction changes this loss
    for parameter_name, parameter in float64_model.named_parameters():
        expected = parameter.grad
        atol = max(1e-7, 1e-5 * expected.abs().max().item())
        torch.testing.assert_close(our_grads[parameter_name].double(), expected, rtol=1e-4, atol=atol)


# ---------------------------------------------------------------------------------------------------------------------
# The rollout entropy of a vLLM batch: the trainer's, at the rollout weights (vLLM returns log-probs only)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ROLLOUT_ENTROPY)
def test_the_rollout_entropy_is_the_trainers_at_the_rollout_weights_not_vllms(method, vllm_toy_path, tmp_path):
    in_child(capture_off_sync, method, vllm_toy_path, str(tmp_path), str(tmp_path / "batch.pt"))
    batch = torch.load(tmp_path / "batch.pt")["batch"]
    rollout = AutoModelForCausalLM.from_pretrained(tmp_path / "rollout", dtype=torch.float64)
    sampler = AutoModelForCausalLM.from_pretrained(vllm_toy_path, dtype=torch.float64)
    mask = batch["completion_mask"].bool()
    with torch.no_grad():
        _, expected, _ = reference.scores(rollout, batch)
        _, vllms, _ = reference.scores(sampler, batch)
    torch.testing.assert_close(batch["old_entropy"].double()[mask], expected[mask], rtol=1e-5, atol=1e-6)
    assert (vllms[mask] - expected[mask]).abs().max() > 100 * 1e-5  # the weights vLLM sampled with give another


def siren_anchor_of(path, output_dir, batch_file, result):
    """SIREN's anchor measured on ``batch_file`` by a trainer without vLLM on the weights at ``path``."""
    trainer = make_trainer("siren", path, output_dir, rollout=None)
    trainer.model.train()
    (part,) = [part for part in trainer.parts if hasattr(part, "anchor")]
    part.on_generation_batch(torch.load(batch_file)["batch"])
    torch.save(part.anchor, result)


def test_sirens_anchor_is_measured_at_the_rollout_weights(vllm_toy_path, tmp_path):
    in_child(capture_off_sync, "siren", vllm_toy_path, str(tmp_path), str(tmp_path / "batch.pt"))
    (anchor,) = torch.load(tmp_path / "batch.pt")["anchors"]
    for weights, name in ((tmp_path / "rollout", "rollout"), (vllm_toy_path, "sampler")):
        anchor_file = str(tmp_path / f"{name}_anchor.pt")
        in_child(siren_anchor_of, str(weights), str(tmp_path), str(tmp_path / "batch.pt"), anchor_file)
    assert anchor == pytest.approx(torch.load(tmp_path / "rollout_anchor.pt"), rel=1e-6)
    assert abs(anchor - torch.load(tmp_path / "sampler_anchor.pt")) > 1e-3
