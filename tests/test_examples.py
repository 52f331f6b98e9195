"""examples/train.py (every --method, a YAML config, LoRA, the errors) and the entropy-collapse demo, on the toy task.

train.py runs as a subprocess, as a user runs it, with a one-step budget; the warm-started toy policy is built once
per session into a cache folder that every run shares.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trl_entropy.methods import METHODS, TOY_NUM_PROMPTS, TOY_TRAINING_DEFAULTS, get_method, toy_training_set


ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "train.py"
DEMO = ROOT / "examples" / "entropy_collapse_demo.py"
TINY = ["--max_steps", "1", "--per_device_train_batch_size", "8", "--num_generations", "4", "--logging_steps", "1"]
# A metric only the method logs: the run went through that method's trainer and settings.
METHOD_METRIC = {
    "grpo": "entropy/cov_logp_adv",
    "entreg": "entropy_coef",
    "aent": "aent/coef",
    "clip_cov": "clip_cov/detached_fraction",
    "kl_cov": "kl_cov/penalised_fraction",
    "repo_r": "repo/beta",
    "repo_d": "repo/beta",
    "adapo": "adapo/epsilon_high",
}


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def toy_cache(tmp_path_factory):
    """A toy-policy cache folder with the seed-0 policy already built (every run below loads it from there)."""
    from trl_entropy.toy import build_toy_policy

    cache = tmp_path_factory.mktemp("toy_policy_cache")
    build_toy_policy(seed=0, cache_dir=cache)
    return str(cache)


@pytest.fixture(scope="module")
def train_module():
    return load_module(TRAIN, "train_example")


def run_train(arguments: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_DISABLED="true")
    return subprocess.run(
        [sys.executable, str(TRAIN), *arguments], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def logged_metrics(output: str) -> dict[str, str]:
    """The last training log line the Trainer printed (a dict literal with the metrics)."""
    import ast

    logs = [ast.literal_eval(line) for line in output.splitlines() if line.startswith("{'loss'")]
    assert logs, output[-3000:]
    return logs[-1]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_train_runs_every_method(method, toy_cache, tmp_path):
    output_dir = tmp_path / "out"
    result = run_train(
        ["--method", method, *TINY, "--output_dir", str(output_dir), "--toy_policy_cache", toy_cache], tmp_path
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert (output_dir / "model.safetensors").exists()
    metrics = logged_metrics(result.stdout + result.stderr)
    assert METHOD_METRIC[method] in metrics, sorted(metrics)
    assert 0.0 < float(metrics["entropy"]) < 4.0  # a real entropy of a 47-token vocabulary, not a placeholder
    if method == "entreg":
        assert float(metrics["entropy_coef"]) == get_method("entreg").defaults["entropy_coef"]


def test_train_yaml_config_and_command_line_override(toy_cache, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "method": "aent",
                "aent_coef_init": 0.01,
                "aent_adaptive": False,
                "learning_rate": 1e-5,
                "lr_scheduler_type": "constant",
                "warmup_steps": 0,
            }
        )
    )
    output_dir = tmp_path / "out"
    arguments = ["--config", str(config), *TINY, "--output_dir", str(output_dir), "--toy_policy_cache", toy_cache]
    result = run_train([*arguments, "--learning_rate", "2e-5"], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = logged_metrics(result.stdout + result.stderr)
    assert float(metrics["aent/coef"]) == pytest.approx(0.01)  # from the YAML (and held: not adaptive)
    assert float(metrics["learning_rate"]) == pytest.approx(2e-5)  # the command line beats the YAML


def test_train_use_peft_trains_a_lora_adapter(toy_cache, tmp_path):
    output_dir = tmp_path / "out"
    lora = ["--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj"]
    result = run_train(
        ["--method", "repo_r", *TINY, *lora, "--output_dir", str(output_dir), "--toy_policy_cache", toy_cache],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    adapter = json.loads((output_dir / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8
    assert sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert (output_dir / "adapter_model.safetensors").exists()
    assert not (output_dir / "model.safetensors").exists()  # only the adapter was trained and saved


def test_train_unknown_method_is_a_clear_error(tmp_path):
    result = run_train(["--method", "ppo", "--output_dir", str(tmp_path / "out")], tmp_path)
    assert result.returncode != 0
    assert "unknown method 'ppo'" in result.stderr
    assert "grpo" in result.stderr and "repo_r" in result.stderr  # it lists the valid names


def test_train_unknown_method_in_yaml_is_a_clear_error(train_module, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("method: entropy_magic\n")
    with pytest.raises(ValueError, match="unknown method 'entropy_magic'"):
        train_module.build_parser(["--config", str(config)])


def test_train_entreg_without_coefficient_is_an_error(train_module, toy_cache, tmp_path):
    arguments = ["--method", "entreg", "--entropy_coef", "0", "--output_dir", str(tmp_path / "out")]
    with pytest.raises(ValueError, match="entreg needs --entropy_coef > 0 or --use_adaptive_entropy"):
        train_module.main([*arguments, "--toy_policy_cache", toy_cache])


def test_train_real_model_needs_a_dataset(train_module, toy_model_path, tmp_path):
    arguments = ["--model_name_or_path", toy_model_path, "--output_dir", str(tmp_path / "out"), "--use_cpu"]
    with pytest.raises(ValueError, match="needs --dataset_name"):
        train_module.main(arguments)


def test_train_toy_defaults_apply_only_without_a_model(train_module):
    _, toy_args, _ = train_module.build_parser(["--method", "repo_d"]).parse_args_and_config(
        args=["--method", "repo_d"]
    )
    for name, value in TOY_TRAINING_DEFAULTS.items():
        assert getattr(toy_args, name) == value, name
    assert toy_args.repo_variant == "D"
    real = ["--method", "grpo", "--model_name_or_path", "some/model", "--output_dir", "out", "--use_cpu"]
    _, real_args, model_args = train_module.build_parser(real).parse_args_and_config(args=real)
    assert real_args.learning_rate == 1e-6  # TRL's own default, not the toy recipe's
    assert model_args.model_name_or_path == "some/model"


def test_toy_training_set_repeats_a_fixed_pool():
    dataset = toy_training_set(5, 23, seed=3)
    assert len(dataset) == 25  # whole repetitions of the pool, at least the rows asked for
    prompts = dataset["prompt"]
    assert len(set(prompts)) == 5 and prompts[:5] * 5 == prompts
    with pytest.raises(ValueError, match="num_prompts must be between 1 and 320"):
        toy_training_set(321, 10)
    assert TOY_NUM_PROMPTS <= 320


def test_demo_produces_table_history_and_png(toy_cache, tmp_path, capsys):
    demo = load_module(DEMO, "entropy_collapse_demo")
    arguments = demo.DemoArguments(
        output_dir=str(tmp_path / "demo"), methods=["grpo", "aent"], max_steps=2, toy_policy_cache=toy_cache
    )
    summaries = demo.main(arguments)
    printed = capsys.readouterr().out
    table = printed[printed.index("run ") :]
    for header in ("H step 1", "H min", "H final", "reward last 10%", "held-out success", "wall s"):
        assert header in table
    assert table.count("\ngrpo ") == 1 and table.count("\naent ") == 1

    history = json.loads((tmp_path / "demo" / "history.json").read_text())
    assert list(history["histories"]) == ["grpo", "aent"]
    assert all(len(steps) == 2 for steps in history["histories"].values())
    assert history["runs"]["aent"]["settings"]["aent_entropy_low"] == 0.4  # examples/configs/aent.yaml
    for name, summary in summaries.items():
        entropies = [entry["entropy"] for entry in history["histories"][name]]
        assert summary["initial_entropy"] == entropies[0]
        assert summary["min_entropy"] == pytest.approx(min(entropies[0], (entropies[0] + entropies[1]) / 2))
        assert 0.0 <= summary["final_reward"] <= 1.0 and 0.0 <= summary["held_out_success"] <= 1.0
    # Both runs start from the same weights, prompts and seed: their first step is the same batch.
    assert summaries["grpo"]["initial_entropy"] == summaries["aent"]["initial_entropy"]
    assert (tmp_path / "demo" / "table.md").read_text().startswith("| run |")

    png = (tmp_path / "demo" / "entropy_collapse.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def test_demo_rejects_bad_runs(tmp_path):
    demo = load_module(DEMO, "entropy_collapse_demo")
    with pytest.raises(ValueError, match="unknown run 'nope'"):
        demo.main(demo.DemoArguments(output_dir=str(tmp_path), methods=["grpo", "nope"], toy_policy_cache=None))
    (tmp_path / "unfair.yaml").write_text("method: grpo\nlearning_rate: 0.1\n")
    with pytest.raises(ValueError, match=r"sets \['learning_rate'\], which the demo keeps equal"):
        demo.run_settings("unfair", demo.DemoArguments(configs_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="max_steps must be at least 1, got 0"):
        demo.DemoArguments(max_steps=0)


def test_moving_average_against_a_direct_sum():
    demo = load_module(DEMO, "entropy_collapse_demo")
    values = [0.5, 0.1, 0.9, 0.3, 0.7, 0.2]
    for window in (1, 2, 4, 10):
        expected = [
            sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
            for i in range(len(values))
        ]
        assert demo.moving_average(values, window) == pytest.approx(expected)


def write_jsonl(folder: Path, rows: list[dict]) -> str:
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(folder)


def test_train_real_model_on_a_local_math_dataset(toy_cache, tmp_path):
    """The --model_name_or_path path end to end, offline: a saved model with a chat template, a GSM8K-style dataset
    folder, the math answer reward, TRL's defaults instead of the toy recipe."""
    from trl_entropy.toy import build_toy_policy

    model, tokenizer = build_toy_policy(seed=0, cache_dir=toy_cache)
    tokenizer.chat_template = (
        "{% for message in messages %}{{ message['content'] | lower }}{% endfor %}"
        "{% if add_generation_prompt %}={% endif %}"
    )
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    rows = [
        {"question": f"What is {a}+{a + 1}?", "answer": f"{a}+{a + 1}={2 * a + 1}\n#### {2 * a + 1}"} for a in range(8)
    ]
    dataset = write_jsonl(tmp_path / "gsm", rows)
    output_dir = tmp_path / "out"
    arguments = ["--method", "aent", "--model_name_or_path", str(tmp_path / "model"), "--dataset_name", dataset]
    arguments += ["--use_cpu", "--bf16", "false", "--report_to", "none", "--max_completion_length", "8"]
    result = run_train([*arguments, *TINY, "--output_dir", str(output_dir)], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = logged_metrics(result.stdout + result.stderr)
    assert "rewards/math_answer_reward/mean" in metrics and "aent/coef" in metrics
    assert float(metrics["learning_rate"]) == pytest.approx(1e-6)  # TRL's default schedule, not the toy recipe's
    assert (output_dir / "model.safetensors").exists()


def test_real_math_dataset_reads_gsm8k_and_math_columns(train_module, tmp_path):
    gsm = write_jsonl(tmp_path / "gsm", [{"question": "What is 2+3?", "answer": "2+3=5\n#### 5"}])
    math = write_jsonl(tmp_path / "math", [{"problem": "Half of 1?", "solution": "It is $\\boxed{\\frac{1}{2}}$."}])
    other = write_jsonl(tmp_path / "other", [{"text": "no answer column"}])

    gsm_rows = train_module.real_math_dataset(train_module.TrainScriptArguments(dataset_name=gsm))
    assert gsm_rows[0]["prompt"] == [{"role": "user", "content": "What is 2+3?" + train_module.INSTRUCTION}]
    assert gsm_rows[0]["answer"] == "5"
    math_rows = train_module.real_math_dataset(train_module.TrainScriptArguments(dataset_name=math))
    assert math_rows[0]["answer"] == "\\frac{1}{2}"
    with pytest.raises(ValueError, match="reads 'question'/'answer'"):
        train_module.real_math_dataset(train_module.TrainScriptArguments(dataset_name=other))
