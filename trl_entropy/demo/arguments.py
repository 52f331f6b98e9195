"""The demo's arguments (:class:`DemoArguments`, every field a flag of ``trl-entropy demo``), its two tasks and
shared budget, and each run's settings from its YAML config (:func:`run_settings`)."""

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trl_entropy.methods import METHODS, get_method
from trl_entropy.methods.compose import SEPARATOR
from trl_entropy.toy import TOY_NUM_PROMPTS, TOY_TRAINING_DEFAULTS


# The clone's per-run configs (examples/configs beside the package); an installed package has none.
CLONE_CONFIGS_DIR = Path(__file__).resolve().parents[2] / "examples" / "configs"
# The shared budget: a run's YAML config may not change these, or the comparison would not be like for like.
SHARED_SETTINGS = frozenset(TOY_TRAINING_DEFAULTS) | {"seed", "temperature", "output_dir"}
TASK_A, TASK_B = "+", "-"  # phase 1 trains on addition, phase 2 on subtraction
TASK_NAMES = {TASK_A: "addition", TASK_B: "subtraction"}
# Supervised warm-start steps on both tasks: the policy then solves about a third of either task's held-out problems
# sampling at temperature 1 (seed 0: 0.34 on both), so GRPO has an advantage signal on each.
WARM_START_STEPS = 450
# --full: enough seeds for the intervals over seeds to say which differences to GRPO hold.
FULL_SEEDS = 5


@dataclass
class DemoArguments:
    """The demo's runs and their shared budget; every other training setting is the toy recipe of
    ``trl-entropy train`` (``trl_entropy.toy.TOY_TRAINING_DEFAULTS``)."""

    output_dir: str = field(default="outputs/demo", metadata={"help": "Where the tables, PNG and history go."})
    methods: list[str] = field(
        default_factory=lambda: list(METHODS),
        metadata={
            "help": f"Runs, in order: registered methods {list(METHODS)}, methods combined (NAME{SEPARATOR}NAME), "
            "or the name of any YAML config in --configs_dir (e.g. clip_low). Default: every registered method, then "
            "every combination with a YAML config in --configs_dir."
        },
    )
    max_steps: int = field(
        default=TOY_TRAINING_DEFAULTS["max_steps"],
        metadata={"help": "Phase-1 optimizer steps per run (the shared budget)."},
    )
    phase2_steps: int | None = field(
        default=None,
        metadata={"help": "Phase-2 (plain GRPO on task B) optimizer steps per run; default --max_steps; 0 skips it."},
    )
    num_prompts: int = field(
        default=TOY_NUM_PROMPTS, metadata={"help": "Distinct problems every run trains on, per task (at most 320)."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the toy policy, the prompts, the training and sampling."})
    num_seeds: int = field(
        default=1, metadata={"help": "Repeat everything with seeds seed, seed+1, ...; tables show the mean."}
    )
    num_samples: int = field(
        default=16, metadata={"help": "Completions sampled per held-out prompt: pass@k for k = 1, 2, 4 ... this."}
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
            "help": "Folder of the per-run YAML configs (<name>.yaml). Default: the clone's examples/configs; an "
            "installed package without the clone has none, and every run trains with its library defaults."
        },
    )
    smoothing: int = field(
        default=40, metadata={"help": "Window (optimizer steps) of the moving average in the plot and the table."}
    )
    toy_policy_cache: str | None = field(
        default="outputs/toy_policy", metadata={"help": "Folder caching the warm-started toy policy."}
    )
    workers: int = field(
        default=2, metadata={"help": "Runs trained at the same time, each in its own single-threaded process."}
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
        if self.full:
            self.num_seeds, self.num_samples = max(self.num_seeds, FULL_SEEDS), max(self.num_samples, 32)
        if self.phase2_steps is None:
            self.phase2_steps = self.max_steps
        if self.configs_dir is None and CLONE_CONFIGS_DIR.is_dir():
            self.configs_dir = str(CLONE_CONFIGS_DIR)
        if self.methods == list(METHODS) and self.configs_dir is not None:
            self.methods += sorted(path.stem for path in Path(self.configs_dir).glob(f"*{SEPARATOR}*.yaml"))
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


def run_settings(name: str, demo: DemoArguments) -> tuple[str, dict]:
    """The method and the method-specific config values of the run ``name``: its YAML config's, or none with
    ``paper_defaults`` (the method's registry defaults always apply)."""
    path = None if demo.configs_dir is None else os.path.join(demo.configs_dir, f"{name}.yaml")
    if path is None or not os.path.exists(path):
        if name not in METHODS and SEPARATOR not in name:
            where = "there is no --configs_dir" if path is None else f"there is no {path} config"
            raise ValueError(f"unknown run {name!r}: not a method ({sorted(METHODS)}) and {where}")
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
        for key in SHARED_SETTINGS & set(settings)
        if key not in TOY_TRAINING_DEFAULTS or settings[key] != TOY_TRAINING_DEFAULTS[key]
    )
    if shared:
        raise ValueError(
            f"{path} sets {shared}, which the demo keeps equal for every run (a config may only restate the toy "
            "recipe's value)"
        )
    return method, ({} if demo.paper_defaults else settings)
