"""``trl-entropy demo --model smollm2`` with vLLM sampling the training completions (``--generator``): the choice of
generator, held-out sampling that stays transformers' ``generate``, a port of its own for each worker, and a tiny demo
whose vLLM run trains in a worker process of its own."""

import json
import os
import re
import socket
from types import SimpleNamespace

import pytest
from _support.distributed_run import make_trainer
from _support.vllm_engine import SMOLLM2_GAP_BOUND

from trl_entropy import report
from trl_entropy.core.trl.vllm import vllm_version
from trl_entropy.demo import run
from trl_entropy.demo.arguments import DemoArguments
from trl_entropy.demo.jobs import transformers_sampling
from trl_entropy.demo.scheduler import engine_port


def test_auto_picks_vllm_for_the_pretrained_model_only():
    assert DemoArguments(model="smollm2").generator == "vllm"
    assert DemoArguments(model="smollm2", generator="transformers").generator == "transformers"
    assert DemoArguments(model="toy").generator == "transformers"
    with pytest.raises(ValueError, match=r"--generator vllm needs --model smollm2: the toy policy's head size"):
        DemoArguments(model="toy", generator="vllm")
    with pytest.raises(ValueError, match=r"generator must be one of \['auto', 'vllm', 'transformers'\], got 'sgl'"):
        DemoArguments(model="smollm2", generator="sgl")


def test_held_out_sampling_takes_the_settings_trl_gives_generate(toy_model_path, tmp_path):
    """A trainer vLLM generates for has no transformers generation settings (TRL sets them only without vLLM):
    evaluation sets TRL's own while it samples, and takes them away after."""
    options = dict(max_completion_length=6, temperature=0.7, top_k=5, generation_kwargs={"typical_p": 0.9})
    trainer = make_trainer("grpo", toy_model_path, str(tmp_path), **options)
    expected = trainer.generation_kwargs, trainer.generation_config.to_dict()
    del trainer.generation_kwargs, trainer.generation_config
    trainer.use_vllm = True
    with transformers_sampling(trainer):
        assert not trainer.use_vllm
        assert (trainer.generation_kwargs, trainer.generation_config.to_dict()) == expected
    assert trainer.use_vllm and not hasattr(trainer, "generation_config")


def test_each_demo_worker_gets_a_port_of_its_own_for_vllms_process_group():
    taken: set[int] = set()
    first, second = engine_port(taken), engine_port(taken)
    assert first != second and taken == {first, second}
    with socket.socket() as busy:
        busy.bind(("localhost", first))
        busy.listen()
        assert engine_port(set()) != first


def test_the_demo_trains_with_vllm_each_run_in_a_process_of_its_own(smollm2_path, tmp_path, monkeypatch):
    """A run with vLLM, then the start policy's evaluation, on one worker slot: the vLLM run's worker exits after it
    and a fresh one evaluates (each worker's log names its process and its jobs). The figures are left out (the vLLM
    lane has no matplotlib; the main lane's demo tests draw them)."""
    monkeypatch.setattr(run, "missing_matplotlib", lambda purpose: None)
    monkeypatch.setattr(run, "plot", lambda *args: None)
    monkeypatch.setattr(report, "write_report", lambda folder: SimpleNamespace(png=None, panels=()))
    output = tmp_path / "demo"
    demo = DemoArguments(
        output_dir=str(output),
        model="smollm2",
        methods=["grpo"],
        max_steps=1,
        num_prompts=2,
        num_samples=1,
        workers=1,
        model_cache_dir=os.path.dirname(smollm2_path),
    )
    run.run_demo(demo)
    ran = re.findall(
        r"^\[demo worker (\d+)\] seed 0 / (\w+) / phase", (output / "logs" / "worker0.txt").read_text(), re.M
    )
    assert [name for _, name in ran] == ["grpo", "start"] and len({pid for pid, _ in ran}) == 2
    history = json.loads((output / "history.json").read_text())
    assert history["generator"] == "vllm" and history["versions"]["vllm"] == vllm_version()
    (step,) = history["histories"]["grpo"]
    assert step["sampling/sampling_logp_difference/max"] <= SMOLLM2_GAP_BOUND  # vLLM's log-probs: vLLM sampled
    assert set(history["all_seeds"]["0"]["grpo"]["1"]["correct"]["+"]) <= {0, 1}
