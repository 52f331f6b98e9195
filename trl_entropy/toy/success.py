"""The toy policy's sampled success rate on held-out prompts, through the library's pass@k sampler."""

import tempfile

from .task import TOY_OPERATORS, _sample_problems, toy_reward
from .warm_start import torch_single_thread


def toy_success_rate(
    model,
    tokenizer,
    n: int = 256,
    temperature: float = 1.0,
    seed: int = 0,
    split: str = "test",
    max_new_tokens: int = 8,
    batch_size: int = 256,
    operators: tuple[str, ...] = TOY_OPERATORS,
) -> float:
    """Return the fraction of ``n`` held-out prompts that ``model`` answers correctly, sampling at ``temperature``.

    Prompts come from ``split`` (default: the held-out ``"test"`` split) of the ``operators``' problems, drawn with
    ``seed`` as in :func:`build_toy_dataset` (with replacement when ``n`` exceeds the split's size). One completion
    per prompt, of at most ``max_new_tokens`` tokens, is sampled by :func:`trl_entropy.evaluation.count_correct`
    through a ``trl.GRPOTrainer`` built around ``model`` (so exactly as training samples), ``batch_size`` prompts per
    generation call, and scored with :func:`toy_reward`. Sampling is seeded with ``seed`` and the global random state
    is restored afterwards, so the result is reproducible and leaves other code's randomness alone.
    """
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from ..evaluation.passk import count_correct

    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (the rate of sampled completions), got {temperature}")
    problems = _sample_problems(n, seed, split, operators)
    dataset = Dataset.from_dict({"prompt": [p for p, _ in problems], "answer": [a for _, a in problems]})
    on_cpu = next(model.parameters()).device.type == "cpu"
    with tempfile.TemporaryDirectory() as output_dir, torch_single_thread():
        args = GRPOConfig(
            output_dir=output_dir,
            temperature=temperature,
            max_completion_length=max_new_tokens,
            per_device_train_batch_size=2,
            num_generations=2,
            report_to=[],
            use_cpu=on_cpu,
            bf16=False,
        )
        trainer = GRPOTrainer(
            model=model, processing_class=tokenizer, reward_funcs=toy_reward, args=args, train_dataset=dataset
        )
        correct = count_correct(trainer, dataset, num_samples=1, prompts_per_batch=batch_size, seed=seed)
    return float(correct.mean())
