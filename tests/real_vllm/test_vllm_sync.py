"""The weight sync with a real vLLM engine (vLLM's CPU build, TRL's colocate mode), each run in a forked child: a
missing sync, vLLM's CPU packing left alone, LoRA's merged adapter, and a real pretrained model. The gap bounds are
those of ``test_vllm_training.py``."""

import pytest
import torch
from _support.distributed_run import make_trainer
from _support.vllm_engine import (
    GAP_BOUND,
    LEARNING_RATE,
    SMOLLM2_GAP_BOUND,
    VLLM_OPTIONS,
    alternating_reward,
    in_child,
    read,
    smollm2_prompts,
    train_and_record,
)


def test_a_missing_sync_takes_the_gap_far_past_the_bound(vllm_toy_path, tmp_path):
    """The planted bug the bound is there to catch: vLLM keeps sampling from the starting weights."""
    result = str(tmp_path / "run.json")
    in_child(train_and_record, "aent", vllm_toy_path, str(tmp_path), result, True, learning_rate=LEARNING_RATE)
    run = read(result)
    assert run["gap_max"][0] <= GAP_BOUND  # nothing has moved yet
    assert min(run["gap_max"][1:]) > 10 * GAP_BOUND, run["gap_max"]


def build_without_plain_weights(path, output_dir, result):
    """The trainer built as if trl_entropy left vLLM's CPU packing alone: the engine is refused, naming the layers;
    with that check removed too, TRL's first sync fails as it does for ``trl.GRPOTrainer``."""
    import contextlib

    from trl_entropy.core.trl import bridge

    bridge.plain_cpu_weights = lambda enabled: contextlib.nullcontext()
    errors = []
    try:
        make_trainer("aent", path, output_dir, reward=alternating_reward, **VLLM_OPTIONS)
    except RuntimeError as error:
        errors.append(str(error))
    bridge.check_plain_weights = lambda model: None
    trainer = make_trainer("aent", path, output_dir, reward=alternating_reward, **VLLM_OPTIONS)
    try:
        trainer.train()
    except AttributeError as error:
        errors.append(str(error))
    torch.save(errors, result)


def test_without_plain_weights_vllm_is_refused_and_trls_sync_would_fail(vllm_toy_path, tmp_path):
    result = str(tmp_path / "errors.pt")
    in_child(build_without_plain_weights, vllm_toy_path, str(tmp_path), result)
    refused, sync_failure = torch.load(result)
    assert "packed the weights of model.embed_tokens, model.layers.0.self_attn.qkv_proj" in refused
    assert "'Parameter' object has no attribute 'weight_loader'" in sync_failure


# ---------------------------------------------------------------------------------------------------------------------
# LoRA, and a real pretrained model
# ---------------------------------------------------------------------------------------------------------------------


def test_lora_trains_with_vllm_and_the_merged_adapter_reaches_the_engine(vllm_toy_path, tmp_path):
    from peft import LoraConfig

    result = str(tmp_path / "run.json")
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM")
    in_child(
        train_and_record,
        "aent",
        vllm_toy_path,
        str(tmp_path),
        result,
        learning_rate=LEARNING_RATE,
        trainer_kwargs={"peft_config": lora},
    )
    run = read(result)
    assert run["moved"] > 0.05 and max(run["gap_max"]) <= GAP_BOUND, run


@pytest.mark.parametrize("method", ["grpo", "aent"])
def test_smollm2_trains_with_vllm_within_its_gap_bound(method, smollm2_path, tmp_path):
    result = str(tmp_path / "run.json")
    in_child(
        train_and_record,
        method,
        smollm2_path,
        str(tmp_path),
        result,
        learning_rate=1e-3,
        max_completion_length=16,
        vllm_max_model_length=256,
        train_dataset=smollm2_prompts(),
    )
    run = read(result)
    assert run["steps"] == 3 and run["moved"] > 1e-3
    assert max(run["gap_max"]) <= SMOLLM2_GAP_BOUND, run["gap_max"]
