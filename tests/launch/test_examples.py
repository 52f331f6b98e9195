"""examples/train.py, the same program as `trl-entropy train` (every --method, a YAML config, LoRA, the errors, --help,
precision, output folders), and the entropy-collapse demo (trl_entropy.demo), on the toy task.

Training runs go through a subprocess, as a user runs the script, with a one-step budget; the warm-started toy policy
comes from the test suite's persistent cache. Command-line errors run in this process (`main` exits through argparse,
exactly as the script does) and two of them also as a real process, to check what the user sees.
"""

import dataclasses
import json
import math
import os
import re
import sys
import warnings
from pathlib import Path

import pytest
import yaml
from _support.grpo import ONE_STEP_RUN, TOY_CACHE
from _support.methods import METHOD_METRIC
from _support.watchdog import run_watched

import trl_entropy.scripts.train as train_script
import trl_entropy.scripts.train_arguments as train_arguments
from trl_entropy import EntropyGRPOConfig
from trl_entropy.demo.arguments import DemoArguments, run_settings
from trl_entropy.demo.run import run_demo, write_outputs
from trl_entropy.demo.summary import interval_summaries
from trl_entropy.methods import METHODS, get_method
from trl_entropy.report import write_report
from trl_entropy.toy import TOY_NUM_PROMPTS, TOY_TRAINING_DEFAULTS, cpu_path, toy_training_set


ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "train.py"


@pytest.fixture(scope="session")
def toy_cache():
    """The test suite's toy-policy cache with the seed-0 policy built (every run below loads it from there)."""
    from trl_entropy.toy import build_toy_policy

    build_toy_policy(seed=0, cache_dir=TOY_CACHE)
    return str(TOY_CACHE)


def logged_metrics(output: str) -> dict[str, str]:
    """The last training log line the Trainer printed (a dict literal with the metrics)."""
    import ast

    logs = [ast.literal_eval(line) for line in output.splitlines() if line.startswith("{'loss'")]
    assert logs, output[-3000:]
    return logs[-1]


# One launch runs examples/train.py as a script (run as __main__, exactly as from the command line) once per case, in
# one interpreter: the imports are paid once, and lightened as a test process's are (`_support/process.py`: every
# training run starts with a full garbage collection, 0.5 s over the imported objects). Each case's output is
# delimited by a header line on both streams.
CLI_DRIVER = """
import json, pathlib, runpy, sys, traceback
train, runs, results, tests = sys.argv[1:]
sys.path.append(tests)
import trl_entropy.scripts.train  # what train.py runs
from _support.process import lighten
lighten()
status = {}
for name, arguments in json.load(open(runs)):
    for stream in (sys.stdout, sys.stderr):
        print(f"=== train.py case {name} ===", file=stream, flush=True)
    sys.argv = [train, *arguments]
    try:
        runpy.run_path(train, run_name="__main__")
        status[name] = 0
    except SystemExit as exit:
        status[name] = exit.code or 0
    except BaseException:
        traceback.print_exc()
        status[name] = 1
    if name.startswith("real:"):  # the saved weights of a real model are listed with their sizes, then freed
        output = pathlib.Path(arguments[arguments.index("--output_dir") + 1])
        status["saved " + name] = {p.name: p.stat().st_size for p in output.glob("*")} if output.is_dir() else {}
        for weights in output.glob("*.safetensors"):
            weights.unlink()
with open(results, "w") as file:
    json.dump(status, file)
"""


def write_yaml_case(folder: Path, toy_cache: str) -> list[str]:
    """A YAML config whose learning rate the command line overrides."""
    config = folder / "run.yaml"
    values = {"method": "aent", "aent_coef_init": 0.01, "aent_adaptive": False, "learning_rate": 1e-5}
    config.write_text(yaml.safe_dump({**values, "lr_scheduler_type": "constant", "warmup_steps": 0}))
    output_dir = folder / "out_yaml"
    return [
        "--config",
        str(config),
        *ONE_STEP_RUN,
        "--output_dir",
        str(output_dir),
        "--toy_policy_cache",
        toy_cache,
        "--learning_rate",
        "2e-5",
    ]


def write_real_model_case(folder: Path, toy_cache: str) -> list[str]:
    """A saved model with a chat template and a GSM8K-style dataset folder, for the --model_name_or_path path."""
    from trl_entropy.toy import build_toy_policy

    model, tokenizer = build_toy_policy(seed=0, cache_dir=toy_cache)
    tokenizer.chat_template = (
        "{% for message in messages %}{{ message['content'] | lower }}{% endfor %}"
        "{% if add_generation_prompt %}={% endif %}"
    )
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    rows = [
        {"question": f"What is {a}+{a + 1}?", "answer": f"{a}+{a + 1}={2 * a + 1}\n#### {2 * a + 1}"} for a in range(8)
    ]
    dataset = write_jsonl(folder / "gsm", rows)
    arguments = ["--method", "aent", "--model_name_or_path", str(folder / "model"), "--dataset_name", dataset]
    arguments += ["--use_cpu", "--report_to", "none", "--max_completion_length", "8"]
    return [*arguments, *ONE_STEP_RUN, "--output_dir", str(folder / "out_real")]


def write_image_questions(folder: Path, rows: int = 8) -> str:
    """A MATH-style image-question dataset folder (``problem``, ``solution`` and the image in ``picture``), as
    parquet: the format that keeps the images."""
    from _support.vlm import image
    from datasets import Dataset

    folder.mkdir()
    questions = {
        "problem": [f"What is {a}+{a + 1}?" for a in range(rows)],
        "solution": [f"It is $\\boxed{{{2 * a + 1}}}$." for a in range(rows)],
        "picture": [image(a) for a in range(rows)],
    }
    Dataset.from_dict(questions).to_parquet(str(folder / "train.parquet"))
    return str(folder)


def write_real_vlm_case(folder: Path) -> list[str]:
    """A saved tiny LLaVA with its processor and an image-question dataset folder, for --dataset_image_column."""
    from _support.vlm import build_vlm

    model, processor = build_vlm("llava")
    model.save_pretrained(folder / "vlm")
    processor.save_pretrained(folder / "vlm")
    dataset = write_image_questions(folder / "image_questions")
    arguments = ["--method", "aent", "--model_name_or_path", str(folder / "vlm"), "--dataset_name", dataset]
    arguments += ["--dataset_image_column", "picture", "--use_cpu", "--report_to", "none"]
    return [*arguments, "--max_completion_length", "8", *ONE_STEP_RUN, "--output_dir", str(folder / "out_vlm")]


LORA = ["--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj"]
CONFIGS = ROOT / "examples" / "configs"


def real_model_yaml_case(method: str, smollm2_path: str, folder: Path) -> list[str]:
    """``method`` from its YAML config on the real pretrained model and the chat arithmetic task: one optimizer step
    of 4 completions of one prompt, at most 6 tokens each (the command line overrides the toy sizes of the YAML), with
    no checkpoint beside the final model (a real model's optimizer state is over a gigabyte per method)."""
    arguments = ["--config", str(CONFIGS / f"{method}.yaml"), "--model_name_or_path", smollm2_path]
    arguments += ["--chat_arithmetic_digits", "1", "--use_cpu", "--report_to", "none", *ONE_STEP_RUN]
    arguments += ["--per_device_train_batch_size", "4", "--max_completion_length", "6", "--save_strategy", "no"]
    return [*arguments, "--output_dir", str(folder / f"real_{method}")]


@pytest.fixture(scope="module")
def cli_runs(toy_cache, smollm2_path, tmp_path_factory):
    """Every command-line case of train.py in one launch: ``{case: (folder, exit status, stdout, stderr)}``. The cases:
    every registered method (``method:<name>``), and each from its YAML config on the real pretrained model
    (``real:<name>``), a YAML config with a command-line override, LoRA, a saved model on a local math dataset, a
    vision-language model on local image questions, and the errors of ``CLI_ERRORS`` run as a process
    (``error:<case>``)."""
    folder = tmp_path_factory.mktemp("cli")
    runs = [(f"method:{m}", ["--method", m, *ONE_STEP_RUN, "--toy_policy_cache", toy_cache]) for m in sorted(METHODS)]
    runs += [(f"real:{m}", real_model_yaml_case(m, smollm2_path, folder)) for m in sorted(METHODS)]
    runs.append(("yaml", write_yaml_case(folder, toy_cache)))
    runs.append(("lora", ["--method", "repo_r", *ONE_STEP_RUN, *LORA, "--toy_policy_cache", toy_cache]))
    runs.append(("real_model", write_real_model_case(folder, toy_cache)))
    runs.append(("real_vlm", write_real_vlm_case(folder)))
    runs += [(f"error:{case}", fill(CLI_ERRORS[case][0], folder, "")) for case in PROCESS_ERRORS]
    (folder / "runs.json").write_text(json.dumps(runs))
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_DISABLED="true")
    command = [sys.executable, "-c", CLI_DRIVER, str(TRAIN), "runs.json", "status.json", str(ROOT / "tests")]
    launched = run_watched(command, "the train.py cases (stdout's last names the one running)", cwd=folder, env=env)
    status = json.loads((folder / "status.json").read_text()) if (folder / "status.json").exists() else {}

    def parts(text):
        sections = re.split(r"^=== train\.py case (\S+(?: \S+)*) ===$", text, flags=re.MULTILINE)
        return dict(zip(sections[1::2], sections[2::2], strict=True))

    stdout, stderr = parts(launched.stdout), parts(launched.stderr)
    cases = {
        name: (folder, status.get(name, launched.returncode or 1), stdout.get(name, ""), stderr.get(name, ""))
        for name, _ in runs
    }
    return cases | {name: saved for name, saved in status.items() if name.startswith("saved ")}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_train_runs_every_method(method, cli_runs):
    folder, status, stdout, stderr = cli_runs[f"method:{method}"]
    assert status == 0, stderr[-4000:]
    output_dir = folder / "outputs" / f"{method}-toy"  # the default folder, relative to where the user runs it
    assert (output_dir / "model.safetensors").exists()
    assert json.loads((output_dir / "trainer_state.json").read_text())["log_history"]  # what the run report reads
    assert f"saved the model to outputs/{method}-toy" in stderr
    # Known upstream noise stays out of the output (the script filters it); anything else would show here.
    assert "FutureWarning" not in stderr and "Setting accelerator to CPU" not in stderr
    assert "Traceback" not in stderr
    metrics = logged_metrics(stdout + stderr)
    assert METHOD_METRIC[method] in metrics, sorted(metrics)
    assert 0.0 < float(metrics["entropy"]) < 4.0  # a real entropy of a 47-token vocabulary, not a placeholder
    if method == "entreg":
        assert float(metrics["entropy_coef"]) == get_method("entreg").defaults["entropy_coef"]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_trains_the_real_model_from_its_yaml(method, cli_runs):
    """``trl-entropy train --config examples/configs/<method>.yaml`` on SmolLM2-135M-Instruct and the chat task: the
    method's own metric is logged, the loss and entropy are finite, the entropy a real one of a 49,152-token
    vocabulary, and the trained model saved."""
    _, status, stdout, stderr = cli_runs[f"real:{method}"]
    assert status == 0, stderr[-4000:]
    assert "Traceback" not in stderr
    metrics = logged_metrics(stdout + stderr)
    assert METHOD_METRIC[method] in metrics, sorted(metrics)
    assert "rewards/stated_answer_reward/mean" in metrics
    assert math.isfinite(float(metrics["loss"]))
    assert 0.0 < float(metrics["entropy"]) < math.log(49152)
    # The run saved the whole model (135M float32 weights), not a stub; the test frees them once listed.
    assert cli_runs[f"saved real:{method}"].get("model.safetensors", 0) > 4 * 130e6


def test_train_yaml_config_and_command_line_override(cli_runs):
    _, status, stdout, stderr = cli_runs["yaml"]
    assert status == 0, stderr[-4000:]
    metrics = logged_metrics(stdout + stderr)
    assert float(metrics["aent/coef"]) == pytest.approx(0.01)  # from the YAML (and held: not adaptive)
    assert float(metrics["learning_rate"]) == pytest.approx(2e-5)  # the command line beats the YAML


def test_train_use_peft_trains_a_lora_adapter(cli_runs):
    folder, status, _, stderr = cli_runs["lora"]
    assert status == 0, stderr[-4000:]
    output_dir = folder / "outputs" / "repo_r-toy-lora"  # never the full model's default folder
    assert "saved the LoRA adapter to outputs/repo_r-toy-lora" in stderr
    adapter = json.loads((output_dir / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8
    assert sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert (output_dir / "adapter_model.safetensors").exists()
    assert not (output_dir / "model.safetensors").exists()  # only the adapter was trained and saved


METHOD_NAMES = ", ".join(METHODS)
# (command line, what stderr says). `{tmp}` is a fresh folder holding `list.yaml` (a YAML list), `ppo.yaml`
# (`method: ppo`) and `aent.yaml` (an AEnt setting); `{model}` is a saved toy model.
CLI_ERRORS = {
    "unknown method": (
        ["--method", "ppo"],
        f"argument --method: unknown method 'ppo'; choose one of {METHOD_NAMES}, or several joined by '+'",
    ),
    "unknown method in the YAML": (
        ["--config", "{tmp}/ppo.yaml"],
        f"argument --method: unknown method 'ppo' (in {{tmp}}/ppo.yaml); choose one of {METHOD_NAMES}, or several "
        "joined by '+'",
    ),
    "missing config file": (["--config", "{tmp}/nope.yaml"], "argument --config: no config file at {tmp}/nope.yaml"),
    "config not a mapping": (
        ["--config", "{tmp}/list.yaml"],
        "argument --config: {tmp}/list.yaml must hold option names and values (a YAML mapping)",
    ),
    "YAML key of another method": (
        ["--config", "{tmp}/aent.yaml", "--method", "grpo"],
        "argument --config: {tmp}/aent.yaml sets aent_coef_lr, which --method grpo lacks",
    ),
    "unknown option": (["--method", "aent", "--aent_coef", "1"], "unrecognized arguments: --aent_coef 1"),
    "bad config value": (["--method", "aent", "--aent_clamp_fraction", "1.5"], "aent_clamp_fraction"),
    "entreg without a coefficient": (
        ["--method", "entreg", "--entropy_coef", "0"],
        "--method entreg needs --entropy_coef > 0 or --use_adaptive_entropy",
    ),
    "missing model folder": (["--model_name_or_path", "{tmp}/no_model"], "no model at {tmp}/no_model: no such folder"),
    "folder without a model": (["--model_name_or_path", "{tmp}"], "no model at {tmp}: the folder has no config.json"),
    "model name not on the Hub (offline)": (
        ["--model_name_or_path", "nobody/no-such-model"],
        "no model at nobody/no-such-model: no such folder, and not a model on the Hugging Face Hub",
    ),
    "model without a dataset": (
        ["--model_name_or_path", "{model}"],
        "--model_name_or_path needs --dataset_name (a math dataset with verifiable answers)",
    ),
    "chat arithmetic without a model": (
        ["--chat_arithmetic_digits", "1"],
        "--chat_arithmetic_digits needs --model_name_or_path (an instruct model with a chat template)",
    ),
    "a dataset and the chat arithmetic task": (
        ["--model_name_or_path", "{model}", "--dataset_name", "{tmp}", "--chat_arithmetic_digits", "1"],
        "--dataset_name and --chat_arithmetic_digits each name the task to train on: give one",
    ),
    "chat arithmetic digits out of range": (
        ["--chat_arithmetic_digits", "4"],
        "chat_arithmetic_digits must be from 1 to 3 (digits of each operand), got 4",
    ),
    "bf16 without a GPU": (
        ["--model_name_or_path", "{model}", "--bf16"],
        "--bf16 needs a GPU with bf16 support and this machine has none: leave --bf16 out to train in fp32, or add "
        "--use_cpu to train in bf16 on the CPU",
    ),
}


def fill(arguments: list[str], tmp_path: Path, model: str) -> list[str]:
    return [argument.format(tmp=tmp_path, model=model) for argument in arguments]


@pytest.fixture
def error_case_folder(tmp_path):
    (tmp_path / "list.yaml").write_text("- method\n- aent\n")
    (tmp_path / "ppo.yaml").write_text("method: ppo\n")
    (tmp_path / "aent.yaml").write_text("method: aent\naent_coef_lr: 1.0\n")
    return tmp_path


@pytest.mark.parametrize("case", list(CLI_ERRORS))
def test_train_command_line_errors(case, error_case_folder, toy_model_path, capsys, monkeypatch):
    """A usage line and one message, exit status 2, before anything is loaded or trained (as on a machine without a
    GPU, whatever this one has)."""
    monkeypatch.setattr(train_arguments, "bf16_accelerator_available", lambda: False)
    arguments, message = CLI_ERRORS[case]
    with pytest.raises(SystemExit) as exit_info:
        train_script.main(fill(arguments, error_case_folder, toy_model_path))
    assert exit_info.value.code == 2
    printed = capsys.readouterr()
    assert printed.err.startswith("usage: ") and printed.out == ""
    assert f"error: {message.format(tmp=error_case_folder)}" in printed.err
    assert "training in fp32" not in printed.err  # the precision notice waits until the run really starts


PROCESS_ERRORS = ("unknown method", "missing model folder")


@pytest.mark.parametrize("case", PROCESS_ERRORS)
def test_train_command_line_error_as_a_process(case, cli_runs):
    folder, status, _, stderr = cli_runs[f"error:{case}"]
    assert status == 2
    assert "Traceback" not in stderr
    assert stderr.splitlines()[-1] == f"train.py: error: {CLI_ERRORS[case][1].format(tmp=folder)}"


# (extra flags, bf16 GPU present, bf16 in the config, the notice); a real model path, so TRL's own defaults apply.
PRECISION = [
    ([], False, False, "train.py: no GPU with bf16 support here: training in fp32 (TRL's default, bf16, is for GPUs)"),
    (["--use_cpu"], True, False, "train.py: --use_cpu: training in fp32 (TRL's default, bf16, is for GPUs)"),
    (["--bf16", "--use_cpu"], False, True, None),  # `--bf16` alone means true
    (["--bf16", "false"], False, False, None),
]


@pytest.mark.parametrize(("flags", "gpu", "bf16", "notice"), PRECISION)
def test_train_precision_without_a_bf16_gpu(flags, gpu, bf16, notice, toy_model_path, monkeypatch):
    monkeypatch.setattr(train_arguments, "bf16_accelerator_available", lambda: gpu)
    arguments = ["--model_name_or_path", toy_model_path, *flags]
    parser, _, training_args, _ = train_arguments.parse_arguments(arguments, prog="train.py")
    assert training_args.bf16 is bf16
    assert parser.notices == ([notice] if notice else [])


OUTPUT_DIRS = [
    (["--method", "aent"], "outputs/aent-toy"),
    (["--method", "aent", "--use_peft"], "outputs/aent-toy-lora"),
    (["--config", "examples/configs/aent.yaml"], "outputs/aent-toy"),
    (["--config=examples/configs/clip_low.yaml"], "outputs/grpo-clip_low-toy"),
    (
        ["--method", "kl_cov", "--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct/"],
        "outputs/kl_cov-Qwen2.5-0.5B-Instruct",
    ),
    (["--method", "aent", "--output_dir", "mine"], "mine"),
]


@pytest.mark.parametrize(("arguments", "output_dir"), OUTPUT_DIRS)
def test_train_default_output_dir_per_kind_of_run(arguments, output_dir, monkeypatch):
    monkeypatch.chdir(ROOT)
    _, _, training_args, _ = train_arguments.parse_arguments(arguments)
    assert training_args.output_dir == output_dir


def test_examples_hide_only_known_upstream_warnings(tmp_path):
    """The real upstream deprecation warning (TRL's config construction) is hidden; the same words under another
    category, and any other message, still show."""
    message = "`gradient_checkpointing` is deprecated"
    with warnings.catch_warnings(record=True) as before:
        warnings.simplefilter("always")
        EntropyGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    assert any(message in str(item.message) and item.category is FutureWarning for item in before)
    with warnings.catch_warnings(record=True) as after:
        warnings.simplefilter("always")
        train_script.hide_known_upstream_noise()
        EntropyGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])
        warnings.warn(message, UserWarning, stacklevel=1)
        warnings.warn("clip_cov_ratio has no effect", FutureWarning, stacklevel=1)
    assert not any(message in str(item.message) and item.category is FutureWarning for item in after)
    assert [str(item.message) for item in after if item.category in (UserWarning, FutureWarning)][-2:] == [
        message,
        "clip_cov_ratio has no effect",
    ]


@pytest.mark.parametrize("method", list(METHODS))
def test_train_help_shows_the_method_first(method, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_script.main(["--method", method, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    titles = [line for line in text.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert titles[:2] == [
        "choose the method:",
        f"{method}: {METHODS[method].description} ({METHODS[method].config_class.__name__}):",
    ]
    assert titles[-1] == "training (TRL's GRPOConfig and transformers' TrainingArguments):"
    sections = {title: text[text.index(title) :] for title in titles}
    first = sections[titles[0]][: sections[titles[0]].index(titles[1])]
    assert "--method" in first and "--config FILE.yaml" in first
    own = sections[titles[1]][: sections[titles[1]].index(titles[2])]
    # The method's own options: its config's fields that EntropyGRPOConfig lacks, and the registry's settings for it.
    base = {item.name for item in dataclasses.fields(EntropyGRPOConfig)}
    expected = [item.name for item in dataclasses.fields(METHODS[method].config_class) if item.name not in base]
    for name in [*expected, *METHODS[method].defaults]:
        assert f"  --{name} " in own, name
    # Every option of the parser is listed exactly once (an option's line starts with its first flag).
    listed = [line.split()[0].rstrip(",") for line in text.splitlines() if line.startswith("  -")]
    parser = train_arguments.build_parser(["--method", method])
    assert sorted(listed) == sorted(action.option_strings[0] for action in parser._actions)


def test_train_toy_defaults_apply_only_without_a_model():
    _, _, toy_args, _ = train_arguments.parse_arguments(["--method", "repo_d"])
    for name, value in TOY_TRAINING_DEFAULTS.items():
        assert getattr(toy_args, name) == value, name
    assert toy_args.repo_variant == "D"
    real = ["--method", "grpo", "--model_name_or_path", "some/model", "--output_dir", "out", "--use_cpu"]
    _, _, real_args, model_args = train_arguments.parse_arguments(real)
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
    arguments = DemoArguments(
        output_dir=str(tmp_path / "demo"), methods=["grpo", "aent"], max_steps=2, toy_policy_cache=toy_cache
    )
    summaries = run_demo(arguments)
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
    # table.md: what the intervals cover, then the tables (with intervals first).
    assert "):\n\n| run | H final | Δ H final vs grpo |" in (tmp_path / "demo" / "table.md").read_text()

    png = (tmp_path / "demo" / "entropy_collapse.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000

    # What the numbers came from: the CPU and the numeric path its kernels took.
    assert history["versions"]["aten_cpu_capability"] == cpu_path() and history["versions"]["cpu_model"]
    # Each job's held-out evaluation keeps every problem's count; its pass@1 is their mean fraction, and its
    # trainer_state.json logs the same pass@k for `trl-entropy report`.
    jobs = [("start", 0, history["initial_evaluations"]["0"])] + [
        (name, int(phase), run) for name, phases in history["all_seeds"]["0"].items() for phase, run in phases.items()
    ]
    assert len(jobs) == 5
    for name, phase, run in jobs:
        task = "-" if phase == 2 else "+"
        assert all(len(counts) == 80 and 0 <= min(counts) and max(counts) <= 16 for counts in run["correct"].values())
        assert run["pass_at_k"][task]["1"] == pytest.approx(sum(run["correct"][task]) / (80 * 16), abs=1e-12)
        folder = tmp_path / "demo" / "seed0" / (name if phase == 0 else f"{name}/phase{phase}")
        state = json.loads((folder / "trainer_state.json").read_text())
        assert state["global_step"] == (2 if phase else 0)
        assert {key: value for key, value in state["log_history"][-1].items() if key.startswith("eval/pass@")} == {
            f"eval/pass@{k}": value for k, value in run["pass_at_k"][task].items()
        }
    report = write_report(tmp_path / "demo")
    assert [run.name for run in report.runs] == ["seed0/start", "grpo/phase1", "aent/phase1"]
    assert "pass@k against k (last evaluation)" in report.panels

    # The tables say what one seed can show, and come back the same from history.json alone.
    table = (tmp_path / "demo" / "table.md").read_text()
    assert table.startswith("Means and 95 % intervals (one seed:") and "needs --full (5 seeds)" in table
    assert "| Δ pass@16 vs grpo |" in table
    (tmp_path / "demo" / "table.md").unlink()
    again = write_outputs(str(tmp_path / "demo" / "history.json"))
    assert json.dumps(again, sort_keys=True) == json.dumps(summaries, sort_keys=True)  # NaN laws compare equal
    assert (tmp_path / "demo" / "table.md").read_text() == table


def hand_made_run(entropies: list[float], rewards: list[float], counts_a: list[int], counts_b: list[int]) -> dict:
    """One seed's phases as the demo's jobs return them: a history, the held-out counts (4 samples each)."""
    history = [{"entropy": h, "reward": r} for h, r in zip(entropies, rewards)]
    phase = {"history": history, "law": None, "wall_time_s": 1.0, "cpu_time_s": 1.0}
    pass_at = {"+": {"1": sum(counts_a) / 4 / len(counts_a)}, "-": {"1": sum(counts_b) / 4 / len(counts_b)}}
    phase |= {"pass_at_k": pass_at, "correct": {"+": counts_a, "-": counts_b}}
    return {"1": phase, "2": phase}


def test_demo_intervals_are_the_bootstrap_of_each_problem_and_seed():
    from trl_entropy.evaluation import bootstrap_difference, bootstrap_mean

    counts = {"grpo": [[0, 1, 4], [2, 0, 0]], "repo_r": [[1, 1, 4], [3, 0, 2]]}
    runs = {
        name: [
            hand_made_run([0.5, 0.2 + index / 10], [0.0, 0.5], per_seed, per_seed[::-1])
            for index, per_seed in enumerate(seeds)
        ]
        for name, seeds in counts.items()
    }
    intervals = interval_summaries(runs, num_samples=4, smoothing=1)
    fractions = {name: [[c / 4 for c in per_seed] for per_seed in seeds] for name, seeds in counts.items()}
    solved = {name: [[float(c > 0) for c in per_seed] for per_seed in seeds] for name, seeds in counts.items()}
    assert intervals["repo_r"]["pass@1"] == (
        bootstrap_mean(fractions["repo_r"]),
        bootstrap_difference(fractions["repo_r"], fractions["grpo"]),
    )
    assert intervals["repo_r"]["pass@4"][0] == bootstrap_mean(solved["repo_r"])
    assert intervals["grpo"]["b_end"] == (bootstrap_mean([per_seed[::-1] for per_seed in fractions["grpo"]]), None)
    # Per run: the last value of the 1-step moving average, one per seed.
    interval, expected = intervals["repo_r"]["final_entropy"][0], bootstrap_mean([0.2, 0.3])
    assert (interval.mean, interval.low, interval.high) == pytest.approx((expected.mean, expected.low, expected.high))
    single = interval_summaries({name: seeds[:1] for name, seeds in runs.items()}, 4, 1)
    interval, difference = single["repo_r"]["final_entropy"]
    assert interval.mean == pytest.approx(0.2) and math.isnan(interval.low) and math.isnan(interval.high)
    assert difference.mean == pytest.approx(0.0) and math.isnan(difference.low) and math.isnan(difference.high)


def test_demo_rejects_bad_runs(tmp_path):
    with pytest.raises(ValueError, match="unknown run 'nope'"):
        run_demo(DemoArguments(output_dir=str(tmp_path), methods=["grpo", "nope"], toy_policy_cache=None))
    (tmp_path / "unfair.yaml").write_text("method: grpo\nlearning_rate: 0.1\n")
    with pytest.raises(ValueError, match=r"sets \['learning_rate'\], which the demo keeps equal"):
        run_settings("unfair", DemoArguments(configs_dir=str(tmp_path)))
    # Restating the recipe's own value is allowed (the off-policy methods' configs name num_iterations: 2, the demo's
    # value); another value is not.
    (tmp_path / "passes.yaml").write_text("method: grpo\nnum_iterations: 2\nepsilon: 0.1\n")
    assert run_settings("passes", DemoArguments(configs_dir=str(tmp_path))) == (
        "grpo",
        {"num_iterations": 2, "epsilon": 0.1},
    )
    (tmp_path / "passes.yaml").write_text("method: grpo\nnum_iterations: 4\n")
    with pytest.raises(ValueError, match=r"sets \['num_iterations'\], which the demo keeps equal"):
        run_settings("passes", DemoArguments(configs_dir=str(tmp_path)))
    for path in sorted(Path(DemoArguments().configs_dir).glob("*.yaml")):  # every shipped config runs in the demo
        run_settings(path.stem, DemoArguments())
    with pytest.raises(ValueError, match="max_steps must be at least 1, got 0"):
        DemoArguments(max_steps=0)
    older = {"all_seeds": {"0": {"grpo": {"1": {"pass_at_k": {}}}}}, "initial_evaluations": {}}
    (tmp_path / "history.json").write_text(json.dumps(older))
    with pytest.raises(ValueError, match="does not hold each held-out problem's correct count .* run the demo again"):
        write_outputs(str(tmp_path / "history.json"))


def write_jsonl(folder: Path, rows: list[dict]) -> str:
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(folder)


def test_train_real_model_on_a_local_math_dataset(cli_runs):
    """The --model_name_or_path path end to end, offline: a saved model with a chat template, a GSM8K-style dataset
    folder, the math answer reward, TRL's defaults instead of the toy recipe."""
    folder, status, stdout, stderr = cli_runs["real_model"]
    assert status == 0, stderr[-4000:]
    assert "train.py: --use_cpu: training in fp32" in stderr  # TRL's bf16 default gave way, with a notice
    metrics = logged_metrics(stdout + stderr)
    assert "rewards/math_answer_reward/mean" in metrics and "aent/coef" in metrics
    assert float(metrics["learning_rate"]) == pytest.approx(1e-6)  # TRL's default schedule, not the toy recipe's
    assert (folder / "out_real" / "model.safetensors").exists()


def test_train_vlm_on_a_local_image_question_dataset(cli_runs):
    """--dataset_image_column end to end, offline: a saved tiny LLaVA and its processor, image questions with
    verifiable answers, the image column renamed to TRL's ``image``."""
    folder, status, stdout, stderr = cli_runs["real_vlm"]
    assert status == 0, stderr[-4000:]
    metrics = logged_metrics(stdout + stderr)
    assert "rewards/math_answer_reward/mean" in metrics and "aent/coef" in metrics
    assert math.isfinite(float(metrics["loss"]))
    assert (folder / "out_vlm" / "model.safetensors").exists()


def test_real_math_dataset_keeps_the_image_column_as_trl_s_image(tmp_path):
    from transformers import LlavaConfig

    dataset = write_image_questions(tmp_path / "images", rows=2)
    rows = train_script.real_math_dataset(
        train_arguments.TrainScriptArguments(dataset_name=dataset, dataset_image_column="picture")
    )
    assert set(rows.column_names) == {"prompt", "answer", "image"}
    assert rows[0]["answer"] == "1" and rows[0]["image"].size == (28, 28)
    with pytest.raises(ValueError, match=r"has no column 'photo' \(--dataset_image_column\)"):
        train_script.real_math_dataset(
            train_arguments.TrainScriptArguments(dataset_name=dataset, dataset_image_column="photo")
        )
    config = LlavaConfig(image_token_index=7)
    assert train_script.without_image_tokens(None, config) == {"suppress_tokens": [7]}
    assert train_script.without_image_tokens({"suppress_tokens": [3], "top_k": 5}, config) == {
        "suppress_tokens": [3, 7],
        "top_k": 5,
    }


def test_real_math_dataset_reads_gsm8k_and_math_columns(tmp_path):
    gsm = write_jsonl(tmp_path / "gsm", [{"question": "What is 2+3?", "answer": "2+3=5\n#### 5"}])
    math = write_jsonl(tmp_path / "math", [{"problem": "Half of 1?", "solution": "It is $\\boxed{\\frac{1}{2}}$."}])
    other = write_jsonl(tmp_path / "other", [{"text": "no answer column"}])

    gsm_rows = train_script.real_math_dataset(train_arguments.TrainScriptArguments(dataset_name=gsm))
    assert gsm_rows[0]["prompt"] == [{"role": "user", "content": "What is 2+3?" + train_script.INSTRUCTION}]
    assert gsm_rows[0]["answer"] == "5"
    math_rows = train_script.real_math_dataset(train_arguments.TrainScriptArguments(dataset_name=math))
    assert math_rows[0]["answer"] == "\\frac{1}{2}"
    with pytest.raises(ValueError, match="reads 'question'/'answer'"):
        train_script.real_math_dataset(train_arguments.TrainScriptArguments(dataset_name=other))


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ([], "outputs/toy_policy"),  # shared by the runs that save under outputs/
        (["--output_dir", "/elsewhere/run"], "/elsewhere/run/toy_policy"),  # nothing outside the named folder
        (["--output_dir", "/elsewhere/run", "--toy_policy_cache", "/cache"], "/cache"),
    ],
)
def test_the_toy_policy_is_cached_where_the_run_saves(arguments, expected):
    _, script_args, _, _ = train_arguments.parse_arguments(["--method", "aent", *arguments])
    assert script_args.toy_policy_cache == expected
