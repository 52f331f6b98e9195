"""pass@k on held-out prompts, for any GRPO trainer.

* :func:`pass_at_k`: the unbiased pass@k estimator of Chen et al., "Evaluating Large Language Models Trained on
  Code", arXiv:2107.03374: ``1 − C(n − c, k) / C(n, k)`` for ``c`` correct samples out of ``n``.
* :func:`count_correct`, :func:`evaluate_pass_at_k` and :class:`PassAtKCallback`: sample ``n`` completions per
  held-out prompt with the trainer's own generation path and settings, score them with its reward functions: the
  correct count per prompt, pass@k, or ``eval/pass@k`` logged.

The callback works with ``trl.GRPOTrainer`` and every trainer of this library (it uses only what TRL's trainer has).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
from transformers import Trainer, TrainerCallback

from ..core.trl.bridge import discard_reward_logs, generate_and_score
from ..core.trl.drift import PASS_AT_K_NAMES, check_trainer
from .counts import as_count


__all__ = ["PassAtKCallback", "count_correct", "evaluate_pass_at_k", "pass_at_k", "pass_at_k_values"]


def _pass_at_k_exact(n: int, c: int, k: int) -> float:
    if not n >= 1:
        raise ValueError(f"num_samples must be at least 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"num_correct must be between 0 and num_samples ({n}), got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and num_samples ({n}), got {k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    # Integer binomials and an exact fraction: no overflow and a correctly rounded result for any n.
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def _is_array(value) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray, list, tuple))


def pass_at_k(num_samples, num_correct, k):
    """The unbiased pass@k estimator ``1 − C(n − c, k) / C(n, k)`` (Chen et al., arXiv:2107.03374).

    The probability that at least one of ``k`` samples drawn without replacement from ``num_samples`` (``n``)
    samples, ``num_correct`` (``c``) of them correct, is correct. Computed exactly (integer binomials, then one
    rounding to float), so it neither overflows nor loses precision for any ``n``; ``c = 0`` gives 0 and
    ``n − c < k`` gives 1.

    Scalars give a ``float``. Any argument may be a ``torch.Tensor``, a NumPy array or a list: the three broadcast
    against each other and the result is a float64 array of the broadcast shape (a tensor on the first tensor
    argument's device when any argument is a tensor). Counts may be stored as floats but must be whole numbers.
    Raises ValueError naming the argument when ``n < 1``, ``c`` is outside ``[0, n]`` or ``k`` outside ``[1, n]``.
    """
    arguments = {"num_samples": num_samples, "num_correct": num_correct, "k": k}
    if not any(_is_array(value) for value in arguments.values()):
        n, c, kk = (as_count(value, name) for name, value in arguments.items())
        return _pass_at_k_exact(n, c, kk)
    device = next((value.device for value in arguments.values() if isinstance(value, torch.Tensor)), None)
    arrays = {}
    for name, value in arguments.items():
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.number):
            raise ValueError(f"{name} must hold integers, got an array of {array.dtype}")
        arrays[name] = array
    try:
        n_array, c_array, k_array = np.broadcast_arrays(*arrays.values())
    except ValueError as error:
        shapes = {name: array.shape for name, array in arrays.items()}
        raise ValueError(f"num_samples, num_correct and k must broadcast together, got shapes {shapes}") from error
    result = np.empty(n_array.shape, dtype=np.float64)
    for index in np.ndindex(n_array.shape):
        n, c, kk = (as_count(array[index].item(), name) for name, array in zip(arguments, (n_array, c_array, k_array)))
        result[index] = _pass_at_k_exact(n, c, kk)
    if device is not None:
        return torch.from_numpy(result).to(device)
    return result


def pass_at_k_values(num_samples: int) -> list[int]:
    """The ``k`` that an evaluation with ``num_samples`` samples per prompt reports: the powers of two up to
    ``num_samples``, and ``num_samples`` itself."""
    num_samples = as_count(num_samples, "num_samples")
    if num_samples < 1:
        raise ValueError(f"num_samples must be at least 1, got {num_samples}")
    ks = [2**i for i in range(num_samples.bit_length()) if 2**i <= num_samples]
    return ks if ks[-1] == num_samples else [*ks, num_samples]


# ---------------------------------------------------------------------------------------------------------------------
# Sampling and scoring held-out prompts with a trainer
# ---------------------------------------------------------------------------------------------------------------------


def _fork_rng(device: torch.device):
    """A context in which the global RNGs may be reseeded without changing the training's random stream."""
    devices = [device.index or 0] if device.type == "cuda" else []
    return torch.random.fork_rng(devices=devices)


@torch.no_grad()
def count_correct(
    trainer,
    dataset,
    num_samples: int = 16,
    *,
    reward_threshold: float = 1.0,
    prompts_per_batch: int | None = None,
    seed: int | None = None,
) -> np.ndarray:
    """How many of ``num_samples`` completions of ``trainer``'s current policy are correct, per row of ``dataset``:
    an int64 array in the dataset's order (what :func:`evaluate_pass_at_k` averages; keep it to resample problems).

    For every row of ``dataset`` (a ``datasets.Dataset`` or a list of dicts with a ``"prompt"`` column and the
    columns the reward functions read) the trainer samples ``num_samples`` completions through its own generation
    path (TRL's ``_tokenize_prompts`` and ``_generate_single_turn``: the same temperature, ``top_p``, ``top_k``,
    ``min_p``, repetition penalty, ``max_completion_length``, ``generation_kwargs``, chat template and backend,
    vLLM included, as training). Each completion is scored with the trainer's reward functions, weighted by its
    ``reward_weights`` as TRL combines them, and counts as correct when that reward is at least
    ``reward_threshold``; a completion every reward function scores ``None`` counts as wrong.

    Prompts are split evenly across processes (every process makes the same number of generation calls, as vLLM's
    server mode needs) and the counts are gathered, so every process returns the same values. Up to
    ``prompts_per_batch`` prompts (default: as many as fill one of the trainer's generation batches) are sampled
    per call. With ``seed`` the sampling is reproducible; either way the global random state is restored
    afterwards, so evaluating never changes the training run. Values a reward function passes to ``log_extra`` or
    ``log_metric`` during the evaluation are dropped.
    """
    num_samples = as_count(num_samples, "num_samples")
    if num_samples < 1:
        raise ValueError(f"num_samples must be at least 1, got {num_samples}")
    rows = list(dataset)
    if not rows:
        raise ValueError("dataset must hold at least one prompt")
    check_trainer(trainer, PASS_AT_K_NAMES)
    if prompts_per_batch is None:
        prompts_per_batch = max(1, trainer.args.generation_batch_size // num_samples)
    accelerator = trainer.accelerator
    world, rank = accelerator.num_processes, accelerator.process_index
    per_process = -(-len(rows) // world)
    # Pad with copies of the last prompt (index -1, dropped after the gather) so that every process has as many.
    shard = [index if index < len(rows) else -1 for index in range(rank * per_process, (rank + 1) * per_process)]
    correct = np.zeros(len(rows), dtype=np.int64)
    model = trainer.model
    was_training = model.training
    model.eval()
    try:
        with _fork_rng(accelerator.device):
            if seed is not None:
                torch.manual_seed(seed + rank)
            for start in range(0, per_process, prompts_per_batch):
                indices = shard[start : start + prompts_per_batch]
                inputs = [rows[index] for index in indices for _ in range(num_samples)]
                rewards_per_func = generate_and_score(trainer, inputs, num_samples)
                weights = trainer.reward_weights.to(rewards_per_func.device)
                rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
                is_correct = (rewards >= reward_threshold) & ~torch.isnan(rewards_per_func).all(dim=1)
                sample_index = torch.tensor(indices, device=accelerator.device).repeat_interleave(num_samples)
                sample_index = accelerator.gather(sample_index)  # the same process-major order as the rewards
                for index, hit in zip(sample_index.tolist(), is_correct.tolist(), strict=True):
                    if index >= 0:
                        correct[index] += int(hit)
    finally:
        discard_reward_logs(trainer)
        model.train(was_training)
    return correct


def evaluate_pass_at_k(
    trainer,
    dataset,
    num_samples: int = 16,
    *,
    reward_threshold: float = 1.0,
    ks: list[int] | None = None,
    prompts_per_batch: int | None = None,
    seed: int | None = None,
) -> dict[int, float]:
    """pass@k of ``trainer``'s current policy on ``dataset``: ``{k: mean over prompts of pass_at_k(n, c, k)}``, the
    counts ``c`` from :func:`count_correct` (which says how the completions are sampled and scored; the keyword
    arguments are its own). ``ks`` defaults to :func:`pass_at_k_values` of ``num_samples``.
    """
    num_samples = as_count(num_samples, "num_samples")
    ks = pass_at_k_values(num_samples) if ks is None else [as_count(k, "ks") for k in ks]
    for k in ks:
        if not 1 <= k <= num_samples:
            raise ValueError(f"ks must lie between 1 and num_samples ({num_samples}), got {k}")
    correct = count_correct(
        trainer,
        dataset,
        num_samples,
        reward_threshold=reward_threshold,
        prompts_per_batch=prompts_per_batch,
        seed=seed,
    )
    return {k: float(np.mean(pass_at_k(num_samples, correct, k))) for k in ks}


class PassAtKCallback(TrainerCallback):
    """Logs ``eval/pass@k`` (k = 1, 2, 4 … ``num_samples``) each time the trainer evaluates.

    Works with ``trl.GRPOTrainer`` and every trainer of this library::

        trainer = GRPOTrainer(..., eval_dataset=held_out, args=GRPOConfig(..., eval_strategy="steps", eval_steps=50))
        trainer.add_callback(PassAtKCallback(trainer, num_samples=16))

    On ``on_evaluate`` it runs :func:`evaluate_pass_at_k` on ``dataset`` (default: the trainer's ``eval_dataset``)
    and logs the values as one entry of the trainer's log at the current step (``trainer.state.log_history`` and
    every ``report_to`` integration). Sampling ``n`` completions per prompt costs ``n / num_generations_eval`` times
    TRL's own evaluation generation: keep the held-out set small. With ``seed`` (default: the training seed) each
    evaluation draws its samples from ``seed + global_step``, and never moves the training's random state.
    """

    def __init__(
        self,
        trainer,
        dataset=None,
        num_samples: int = 16,
        reward_threshold: float = 1.0,
        ks: list[int] | None = None,
        seed: int | None = None,
    ):
        dataset = trainer.eval_dataset if dataset is None else dataset
        if dataset is None or isinstance(dataset, dict):
            raise ValueError(
                "dataset must be given (a dataset of held-out prompts) when the trainer has no eval_dataset or a dict "
                "of several"
            )
        num_samples = as_count(num_samples, "num_samples")
        if num_samples < 1:
            raise ValueError(f"num_samples must be at least 1, got {num_samples}")
        if not math.isfinite(reward_threshold):
            raise ValueError(f"reward_threshold must be a finite number, got {reward_threshold}")
        self.trainer = trainer
        self.dataset = dataset
        self.num_samples = num_samples
        self.reward_threshold = reward_threshold
        self.ks = ks
        self.seed = trainer.args.seed if seed is None else seed

    def on_evaluate(self, args, state, control, **kwargs):
        values = evaluate_pass_at_k(
            self.trainer,
            self.dataset,
            self.num_samples,
            reward_threshold=self.reward_threshold,
            ks=self.ks,
            seed=self.seed + state.global_step,
        )
        # Trainer.log, not the GRPO trainer's override: that one would also flush the metrics it is accumulating.
        Trainer.log(self.trainer, {f"eval/pass@{k}": value for k, value in values.items()})
