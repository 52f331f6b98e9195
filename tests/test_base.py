"""The base trainer's plumbing: validation, the controller window, checkpoints, diagnostics, packaging."""

import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import make_grpo_batch
from trl import GRPOConfig

from trl_entropy import Controller, EntropyGRPOConfig, EntropyGRPOTrainer
from trl_entropy._compat import check_trl_version
from trl_entropy.base import CONTROLLER_STATE_FILE
from trl_entropy.diagnostics import covariance_from_moments, covariance_moments, token_covariance
from trl_entropy.head import install_entropy_head
from trl_entropy.toy import build_toy_dataset, build_toy_model, toy_reward


ROOT = Path(__file__).resolve().parents[1]


def config(tmp_path, **options):
    defaults = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        report_to=[],
        use_cpu=True,
        bf16=False,
    )
    return EntropyGRPOConfig(**{**defaults, **options})


class RecordingController(Controller):
    """Records what the trainer hands it; its value counts the updates."""

    name = "recorder"
    statistic = "entropy"

    def __init__(self):
        self.calls = []

    def update(self, mean_statistic, step):
        self.calls.append((mean_statistic, step))

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = [tuple(call) for call in state["calls"]]

    def metrics(self):
        return {"recorder/updates": float(len(self.calls))}


class RecordingTrainer(EntropyGRPOTrainer):
    def build_controllers(self):
        return [RecordingController()]


def build(trainer_class, model, tokenizer, args):
    trainer = trainer_class(
        model=model,
        reward_funcs=toy_reward,
        args=args,
        train_dataset=build_toy_dataset(16),
        processing_class=tokenizer,
    )
    trainer.model.train()
    return trainer


# ---------------------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo", "luspo"])
def test_unsupported_loss_type_is_rejected(tmp_path, loss_type):
    with pytest.raises(ValueError, match=f"loss_type='{loss_type}'"):
        config(tmp_path, loss_type=loss_type)


@pytest.mark.parametrize(
    "field, value",
    [("entropy_kernel_backend", "cuda"), ("entropy_kernel_chunk_size", 0), ("entropy_kernel_chunk_size", -3)],
)
def test_invalid_kernel_options_are_rejected(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        config(tmp_path, **{field: value})


def test_plain_grpo_config_is_rejected(toy_model_path, toy_tokenizer, tmp_path):
    args = GRPOConfig(
        output_dir=str(tmp_path), report_to=[], use_cpu=True, per_device_train_batch_size=4, num_generations=4
    )
    with pytest.raises(TypeError, match="EntropyGRPOConfig"):
        EntropyGRPOTrainer(model=toy_model_path, reward_funcs=toy_reward, args=args, processing_class=toy_tokenizer)


def test_moe_load_balancing_loss_is_rejected(toy_tokenizer, tmp_path):
    from transformers import MixtralConfig, MixtralForCausalLM

    tiny = MixtralConfig(
        vocab_size=len(toy_tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_local_experts=2,
        num_experts_per_tok=1,
        router_aux_loss_coef=0.01,
    )
    with pytest.raises(ValueError, match="router_aux_loss_coef"):
        build(EntropyGRPOTrainer, MixtralForCausalLM(tiny), toy_tokenizer, config(tmp_path))


def test_models_the_head_cannot_score_are_rejected(toy_tokenizer):
    softcapped = build_toy_model(toy_tokenizer)
    softcapped.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        install_entropy_head(softcapped, temperature=1.0)
    headless = build_toy_model(toy_tokenizer)
    headless.get_output_embeddings = lambda: None
    with pytest.raises(ValueError, match="no output embedding"):
        install_entropy_head(headless, temperature=1.0)


@pytest.mark.parametrize(
    "installed, supported", [("1.16.0", True), ("1.16.3.dev0", True), ("1.15.2", False), ("1.17.0", False)]
)
def test_trl_version_guard(installed, supported):
    if supported:
        assert check_trl_version(installed) == installed
    else:
        with pytest.raises(ImportError, match=r"trl>=1\.16\.0,<1\.17\.0"):
            check_trl_version(installed)


# ---------------------------------------------------------------------------------------------------------------------
# Controller plumbing
# ---------------------------------------------------------------------------------------------------------------------


def float64_entropy_sums(model, inputs):
    """Σ m·H and Σ m of a micro-batch, from the full logits in float64."""
    prompt_len = inputs["prompt_ids"].size(1)
    with torch.no_grad():
        logits = model(
            input_ids=torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            attention_mask=torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
        ).logits.double()
    log_p = torch.log_softmax(logits[:, prompt_len - 1 : -1], -1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    mask = inputs["completion_mask"].double()
    return (entropy * mask).sum().item(), mask.sum().item()


def test_controller_sees_the_window_token_mean(toy_model_path, toy_tokenizer, tmp_path):
    trainer = build(RecordingTrainer, toy_model_path, toy_tokenizer, config(tmp_path, gradient_accumulation_steps=2))
    trainer.current_gradient_accumulation_steps = 2
    controller = trainer.controllers["recorder"]
    # Micro-batches with different token counts: a mean of the two means would differ from the token mean.
    first = make_grpo_batch(trainer.model, len(toy_tokenizer), seed=1)
    second = make_grpo_batch(trainer.model, len(toy_tokenizer), seed=2, batch=2)
    second["completion_mask"][1, 1:] = 0
    totals = [float64_entropy_sums(trainer.model, batch) for batch in (first, second)]
    trainer.state.global_step = 6
    trainer.accelerator.gradient_state._set_sync_gradients(False)
    trainer.compute_loss(trainer.model, first)
    assert controller.calls == []  # no update inside the window
    trainer.accelerator.gradient_state._set_sync_gradients(True)
    trainer.compute_loss(trainer.model, second)
    expected = sum(t[0] for t in totals) / sum(t[1] for t in totals)
    assert len(controller.calls) == 1
    mean, step = controller.calls[0]
    assert mean == pytest.approx(expected, rel=1e-6)
    assert step == 7  # the optimizer step the window completes
    assert trainer._metrics["train"]["recorder/updates"] == [1.0]
    # Evaluation never moves a controller.
    trainer.model.eval()
    trainer.compute_loss(trainer.model, first)
    assert len(controller.calls) == 1


def test_non_finite_statistic_holds_the_controller(toy_model_path, toy_tokenizer, tmp_path):
    trainer = build(RecordingTrainer, toy_model_path, toy_tokenizer, config(tmp_path))
    trainer.current_gradient_accumulation_steps = 1
    batch = make_grpo_batch(trainer.model, len(toy_tokenizer), seed=3)
    batch["completion_mask"].zero_()  # no valid token anywhere: the mean is undefined
    with pytest.warns(UserWarning, match="keeps its value"):
        loss = trainer.compute_loss(trainer.model, batch)
    assert trainer.controllers["recorder"].calls == []
    assert torch.isfinite(loss)
    loss.backward()  # an all-masked micro-batch stays connected to the graph


def test_controller_state_is_checkpointed_and_restored(warm_toy_policy_path, toy_tokenizer, tmp_path):
    args = config(tmp_path, max_steps=2, save_steps=1, per_device_train_batch_size=8, logging_steps=1)
    trainer = build(RecordingTrainer, warm_toy_policy_path, toy_tokenizer, args)
    trainer.train()
    calls = trainer.controllers["recorder"].calls
    assert [step for _, step in calls] == [1, 2]
    with open(os.path.join(tmp_path, "checkpoint-1", CONTROLLER_STATE_FILE)) as file:
        saved = json.load(file)
    assert saved["recorder"]["calls"] == [list(calls[0])]
    assert [entry["recorder/updates"] for entry in trainer.state.log_history if "recorder/updates" in entry] == [
        1.0,
        2.0,
    ]

    resumed = build(RecordingTrainer, warm_toy_policy_path, toy_tokenizer, args)
    resumed.train(resume_from_checkpoint=os.path.join(tmp_path, "checkpoint-1"))
    restored = resumed.controllers["recorder"].calls
    assert restored[0] == calls[0] and [step for _, step in restored] == [1, 2]

    os.remove(os.path.join(tmp_path, "checkpoint-1", CONTROLLER_STATE_FILE))
    with pytest.raises(FileNotFoundError, match=CONTROLLER_STATE_FILE):
        build(RecordingTrainer, warm_toy_policy_path, toy_tokenizer, args).train(
            resume_from_checkpoint=os.path.join(tmp_path, "checkpoint-1")
        )


# ---------------------------------------------------------------------------------------------------------------------
# Diagnostics
# ---------------------------------------------------------------------------------------------------------------------


def test_token_covariance_matches_the_definition():
    generator = torch.Generator().manual_seed(0)
    log_probs = -torch.rand(3, 5, generator=generator) * 4
    advantages = torch.randn(3, generator=generator)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]])
    valid = [(i, t) for i in range(3) for t in range(5) if mask[i, t]]
    mean_l = sum(float(log_probs[i, t]) for i, t in valid) / len(valid)
    mean_a = sum(float(advantages[i]) for i, t in valid) / len(valid)
    covariance = token_covariance(log_probs, advantages, mask)
    for i in range(3):
        for t in range(5):
            expected = (float(log_probs[i, t]) - mean_l) * (float(advantages[i]) - mean_a) if mask[i, t] else 0.0
            assert float(covariance[i, t]) == pytest.approx(expected, rel=1e-5, abs=1e-6)
    # The moments form gives the token mean of the same terms, and adds across micro-batches.
    expected_mean = sum(float(covariance[i, t]) for i, t in valid) / len(valid)
    assert covariance_from_moments(covariance_moments(log_probs, advantages, mask)) == pytest.approx(
        expected_mean, rel=1e-5
    )
    halves = covariance_moments(log_probs[:1], advantages[:1], mask[:1]) + covariance_moments(
        log_probs[1:], advantages[1:], mask[1:]
    )
    assert covariance_from_moments(halves) == pytest.approx(expected_mean, rel=1e-5)
    assert covariance_from_moments(torch.zeros(4, dtype=torch.float64)) == 0.0


def test_cov_logp_adv_is_logged(toy_model_path, toy_tokenizer, tmp_path):
    trainer = build(EntropyGRPOTrainer, toy_model_path, toy_tokenizer, config(tmp_path))
    trainer.current_gradient_accumulation_steps = 1
    batch = make_grpo_batch(trainer.model, len(toy_tokenizer), seed=4, old_noise=None)
    trainer.compute_loss(trainer.model, batch)
    prompt_len = batch["prompt_ids"].size(1)
    with torch.no_grad():
        logits = trainer.model(
            input_ids=torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
            attention_mask=torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1),
        ).logits.double()
    log_probs = torch.log_softmax(logits[:, prompt_len - 1 : -1], -1)
    log_probs = log_probs.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    mask = batch["completion_mask"].bool()
    sampled = log_probs[mask]
    advantages = batch["advantages"].double().unsqueeze(1).expand_as(log_probs)[mask]
    expected = ((sampled - sampled.mean()) * (advantages - advantages.mean())).mean().item()
    assert trainer._metrics["train"]["entropy/cov_logp_adv"] == [pytest.approx(expected, rel=1e-4, abs=1e-7)]


# ---------------------------------------------------------------------------------------------------------------------
# End to end and packaging
# ---------------------------------------------------------------------------------------------------------------------


def test_training_on_the_toy_task(warm_toy_policy_path, toy_tokenizer, tmp_path):
    args = config(tmp_path, max_steps=3, per_device_train_batch_size=8, logging_steps=1, max_completion_length=8)
    trainer = build(EntropyGRPOTrainer, warm_toy_policy_path, toy_tokenizer, args)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "entropy" in entry]
    assert len(logged) == 3
    for entry in logged:
        assert 0 < entry["entropy"] < math.log(len(toy_tokenizer))
        assert math.isfinite(entry["entropy/cov_logp_adv"])
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_wheel_installs_kernels_inside_the_package(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("trl_entropy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "trl_entropy/kernels/__init__.py" in names
    assert not any(name.startswith("kernels/") for name in names), (
        "a top-level `kernels` module would shadow HF kernels"
    )
    assert "trl_entropy/base.py" in names
