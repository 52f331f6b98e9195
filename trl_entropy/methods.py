"""The method registry (what `--method` names), the toy recipe and the known upstream noise, shared by
`examples/train.py` and the demo."""

import logging
import warnings
from dataclasses import dataclass, field

from .adapo import ADAPOConfig, ADAPOTrainer
from .aent import AEntConfig, AEntTrainer
from .base import EntropyGRPOConfig, EntropyGRPOTrainer
from .cov import ClipCovConfig, ClipCovTrainer, KLCovConfig, KLCovTrainer
from .repo import REPOConfig, REPOTrainer
from .toy import TOY_OPERATORS


__all__ = [
    "METHODS",
    "TOY_NUM_PROMPTS",
    "TOY_TRAINING_DEFAULTS",
    "Method",
    "get_method",
    "hide_known_upstream_noise",
    "toy_training_set",
]


@dataclass(frozen=True)
class Method:
    """A trainer, its config, and the config defaults that make the method what it is."""

    description: str
    config_class: type
    trainer_class: type
    defaults: dict = field(default_factory=dict)


# EntReg is TRL's own entropy bonus on the base; 1e-3 is a common coefficient for it (ours: the bonus has no paper
# default). REPO-R and REPO-D are one trainer with two variants.
METHODS: dict[str, Method] = {
    "grpo": Method("GRPO, no entropy control", EntropyGRPOConfig, EntropyGRPOTrainer),
    "entreg": Method(
        "TRL's entropy bonus (entropy_coef)", EntropyGRPOConfig, EntropyGRPOTrainer, {"entropy_coef": 1e-3}
    ),
    "aent": Method("AEnt: clamped-entropy bonus, adaptive coefficient", AEntConfig, AEntTrainer),
    "clip_cov": Method("Clip-Cov: detach high-covariance tokens", ClipCovConfig, ClipCovTrainer),
    "kl_cov": Method("KL-Cov: KL penalty on high-covariance tokens", KLCovConfig, KLCovTrainer),
    "repo_r": Method("REPO-R: rescaled per-token advantages", REPOConfig, REPOTrainer, {"repo_variant": "R"}),
    "repo_d": Method("REPO-D: decorrelated per-token advantages", REPOConfig, REPOTrainer, {"repo_variant": "D"}),
    "adapo": Method("ADAPO: DAPO with an adaptive epsilon_high", ADAPOConfig, ADAPOTrainer),
}


def get_method(name: str) -> Method:
    """The registered method called ``name``; a ValueError lists the valid names otherwise."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {sorted(METHODS)}")
    return METHODS[name]


# The toy recipe (ours, measured on the warm-started toy policy of trl_entropy.toy, seed 0): the training settings of
# `examples/train.py` without --model_name_or_path and of the entropy-collapse demo. Under it GRPO sharpens the policy
# within a few hundred steps: the reward on the training prompts rises from about 0.5 to 0.8 while the mean token
# entropy falls from about 0.5 to 0.2 nats, and the held-out success drops. What each setting is for:
# * a small, fixed pool of prompts (TOY_NUM_PROMPTS): the policy can sharpen on every one of them within the budget;
#   drawing from all 320 training problems, the reward stays flat for hundreds of steps (each problem is a separate
#   fact of a tiny model, seen a few times);
# * a warm-up: Adam's first updates are sign-like and full-size in every parameter; without a warm-up they knock the
#   warm-started policy down (reward 0.5 -> about 0.3 within 20 steps at 3e-4);
# * learning rate 3e-4, constant: at 1e-4 the policy barely moved in 300 steps, at 1e-3 the reward fell;
# * num_iterations=2: every generation batch serves two optimizer steps, so the second is off-policy and the clipping
#   that ADAPO and the clip-low recipe act on, and KL-Cov's |logp - logp_old| penalty, are not identically inactive.
TOY_TRAINING_DEFAULTS: dict = {
    "per_device_train_batch_size": 64,  # 8 prompts x 8 completions per optimizer step
    "num_generations": 8,
    "num_iterations": 2,
    "max_completion_length": 8,
    "learning_rate": 3e-4,
    "lr_scheduler_type": "constant_with_warmup",
    "warmup_steps": 20,
    "max_steps": 400,
    "logging_steps": 10,
    "save_strategy": "no",
    "report_to": [],
    "bf16": False,
    "use_cpu": True,
}
TOY_NUM_PROMPTS = 16


def toy_training_set(num_prompts: int, num_rows: int, seed: int = 0, operators: tuple[str, ...] = TOY_OPERATORS):
    """The toy training dataset: ``num_prompts`` distinct problems of the toy "train" split of the ``operators``'
    problems (addition by default; at most 320 per operator, drawn with ``seed``), repeated in order up to at least
    ``num_rows`` rows (the trainer's sampler shuffles them)."""
    from trl_entropy.toy import build_toy_dataset, toy_problems

    available = len(toy_problems("train", operators))
    if not 1 <= num_prompts <= available:
        raise ValueError(f"num_prompts must be between 1 and {available} (the toy training split), got {num_prompts}")
    pool = build_toy_dataset(num_prompts, seed=seed, operators=operators)
    repeats = max(1, -(-num_rows // num_prompts))
    return pool.select([index for _ in range(repeats) for index in range(num_prompts)])


# Upstream deprecation notices a user of the examples cannot act on (TRL 1.16 still calls transformers' old
# gradient-checkpointing names). Only these are hidden; every other warning, this library's included, still shows.
KNOWN_UPSTREAM_WARNINGS = [(FutureWarning, r"`(is_)?gradient_checkpointing\w*` is deprecated")]
# DeepSpeed's import-time note on a machine without a GPU; the examples say themselves which precision they use.
KNOWN_UPSTREAM_LOG = ("DeepSpeed", "Setting accelerator to CPU")


def is_not_known_upstream_log(record: logging.LogRecord) -> bool:
    return not (record.name == KNOWN_UPSTREAM_LOG[0] and record.getMessage().startswith(KNOWN_UPSTREAM_LOG[1]))


def hide_known_upstream_noise() -> None:
    for category, message in KNOWN_UPSTREAM_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    logging.getLogger(KNOWN_UPSTREAM_LOG[0]).addFilter(is_not_known_upstream_log)  # added once however often called
