"""The demo's two policies (``--model``): the warm-started toy policy, on its two tasks (addition, then subtraction),
and SmolLM2-135M-Instruct, a real pretrained model, on the chat arithmetic task (one task: adding one-digit
numbers). Each names its training recipe, the demo's defaults for it, its start policy, and what a job trains and
evaluates on."""

import os
from dataclasses import dataclass
from pathlib import Path

from trl_entropy.toy import TOY_NUM_PROMPTS, TOY_TRAINING_DEFAULTS, toy_training_set


TASK_A, TASK_B = "+", "-"  # the toy's phase 1 trains on addition, phase 2 on subtraction
TASK_NAMES = {TASK_A: "addition", TASK_B: "subtraction"}
# Supervised warm-start steps on both tasks: the policy then solves about a third of either task's held-out problems
# sampling at temperature 1 (seed 0: 0.34 on both), so GRPO has an advantage signal on each.
WARM_START_STEPS = 450
# The per-run YAML configs, package data (setup.py's package_data): an installed package and a clone read the same
# files. The clone's examples/configs is a link to this folder, the files `examples/train.py --config` reads.
CONFIGS_DIR = Path(__file__).resolve().parent / "configs"


def methods_configured_in(folder: Path) -> tuple[str, ...]:
    """The registered names with a YAML config in ``folder``, in the registry's order: a preset's runs are the configs
    its folder holds."""
    from trl_entropy.methods import METHODS

    return tuple(name for name in METHODS if (folder / f"{name}.yaml").is_file())


SMOLLM2 = "smollm2-135m-instruct"
# One-digit operands: SmolLM2-135M-Instruct states the right sum in about 14 % of its samples there
# (docs/real_model.md), and in none with two digits, where GRPO would have no advantage signal.
SMOLLM2_DIGITS = 1
# The recipe of `--model smollm2` (ours; every run of the demo shares it). Two prompts x 8 completions of at most 24
# tokens per optimizer step, one step per generation batch (TRL's default num_iterations=1, on-policy), because a step
# costs 10 to 60 s on one or two CPU threads, depending on what else the machine runs. Learning rate 1e-5, constant,
# no warm-up: the top of the range usual for RL on an instruct model of this size; the budget is tens of steps, in
# which 1e-6 would barely move the weights.
SMOLLM2_TRAINING_DEFAULTS: dict = {
    "per_device_train_batch_size": 16,
    "num_generations": 8,
    "num_iterations": 1,
    "max_completion_length": 24,
    "learning_rate": 1e-5,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "max_steps": 20,
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": [],
    "bf16": False,
    "use_cpu": True,
}

# `--generator vllm`: TRL's colocate mode (vLLM inside the training process: no server, and the only mode that runs on
# a CPU). 512 tokens hold the chat template's prompt and the completion with room to spare, where the model's own
# 8192 would only size buffers that are never filled.
VLLM_TRAINING_SETTINGS: dict = {"use_vllm": True, "vllm_mode": "colocate", "vllm_max_model_length": 512}


@dataclass(frozen=True)
class DemoModel:
    """One ``--model``: the tasks its runs train and are evaluated on (task A first; a second task is phase 2's),
    the training recipe every run shares, and the defaults of the demo's flags that depend on the model."""

    name: str
    title: str
    tasks: tuple[str, ...]
    training: dict
    num_prompts: int | None  # None: every training problem of task A
    num_samples: int
    methods: tuple[str, ...] | None  # None: every registered method and every combination with a config
    configs_dir: Path
    smoothing: int
    eval_steps: int | None  # held-out evaluations along training; None: after training only

    @property
    def pretrained(self) -> bool:
        return self.name != "toy"

    def task_label(self, operator: str) -> str:
        if self.pretrained:
            return f"chat {TASK_NAMES[operator]}, {SMOLLM2_DIGITS}-digit operands"
        return f"task {'A' if operator == TASK_A else 'B'} ({TASK_NAMES[operator]})"

    def labels(self, num_held_out: int) -> dict[str, str]:
        """What the demo's figure calls the tasks and the held-out set."""
        if not self.pretrained:
            return {
                "phase1": "task A (addition), phase 1",
                "phase2": "task B (subtraction), phase 2 (GRPO)",
                "task": "task A",
                "held_out": f"{num_held_out} held-out problems",
            }
        task = self.task_label(TASK_A)
        return {"phase1": task, "phase2": "", "task": task, "held_out": f"{num_held_out} held-out problems"}

    def start_policy(self, seed: int, seed_dir: str, cache_dir: str | None) -> str:
        """The folder every run of ``seed`` starts from: the toy policy warm-started with ``seed`` and saved into
        ``seed_dir``, or the fetched checkpoint (the same for every seed)."""
        if self.pretrained:
            from trl_entropy.pretrained import fetch_model

            return fetch_model(SMOLLM2, cache_dir=cache_dir)
        from trl_entropy.toy import build_toy_policy

        model, tokenizer = build_toy_policy(
            seed=seed, warm_start_steps=WARM_START_STEPS, cache_dir=cache_dir, operators=(TASK_A, TASK_B)
        )
        initial = os.path.join(seed_dir, "initial_policy")
        model.save_pretrained(initial)  # every run of this seed starts from these exact weights
        tokenizer.save_pretrained(initial)
        return initial

    def provenance(self) -> dict:
        """What history.json records of the start policy."""
        if self.pretrained:
            return {"model": SMOLLM2, "chat_arithmetic_digits": SMOLLM2_DIGITS}
        return {"warm_start_steps": WARM_START_STEPS}

    def training_set(self, operator: str, num_prompts: int, num_rows: int, seed: int):
        """``num_prompts`` distinct training problems of one task, drawn with ``seed`` and repeated in order up to at
        least ``num_rows`` rows (the trainer's sampler shuffles them)."""
        if not self.pretrained:
            return toy_training_set(num_prompts, num_rows, seed=seed, operators=(operator,))
        from trl_entropy.toy import build_chat_arithmetic_dataset

        pool = build_chat_arithmetic_dataset(num_prompts, digits=SMOLLM2_DIGITS, seed=seed, operators=(operator,))
        repeats = max(1, -(-num_rows // num_prompts))
        return pool.select([index for _ in range(repeats) for index in range(num_prompts)])

    def held_out_set(self, operator: str):
        """Every held-out problem of one task, in a fixed order."""
        if self.pretrained:
            from trl_entropy.toy import build_chat_arithmetic_dataset, chat_arithmetic_problems

            size = len(chat_arithmetic_problems("test", SMOLLM2_DIGITS, (operator,)))
            return build_chat_arithmetic_dataset(size, split="test", digits=SMOLLM2_DIGITS, operators=(operator,))
        from trl_entropy.toy import build_toy_dataset, toy_problems

        return build_toy_dataset(len(toy_problems("test", (operator,))), split="test", operators=(operator,))

    def num_training_problems(self) -> int:
        """The distinct training problems of task A, the most ``--num_prompts`` may ask for."""
        if self.pretrained:
            from trl_entropy.toy import chat_arithmetic_problems

            return len(chat_arithmetic_problems("train", SMOLLM2_DIGITS, (TASK_A,)))
        from trl_entropy.toy import toy_problems

        return len(toy_problems("train", (TASK_A,)))

    def reward(self):
        if self.pretrained:
            from trl_entropy.rewards import stated_answer_reward

            return stated_answer_reward
        from trl_entropy.toy import toy_reward

        return toy_reward

    def tokenizer(self, path: str):
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        return (AutoTokenizer if self.pretrained else PreTrainedTokenizerFast).from_pretrained(path)


DEMO_MODELS = {
    "toy": DemoModel(
        name="toy",
        title="Toy task",
        tasks=(TASK_A, TASK_B),
        training=TOY_TRAINING_DEFAULTS,
        num_prompts=TOY_NUM_PROMPTS,
        num_samples=16,
        methods=None,
        configs_dir=CONFIGS_DIR,
        smoothing=40,
        eval_steps=None,
    ),
    # The held-out set is the 19 held-out one-digit sums, 8 samples each: one evaluation costs about as much as three
    # training steps, so one halfway through the 20-step run, and one after it.
    "smollm2": DemoModel(
        name="smollm2",
        title="SmolLM2-135M-Instruct, chat addition (one-digit operands)",
        tasks=(TASK_A,),
        training=SMOLLM2_TRAINING_DEFAULTS,
        num_prompts=None,
        num_samples=8,
        methods=methods_configured_in(CONFIGS_DIR / "smollm2"),
        configs_dir=CONFIGS_DIR / "smollm2",
        smoothing=5,
        eval_steps=10,
    ),
}
