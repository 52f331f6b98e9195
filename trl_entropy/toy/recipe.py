"""The toy training recipe: the settings of `examples/train.py` without a model and of the entropy-collapse demo."""

from .task import TOY_OPERATORS, build_toy_dataset, toy_problems


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
    available = len(toy_problems("train", operators))
    if not 1 <= num_prompts <= available:
        raise ValueError(f"num_prompts must be between 1 and {available} (the toy training split), got {num_prompts}")
    pool = build_toy_dataset(num_prompts, seed=seed, operators=operators)
    repeats = max(1, -(-num_rows // num_prompts))
    return pool.select([index for _ in range(repeats) for index in range(num_prompts)])
