"""`trl-entropy demo --model smollm2`: the entropy-collapse demo on SmolLM2-135M-Instruct (the `smollm2_path`
fixture's checkpoint, fetched and converted once into the suite's cache), at tiny sizes: what it measures along
training reaches history.json, table.md and the report's figure."""

import json
import math
import os

import pytest
import torch

from trl_entropy.core.trl import vllm as vllm_support
from trl_entropy.demo.arguments import DemoArguments, run_settings
from trl_entropy.demo.models import DEMO_MODELS, SMOLLM2
from trl_entropy.demo.run import write_outputs
from trl_entropy.scripts.demo import main


PNG = b"\x89PNG\r\n\x1a\n"
HELD_OUT = 19  # the held-out one-digit sums of the chat arithmetic task


def test_smollm2_defaults_and_configs(monkeypatch):
    monkeypatch.setattr(vllm_support, "vllm_installed", lambda: False)  # as in the main environment
    demo = DemoArguments(model="smollm2")
    assert demo.generator == "transformers"  # --generator auto, without vLLM
    with pytest.raises(ValueError, match=r"--generator vllm needs vLLM, which is not installed: .*vLLM on a CPU"):
        DemoArguments(model="smollm2", generator="vllm")
    assert demo.methods == ["grpo", "aent", "repo_d", "entropic"]
    assert (demo.max_steps, demo.phase2_steps, demo.num_prompts, demo.num_samples, demo.eval_steps) == (
        20,
        0,
        81,
        8,
        10,
    )
    assert demo.configs_dir.endswith("trl_entropy/demo/configs/smollm2")  # package data, installed or cloned
    # Each run's config is read, and changes none of the recipe every run shares.
    assert run_settings("aent", demo) == (
        "aent",
        {"aent_entropy_low": 2.0, "aent_entropy_high": 2.5, "aent_coef_lr": 0.1, "aent_coef_max": 0.05},
    )
    assert run_settings("repo_d", demo) == ("repo_d", {})
    assert run_settings("entropic", demo)[1]["entropic_target"] == 2.2
    with pytest.raises(ValueError, match="trains one task, so it has no phase 2"):
        DemoArguments(model="smollm2", phase2_steps=5)
    with pytest.raises(ValueError, match=r"num_prompts must be between 1 and 81 \(the training problems of --model"):
        DemoArguments(model="smollm2", num_prompts=82)
    with pytest.raises(ValueError, match="model must be one of"):
        DemoArguments(model="smollm3")
    # The toy demo's defaults are unchanged.
    toy = DemoArguments()
    assert (toy.max_steps, toy.phase2_steps, toy.num_prompts, toy.num_samples, toy.smoothing) == (400, 400, 16, 16, 40)
    assert toy.eval_steps is None and toy.configs_dir.endswith("trl_entropy/demo/configs")


def test_demo_trains_the_real_model_and_writes_its_curves_and_report(smollm2_path, tmp_path, monkeypatch, capsys):
    """GRPO and AEnt, two steps each, held-out pass@k after step 1 and after training: history.json holds every
    step's entropy and reward and those evaluations (each problem's count), table.md the pass@k along training and the
    law pooled over the runs, and the seed's folder the report's figure."""
    # Tiny sizes (the shared recipe is two prompts x 8 completions of 24 tokens): 2 completions of 4 tokens a step.
    recipe = DEMO_MODELS["smollm2"].training
    for key, value in {"per_device_train_batch_size": 2, "num_generations": 2, "max_completion_length": 4}.items():
        monkeypatch.setitem(recipe, key, value)
    output = tmp_path / "demo"
    arguments = ["--model", "smollm2", "--methods", "grpo", "aent", "--max_steps", "2", "--eval_steps", "1"]
    arguments += ["--num_samples", "1", "--workers", "1", "--generator", "transformers", "--output_dir", str(output)]
    arguments += ["--model_cache_dir", os.path.dirname(smollm2_path)]
    assert main(arguments) == 0  # one worker, in this process, on the suite's one thread
    assert torch.get_num_threads() == 1
    printed = capsys.readouterr().out

    history = json.loads((output / "history.json").read_text())
    assert history["model"] == SMOLLM2 and history["arguments"]["phase2_steps"] == 0
    assert history["generator"] == "transformers"
    assert history["training"]["max_completion_length"] == 4
    assert history["runs"]["aent"]["settings"]["aent_entropy_low"] == 2.0  # trl_entropy/demo/configs/smollm2/aent.yaml
    start = history["initial_evaluations"]["0"]
    assert list(start["correct"]) == ["+"] and len(start["correct"]["+"]) == HELD_OUT  # one task, no subtraction
    for name in ("grpo", "aent"):
        steps = history["histories"][name]
        assert [entry["step"] for entry in steps] == [1, 2]  # every step logged, the evaluation at step 1 included
        for entry in steps:
            assert 0.0 < entry["entropy"] < math.log(49152) and 0.0 <= entry["reward"] <= 1.0
        run = history["all_seeds"]["0"][name]["1"]
        assert list(run) == ["history", "pass_at_k", "correct", "evaluations", "law", "wall_time_s", "cpu_time_s"]
        (along,) = run["evaluations"]
        assert along["step"] == 1 and len(along["correct"]) == HELD_OUT and set(along["correct"]) <= {0, 1}
        assert along["pass_at_k"] == {"1": pytest.approx(sum(along["correct"]) / HELD_OUT)}
        state = json.loads((output / "seed0" / name / "phase1" / "trainer_state.json").read_text())
        logged = [(entry["step"], entry["eval/pass@1"]) for entry in state["log_history"] if "eval/pass@1" in entry]
        assert logged == [(1, along["pass_at_k"]["1"]), (2, run["pass_at_k"]["+"]["1"])]
    assert "aent/coef" in history["histories"]["aent"][0]

    table = (output / "table.md").read_text()
    assert "Held-out pass@k along training" in table and "| run | step 0 | step 1 | step 2 |" in table
    assert "Each cell: pass@1." in table
    assert "the 19 held-out problems" in table and "on every run's steps pooled: not fitted (4 (entropy" in table
    assert "Phase 1, chat addition, 1-digit operands" in printed
    assert (output / "entropy_collapse.png").read_bytes()[:8] == PNG
    assert (output / "seed0" / "report.png").read_bytes()[:8] == PNG
    report = (output / "seed0" / "report.md").read_text()
    assert "| grpo/phase1 | 1 |" in report and "| aent/phase1 | 2 |" in report  # pass@k along training, per step

    (output / "table.md").unlink()
    write_outputs(str(output / "history.json"))  # --from_history: the same tables from history.json alone
    assert (output / "table.md").read_text() == table
