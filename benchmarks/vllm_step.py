"""SmolLM2-135M-Instruct's training step on a CPU with vLLM generating (TRL's colocate mode) against transformers'
``generate``, side by side in one run.

The recipe is the real-model demo's (``trl-entropy demo --model smollm2``: two chat arithmetic prompts × 8
completions of at most 24 tokens per step, fp32, its reward). Each generator trains in a process of its own (one vLLM
engine per process, as a user's run has), the two alternating ``--rounds`` times so that a busy machine slows both
alike. Each step is timed from TRL's step begin to its end, and the generation inside it (TRL's ``_generate``: the
weight sync and vLLM, or transformers' ``generate``) on its own. The first step of each process is left out (vLLM
and torch warm up there). Prints a Markdown table: the median step, the median time generating, its share, and the
ratio of the two generators.

Run in the vLLM environment (docs/distributed.md, "vLLM on a CPU"); the model is fetched once
(``trl-entropy fetch-model smollm2-135m-instruct``):

    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/vllm_step.py --steps 5 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


GENERATORS = ("transformers", "vllm")


def child(generator: str, method: str, steps: int, cache_dir: str | None) -> None:
    """Train ``steps`` steps with ``generator`` and print one JSON line: each step's time and its generation's."""
    from transformers import TrainerCallback

    from trl_entropy.demo.models import DEMO_MODELS, SMOLLM2_TRAINING_DEFAULTS, VLLM_TRAINING_SETTINGS
    from trl_entropy.methods import get_method

    demo = DEMO_MODELS["smollm2"]
    path = demo.start_policy(seed=0, seed_dir="", cache_dir=cache_dir)
    spec = get_method(method)
    options = {**SMOLLM2_TRAINING_DEFAULTS, "max_steps": steps, "output_dir": "/tmp/vllm_step_bench", **spec.defaults}
    if generator == "vllm":
        options |= VLLM_TRAINING_SETTINGS
    task = demo.tasks[0]
    trainer = spec.trainer_class(
        model=path,
        reward_funcs=demo.reward(),
        args=spec.config_class(**options),
        train_dataset=demo.training_set(task, 64, options["per_device_train_batch_size"] * steps, seed=0),
        processing_class=demo.tokenizer(path),
    )
    step_times, generation_times = [], []
    generate = trainer._generate

    def timed_generate(*args, **keyword):
        started = time.perf_counter()
        try:
            return generate(*args, **keyword)
        finally:
            generation_times.append(time.perf_counter() - started)

    trainer._generate = timed_generate

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step_times.append(time.perf_counter() - self.started)

    trainer.add_callback(StepTimer())
    trainer.train()
    print(json.dumps({"generator": generator, "steps": step_times, "generation": generation_times}))


def run(generator: str, options) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        generator,
        "--method",
        options.method,
        "--steps",
        str(options.steps),
    ]
    if options.cache_dir:
        command += ["--cache-dir", options.cache_dir]
    printed = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(printed.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="aent", help="a registered method (the base trainer: grpo)")
    parser.add_argument("--steps", type=int, default=5, help="steps per process; the first is left out")
    parser.add_argument("--rounds", type=int, default=2, help="processes per generator, alternating")
    parser.add_argument("--cache-dir", default=None, help="fetch_model's cache folder (default: its own)")
    parser.add_argument("--child", choices=GENERATORS, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        child(options.child, options.method, options.steps, options.cache_dir)
        return
    measured = {generator: {"steps": [], "generation": []} for generator in GENERATORS}
    for _ in range(options.rounds):
        for generator in GENERATORS:
            result = run(generator, options)
            measured[generator]["steps"] += result["steps"][1:]
            measured[generator]["generation"] += result["generation"][1:]
    print(f"method={options.method} steps={options.steps} rounds={options.rounds} (the first step of each left out)\n")
    print("| generator | median step (s) | median generation (s) | generation's share | steps timed |")
    print("|---|---|---|---|---|")
    medians = {}
    for generator, times in measured.items():
        step, generation = statistics.median(times["steps"]), statistics.median(times["generation"])
        medians[generator] = step
        print(f"| {generator} | {step:.2f} | {generation:.2f} | {generation / step:.0%} | {len(times['steps'])} |")
    print(f"\nstep with vLLM / step with transformers: {medians['vllm'] / medians['transformers']:.2f}")


if __name__ == "__main__":
    main()
