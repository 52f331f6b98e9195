"""Shared fixtures: the offline toy model saved once per session, and hand-built GRPO micro-batches."""

import os

import pytest
import torch


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
# The toy models are tiny: one thread is as fast, and far faster when the cores are shared.
torch.set_num_threads(1)


# ---------------------------------------------------------------------------------------------------------------------
# Tiers by cost. Every test gets one of four markers: `pure` (pure functions, configs, source checks), `loss_step` (one
# loss step or scoring pass against float64 or trl.GRPOTrainer), `training` (short in-process training), `launch`
# (subprocesses and multi-process launches). A file's tier is that of its costliest in-process test; the launches
# are named one by one. `-m "not launch"` is the quick loop (README).
# ---------------------------------------------------------------------------------------------------------------------

FILE_TIERS = {
    "test_rewards.py": "pure",
    "test_layout.py": "pure",
    "test_kernel.py": "pure",
    "test_kernel_triton.py": "pure",
    "test_toy_sweep.py": "pure",
    "test_upstream_noise.py": "pure",
    "test_loss_types.py": "loss_step",
    "test_bad_input.py": "loss_step",
    "test_base_parity.py": "loss_step",
    "test_model_families.py": "loss_step",
    "test_adapo.py": "training",
    "test_aent.py": "training",
    "test_repo.py": "training",
    "test_cov.py": "training",
    "test_base.py": "training",
}
LAUNCHES = {
    "test_base.py": {
        "test_wheel_installs_kernels_inside_the_package",
        "test_a_plain_install_brings_neither_triton_nor_liger",
        "test_trl_entropy_train_runs_from_the_wheel_outside_the_clone",
    },
    "test_cov.py": {"test_two_processes_select_and_train_like_one"},
    "test_entropic.py": {"test_every_rank_holds_the_float64_replay_of_the_world_micro_batches"},
    "test_distributed.py": "all",
    "test_examples.py": {
        "test_train_runs_every_method",
        "test_train_yaml_config_and_command_line_override",
        "test_train_use_peft_trains_a_lora_adapter",
        "test_train_command_line_error_as_a_process",
        "test_train_real_model_on_a_local_math_dataset",
    },
    "test_kernel_triton.py": {"test_triton_interpreter_matches_float64"},
    "test_gpu_runbook.py": "all",
    "test_resume.py": {"test_two_process_mid_cycle_resume_equals_the_straight_run"},
    "test_resume_changes.py": {
        "test_kill_inside_the_optimizer_write_is_skipped_on_resume",
        "test_two_process_checkpoint_resumed_by_one_process_regenerates",
    },
    "test_report.py": {"test_without_matplotlib_the_report_and_the_demo_stop_naming_the_extra"},
    "test_trainer_api.py": {"test_liger_layer_kernels_keep_the_entropy_head"},
    "test_upstream_noise.py": {"test_a_short_run_prints_no_upstream_noise_and_our_warning_still_shows"},
}


def pytest_report_header(config):
    """The CPU numeric path: the toy policy's warm start, hence every sampled token, depends on it (README)."""
    return f"ATen CPU capability: {torch.backends.cpu.get_cpu_capability()} (ATEN_CPU_CAPABILITY to change it)"


def pytest_collection_modifyitems(config, items):
    for item in items:
        file = item.path.name
        launches = LAUNCHES.get(file, ())
        if launches == "all" or item.originalname in launches:
            tier = "launch"
        else:
            tier = FILE_TIERS.get(file, "training")
        item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def toy_tokenizer():
    from trl_entropy.toy import build_toy_tokenizer

    return build_toy_tokenizer()


@pytest.fixture(scope="session")
def toy_model_path(tmp_path_factory, toy_tokenizer):
    """A randomly initialised toy model saved to disk (loadable by path, so TRL can build a reference model)."""
    from trl_entropy.toy import build_toy_model

    path = tmp_path_factory.mktemp("toy_model")
    build_toy_model(toy_tokenizer, seed=0).save_pretrained(path)
    toy_tokenizer.save_pretrained(path)
    return str(path)


# The warm start is deterministic, so its result is cached across test sessions (keyed by the toy's format version).
TOY_CACHE = os.environ.get("TRL_ENTROPY_TEST_CACHE", os.path.join(os.path.dirname(__file__), ".toy_cache"))


@pytest.fixture(scope="session")
def warm_toy_policy_path(tmp_path_factory):
    """The warm-started toy policy (it sometimes succeeds), saved once for the whole session."""
    from trl_entropy.toy import build_toy_policy

    path = tmp_path_factory.mktemp("warm_toy_policy")
    model, tokenizer = build_toy_policy(seed=0, cache_dir=TOY_CACHE)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def make_grpo_batch(model, vocab_size, *, batch=4, prompt_len=5, completion_len=6, seed=0, old_noise=0.3, ref=True):
    """A GRPO micro-batch as ``_generate_and_score_completions`` returns it, with padding on both sides.

    The rollout and reference log-probs are the model's own (computed here from the full logits) plus noise, so the
    ratios fall on both sides of the clip range.
    """
    generator = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(4, vocab_size, (batch, prompt_len), generator=generator)
    prompt_mask = torch.ones(batch, prompt_len, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    completion_ids = torch.randint(4, vocab_size, (batch, completion_len), generator=generator)
    completion_mask = torch.ones(batch, completion_len, dtype=torch.long)
    completion_mask[1:2, 3:] = 0  # an early eos (rows that exist)
    completion_mask[2:3, 1:] = 0
    with torch.no_grad():
        input_ids = torch.cat([prompt_ids, completion_ids], 1)
        attention_mask = torch.cat([prompt_mask, completion_mask], 1)
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.double()
        log_probs = torch.log_softmax(logits[:, prompt_len - 1 : -1], -1)
        log_probs = log_probs.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1).float()
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.randn(batch, generator=generator),
        "num_items_in_batch": completion_mask.sum(),
    }
    if old_noise is not None:
        inputs["old_per_token_logps"] = log_probs + old_noise * torch.randn(log_probs.shape, generator=generator)
    if ref:
        inputs["ref_per_token_logps"] = log_probs + 0.2 * torch.randn(log_probs.shape, generator=generator)
    return inputs


# ---------------------------------------------------------------------------------------------------------------------
# Helpers shared by the method tests (imported as `from conftest import ...`)
# ---------------------------------------------------------------------------------------------------------------------


def toy_config(config_class, output_dir="unused", **options):
    """The one config builder of the tests: ``config_class`` on the CPU in fp32, logging nowhere, plus ``options``."""
    return config_class(**{"output_dir": str(output_dir), "report_to": [], "use_cpu": True, "bf16": False, **options})


# The micro-batch of the hand-driven loss-step tests: 4 completions of one prompt, at most 6 tokens.
SMALL_BATCH = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=6)


def build_trainer(trainer_class, config_class, path, tokenizer, output_dir, accumulation=1, **options):
    """A trainer on the toy model whose ``compute_loss`` the test drives by hand (fp32, CPU, train mode)."""
    from trl_entropy.toy import build_toy_dataset, toy_reward

    args = toy_config(config_class, output_dir, **SMALL_BATCH, gradient_accumulation_steps=accumulation, **options)
    trainer = trainer_class(
        model=path,
        reward_funcs=toy_reward,
        args=args,
        train_dataset=build_toy_dataset(8, seed=0),
        processing_class=tokenizer,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = accumulation
    # accelerate's gradient state is shared by every trainer of the process: start from the state a training step
    # starts from (the last micro-batch of a window), whatever an earlier test left.
    set_sync(trainer, True)
    return trainer


def set_sync(trainer, sync):
    """Mark the next micro-batch as the last of its accumulation window (True) or not."""
    trainer.accelerator.gradient_state._set_sync_gradients(sync)


def loss_and_gradients(trainer, inputs):
    """The loss of one ``compute_loss`` call and every parameter's gradient."""
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, dict(inputs))
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}


def naive_log_softmax(model, inputs):
    """Log-softmax of the full logits at the completion positions, in float64 (temperature 1)."""
    with torch.no_grad():
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.double()
    return torch.log_softmax(logits[:, inputs["prompt_ids"].size(1) - 1 : -1], -1)


def naive_log_probs(model, inputs):
    """Per-token log-probs of the sampled completion tokens, from the full logits in float64."""
    return naive_log_softmax(model, inputs).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)


def naive_entropy(model, inputs):
    """Per-token full entropy of the completion, from the full logits in float64."""
    log_probs = naive_log_softmax(model, inputs)
    return -(log_probs.exp() * log_probs).sum(-1)


def split_batch(inputs):
    """Two half micro-batches of a GRPO micro-batch (rows 0..B/2 and B/2..B)."""
    half = inputs["prompt_ids"].size(0) // 2
    halves = []
    for rows in (slice(0, half), slice(half, None)):
        part = {k: (v[rows] if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in inputs.items()}
        part["num_items_in_batch"] = inputs["num_items_in_batch"]
        halves.append(part)
    return halves


def varied_batch(model, vocab_size, seed):
    """A batch of 8 whose halves hold different numbers of valid tokens (so a mean of means would differ)."""
    inputs = make_grpo_batch(model, vocab_size, batch=8, seed=seed)
    inputs["completion_mask"][4 + seed % 4, 2:] = 0
    inputs["completion_mask"][5, 1:] = 0
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum()
    return inputs
