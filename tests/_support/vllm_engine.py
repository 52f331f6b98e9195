"""Runs with a real vLLM engine (vLLM's CPU build, colocate mode), each in a child forked from the test process.

One engine per process, as a user's run has: TRL's colocate mode sets the process's rank variables and vLLM owns the
process group it starts, so a second trainer with vLLM in the same process is not a user's situation. Each run forks
a child (``process.run_forked``: the imports paid), trains or captures there, and writes what the test reads to a JSON
or torch file in the test's folder.
"""

import json
import os

import torch

from _support.distributed_run import make_trainer
from _support.process import run_forked
from trl_entropy.demo.scheduler import engine_port


VLLM_MISSING = (
    "vLLM is not installed: CI's vLLM lane runs these in an environment with vLLM's CPU build "
    "(docs/distributed.md, 'vLLM on a CPU')"
)
# vLLM's CPU attention takes head sizes 32, 64, ... (not the toy policy's 16): the toy with 2 heads of 32.
VLLM_TOY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=2)
VLLM_OPTIONS = dict(
    rollout=None,  # vLLM samples
    use_vllm=True,
    vllm_mode="colocate",
    vllm_max_model_length=64,
)
# The bounds on TRL's sampling gap and the runs they hold for (measured: tests/real_vllm/test_vllm_training.py).
GAP_BOUND = 0.05
SMOLLM2_GAP_BOUND = 0.6
LEARNING_RATE = 0.05
GAP_MEAN = "sampling/sampling_logp_difference/mean"
GAP_MAX = "sampling/sampling_logp_difference/max"


def save_vllm_toy_policy(path: str) -> str:
    """The toy policy in a shape vLLM's CPU attention takes, saved (fp32) where vLLM loads it from."""
    from trl_entropy.toy import build_toy_model, build_toy_tokenizer

    if not os.path.exists(os.path.join(path, "config.json")):
        tokenizer = build_toy_tokenizer()
        build_toy_model(tokenizer, **VLLM_TOY_SHAPE).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


def alternating_reward(completions, **_):
    """1 and 0 in turn: every group of 4 has both, so every step has nonzero advantages (the weights move) whatever
    the completions are."""
    return [float(index % 2) for index in range(len(completions))]


def logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry and "train_runtime" not in entry]


# Ports for the engines' process groups: below Linux's ephemeral range (32768 and up), where no outgoing connection
# takes one, and a range of their own for each pytest worker.
ENGINE_PORTS = 500
_last_port: list[int] = []


def next_engine_port() -> int:
    """A free port this test process has not handed to an engine before."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    first = 20000 + ENGINE_PORTS * int(worker or 0)
    start = _last_port[-1] + 1 if _last_port else first
    port = engine_port(set(), range(start, first + ENGINE_PORTS))
    _last_port.append(port)
    return port


def in_child(function, *args, **keyword):
    """Run ``function(*args, **keyword)`` in a forked child; fail with what it printed unless it returned."""
    # TRL's colocate mode gives vLLM's process group the port MASTER_PORT names, or else the first of a few fixed
    # ports that is free when it looks (29500 first): two engines starting at once on one machine (the lane's two
    # workers) could both take it. Each child gets a port of its own.
    port = next_engine_port()

    def run():
        os.environ["MASTER_PORT"] = str(port)
        function(*args, **keyword)

    run.__name__ = function.__name__
    code, printed = run_forked(run)
    assert code == 0, printed[-6000:]


def engine_model(trainer):
    """The model vLLM runs in this process (TRL's colocate engine)."""
    return trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model


def count_syncs(trainer) -> list[int]:
    """A list whose length counts the weight syncs TRL makes from now on."""
    syncs = []
    sync = trainer.vllm_generation.sync_weights

    def counted():
        syncs.append(trainer.state.global_step)
        sync()

    trainer.vllm_generation.sync_weights = counted
    return syncs


def train_and_record(method, model, output_dir, result, skip_sync=False, engine=None, **overrides):
    """Train ``method`` with vLLM generating and write, to ``result``, the per-step sampling gaps, losses, syncs and
    how far the weights moved. ``skip_sync`` plants a missing weight sync (vLLM keeps the starting weights);
    ``engine``: options of vLLM's engine that TRL does not expose (:func:`engine_options`)."""
    if engine:
        engine_options(**engine)
    trainer = make_trainer(method, model, output_dir, reward=alternating_reward, **{**VLLM_OPTIONS, **overrides})
    start = {name: parameter.detach().clone() for name, parameter in trainer.model.named_parameters()}
    syncs = count_syncs(trainer)
    if skip_sync:
        trainer.vllm_generation.sync_weights = lambda: syncs.append(trainer.state.global_step)
    trainer.train()
    moved = max(
        (parameter.detach() - start[name]).abs().max().item() for name, parameter in trainer.model.named_parameters()
    )
    record = {
        "gap_mean": logged(trainer, GAP_MEAN),
        "gap_max": logged(trainer, GAP_MAX),
        "loss": logged(trainer, "loss"),
        "entropy": logged(trainer, "entropy"),
        "syncs": syncs,
        "moved": moved,
        "steps": trainer.state.global_step,
        "num_iterations": trainer.args.num_iterations,
        "controllers": {
            key: logged(trainer, key) for controller in trainer.controllers.values() for key in controller.metrics()
        }
        if hasattr(trainer, "controllers")
        else {},
    }
    with open(result, "w") as file:
        json.dump(record, file)


def engine_options(**options) -> None:
    """Have TRL build this process's engine with ``options`` too (``vllm.LLM``'s keyword arguments)."""
    import functools

    import trl.generation.vllm_generation as generation

    generation.LLM = functools.partial(generation.LLM, **options)


def smollm2_prompts(copies: int = 4):
    """Four short chat prompts, ``copies`` times each."""
    from datasets import Dataset

    questions = ["What is 2 + 3?", "Name a colour.", "What is 7 times 6?", "Say hello."]
    return Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in questions * copies])


def read(result) -> dict:
    with open(result) as file:
        return json.load(file)


def capture_generation_batch(trainer, rows):
    """One generation batch made by TRL's vLLM path (``rows``: dataset rows, one per completion)."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer._generate_and_score_completions([dict(row) for row in rows])


def save(result, **tensors) -> None:
    torch.save(tensors, result)
