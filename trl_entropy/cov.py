"""Clip-Cov and KL-Cov (seed 001, §4.2): restrain the few tokens whose covariance drives entropy collapse.

The entropy of a softmax policy falls when the log-probability of the sampled tokens and their advantage are
positively correlated (seed 001, Thm. 1). A small fraction of tokens carries most of that covariance. Both methods
score each valid token of a micro-batch with its covariance term ``Cov_t = (ℓ_t − ℓ̄)(A_t − Ā)``
(:func:`trl_entropy.diagnostics.token_covariance`) and restrain a few of the high-covariance ones:

* **Clip-Cov** detaches, at random, ``n = max(⌊ρ·N_valid⌋, 1)`` tokens among those whose PPO clip is not already
  active and whose covariance lies in ``(lb, ub)``: their policy loss (and gradient) becomes 0, and they stay in the
  normaliser.
* **KL-Cov** drops the PPO clip altogether (per-token loss ``−A_t r_t``) and adds ``β_KL · |ℓ_t − ℓ^old_t|`` on the
  top ``k = max(⌊κ·N_valid⌋, 1)`` tokens by covariance.

The selection rules are pure functions (:func:`ppo_clip_active`, :func:`clip_cov_selection`,
:func:`kl_cov_selection`); the trainers plug them into the base's ``per_token_policy_loss`` hook. The reference
implementation is verl's ``compute_policy_loss_clip_cov`` / ``compute_policy_loss_kl_cov`` (by the paper's authors).
"""

import math
import os
import warnings
from dataclasses import dataclass, field

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .base import CompletionBatch, EntropyGRPOConfig, EntropyGRPOTrainer
from .diagnostics import token_covariance


__all__ = [
    "ClipCovConfig",
    "ClipCovTrainer",
    "KLCovConfig",
    "KLCovTrainer",
    "clip_cov_selection",
    "kl_cov_selection",
    "ppo_clip_active",
    "selection_count",
]

CLIP_COV_GENERATOR_FILE = "clip_cov_generator_{process_index}.pt"


# ---------------------------------------------------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------------------------------------------------


def selection_count(ratio: float, num_valid: int) -> int:
    """``max(⌊ratio · num_valid⌋, 1)`` tokens, or 0 when no token is valid (the count verl computes)."""
    if num_valid <= 0:
        return 0
    return max(math.floor(ratio * num_valid), 1)


def ppo_clip_active(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
) -> torch.Tensor:
    """Where the clipped surrogate ``−min(min(r, δ)·A, clip(r, 1−ε_low, 1+ε_high)·A)`` is already flat in ``r``.

    Without ``delta`` this is verl's ``clip_by_origin`` (the clipped term strictly wins the min):
    ``(r > 1+ε_high and A > 0) or (r < 1−ε_low and A < 0)``. With TRL's two-sided ``delta`` the tokens capped by
    ``delta`` are flat too: ``A > 0`` and ``r > min(1+ε_high, δ)``, or ``A < 0`` and ``r > max(1+ε_high, δ)``.
    Such tokens already get no policy gradient, so Clip-Cov never spends its budget on them. Inequalities are strict,
    as in verl. Returns a bool tensor of the broadcast shape of ``ratio`` and ``advantages``.
    """
    upper = 1 + epsilon_high
    upper_positive = upper if delta is None else min(upper, delta)
    upper_negative = math.inf if delta is None else max(upper, delta)
    positive = (advantages > 0) & (ratio > upper_positive)
    negative = (advantages < 0) & ((ratio < 1 - epsilon_low) | (ratio > upper_negative))
    return positive | negative


def clip_cov_selection(
    cov: torch.Tensor,
    mask: torch.Tensor,
    clip_active: torch.Tensor,
    ratio: float,
    lb: float,
    ub: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """Clip-Cov's detached tokens: a uniformly random subset of the candidates, as a bool ``(B, T)`` tensor.

    Candidates are the valid tokens (``mask`` set) whose clip is not active and with ``lb < cov < ub``. The subset
    has ``n = max(⌊ratio · N_valid⌋, 1)`` of them (all of them if there are fewer), ``N_valid`` being the number of
    valid tokens. The choice is ``torch.randperm(num_candidates, generator=generator)[:n]`` over the candidates in
    row-major order, drawn on the generator's device; the generator is advanced only when a choice is actually made
    (more candidates than ``n``), so the same inputs and generator state always give the same subset.
    """
    valid = mask.bool()
    candidates = valid & ~clip_active.bool() & (cov > lb) & (cov < ub)
    selected = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)
    count = selection_count(ratio, int(valid.sum().item()))
    candidate_index = candidates.flatten().nonzero().squeeze(1)
    if candidate_index.numel() > count:
        order = torch.randperm(candidate_index.numel(), generator=generator, device=generator.device)
        candidate_index = candidate_index[order[:count].to(candidate_index.device)]
    selected.view(-1)[candidate_index] = True
    return selected


def kl_cov_selection(cov: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """KL-Cov's penalised tokens: the top ``k = max(⌊ratio · N_valid⌋, 1)`` valid tokens by ``cov``, bool ``(B, T)``.

    Masked positions are never chosen and do not count in ``N_valid``; with no valid token nothing is chosen. Ties at
    the k-th value are broken by ``torch.topk`` (any of the tied tokens may be chosen).
    """
    valid = mask.bool()
    selected = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)
    valid_index = valid.flatten().nonzero().squeeze(1)
    count = selection_count(ratio, valid_index.numel())
    if count == 0:
        return selected
    top = torch.topk(cov.flatten()[valid_index], count, largest=True, sorted=False).indices
    selected.view(-1)[valid_index[top]] = True
    return selected


# ---------------------------------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------------------------------


def _check_ratio(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1):
        raise ValueError(f"{name}={value!r} is invalid: it must be in (0, 1] (a fraction of the valid tokens).")


def _reject_sequence_level(config) -> None:
    if config.importance_sampling_level != "token":
        raise ValueError(
            f"importance_sampling_level={config.importance_sampling_level!r} is not supported by "
            f"{type(config).__name__}: it selects individual tokens by their covariance, so it needs one importance "
            "ratio per token. Use importance_sampling_level='token'."
        )


@dataclass
class ClipCovConfig(EntropyGRPOConfig):
    r"""
    Configuration for [`ClipCovTrainer`]: [`EntropyGRPOConfig`] plus Clip-Cov's selection (seed 001, §4.2).

    The PPO clip range is GRPOConfig's `epsilon` (0.2, the paper's ε) and `epsilon_high`. All four loss types are
    supported; `importance_sampling_level` must be `"token"`.

    Parameters:
        clip_cov_ratio (`float`, *optional*, defaults to `2e-4`):
            ρ: the detached tokens number `max(floor(ρ · N_valid), 1)` per micro-batch. Paper §4.3.
        clip_cov_lb (`float`, *optional*, defaults to `1.0`):
            Lower bound of the candidates' covariance (exclusive). Paper §4.3.
        clip_cov_ub (`float`, *optional*, defaults to `5.0`):
            Upper bound of the candidates' covariance (exclusive). Paper §4.3.
    """

    clip_cov_ratio: float = field(
        default=2e-4,
        metadata={
            "help": "ρ: fraction of the micro-batch's valid tokens to detach, max(floor(ρ·N_valid), 1) tokens, drawn "
            "at random among the candidates. In (0, 1]. Default from the paper (seed 001, §4.3) and verl."
        },
    )
    clip_cov_lb: float = field(
        default=1.0,
        metadata={
            "help": "Lower bound (exclusive) of a candidate's covariance (ℓ_t − ℓ̄)(A_t − Ā). Default from the paper "
            "(seed 001, §4.3) and verl."
        },
    )
    clip_cov_ub: float = field(
        default=5.0,
        metadata={
            "help": "Upper bound (exclusive) of a candidate's covariance; must exceed clip_cov_lb. Default from the "
            "paper (seed 001, §4.3) and verl."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        _check_ratio("clip_cov_ratio", self.clip_cov_ratio)
        bounds = (self.clip_cov_lb, self.clip_cov_ub)
        if not (
            all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds) and bounds[0] < bounds[1]
        ):
            raise ValueError(
                "clip_cov_lb and clip_cov_ub must be numbers with clip_cov_lb < clip_cov_ub, got "
                f"clip_cov_lb={self.clip_cov_lb!r} and clip_cov_ub={self.clip_cov_ub!r}."
            )
        _reject_sequence_level(self)


@dataclass
class KLCovConfig(EntropyGRPOConfig):
    r"""
    Configuration for [`KLCovTrainer`]: [`EntropyGRPOConfig`] plus KL-Cov's penalty (seed 001, §4.2).

    KL-Cov replaces the PPO clip: `epsilon`/`epsilon_high` do not enter the loss (they only set the `clip_ratio/*`
    diagnostics) and `delta` (a clip of the ratio) is rejected. All four loss types are supported;
    `importance_sampling_level` must be `"token"`.

    Parameters:
        kl_cov_ratio (`float`, *optional*, defaults to `2e-3`):
            κ: the penalised tokens number `max(floor(κ · N_valid), 1)` per micro-batch. Paper §4.3 (7B; 2e-4 at 32B).
        kl_cov_coef (`float`, *optional*, defaults to `1.0`):
            β_KL: weight of the penalty `|ℓ_t − ℓ^old_t|` on the selected tokens. Paper §4.3.
    """

    kl_cov_ratio: float = field(
        default=2e-3,
        metadata={
            "help": "κ: fraction of the micro-batch's valid tokens penalised, the top max(floor(κ·N_valid), 1) by "
            "covariance. In (0, 1]. Default from the paper's 7B setting (seed 001, §4.3); it used 2e-4 at 32B."
        },
    )
    kl_cov_coef: float = field(
        default=1.0,
        metadata={
            "help": "β_KL: weight of the penalty |ℓ_t − ℓ^old_t| on the selected tokens; >= 0. Default from the paper "
            "(seed 001, §4.3) and verl."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        _check_ratio("kl_cov_ratio", self.kl_cov_ratio)
        coef = self.kl_cov_coef
        if not (isinstance(coef, (int, float)) and not isinstance(coef, bool) and math.isfinite(coef) and coef >= 0):
            raise ValueError(f"kl_cov_coef={coef!r} is invalid: it must be a finite number >= 0.")
        _reject_sequence_level(self)
        if self.delta is not None:
            raise ValueError(
                f"delta={self.delta!r} is not supported by KLCovConfig: delta clips the importance ratio, and KL-Cov "
                "replaces ratio clipping by its covariance-targeted KL penalty. Leave delta=None."
            )
        generate_every = self.steps_per_generation * self.num_iterations
        if self.gradient_accumulation_steps % generate_every == 0:
            warnings.warn(
                "KL-Cov with fully on-policy updates (gradient_accumulation_steps is a multiple of "
                f"steps_per_generation * num_iterations = {generate_every}): ℓ^old = ℓ at every step, so the penalty "
                "|ℓ − ℓ^old| and its gradient are 0 and the loss is the unclipped −A·r. Set num_iterations > 1 or "
                "steps_per_generation > gradient_accumulation_steps for the penalty to act (the paper makes 8 "
                "updates per rollout batch).",
                stacklevel=3,
            )


# ---------------------------------------------------------------------------------------------------------------------
# Trainers
# ---------------------------------------------------------------------------------------------------------------------


def _mode(trainer) -> str:
    return "train" if trainer.model.training else "eval"


class ClipCovTrainer(EntropyGRPOTrainer):
    """GRPO with Clip-Cov (seed 001, §4.2): a few random high-covariance tokens are detached from the policy loss.

    The random choice uses a CPU ``torch.Generator`` seeded with ``args.seed + process_index`` (one per rank, so each
    rank is reproducible and ranks draw differently), and a separate one, seeded alike, for evaluation so evaluating
    never shifts the training draws. The training generator's state is saved in every checkpoint
    (``clip_cov_generator_<rank>.pt``) and restored by ``resume_from_checkpoint``.
    """

    config_class = ClipCovConfig
    _tag_names = ["trl", "grpo", "trl-entropy", "clip-cov"]

    def __init__(self, *positional, **keyword):
        super().__init__(*positional, **keyword)
        seed = self.args.seed + self.accelerator.process_index
        self._clip_cov_generators = {mode: torch.Generator().manual_seed(seed) for mode in ("train", "eval")}

    def per_token_policy_loss(
        self, batch: CompletionBatch, ratio: torch.Tensor, advantages: torch.Tensor
    ) -> torch.Tensor:
        per_token_loss = super().per_token_policy_loss(batch, ratio, advantages)
        epsilon_low, epsilon_high = self.clip_range()
        mode = _mode(self)
        with torch.no_grad():
            clip_active = ppo_clip_active(ratio, advantages, epsilon_low, epsilon_high, self.args.delta)
            cov = token_covariance(batch.log_probs, advantages, batch.mask)
            selected = clip_cov_selection(
                cov,
                batch.mask,
                clip_active.expand_as(cov),
                self.args.clip_cov_ratio,
                self.args.clip_cov_lb,
                self.args.clip_cov_ub,
                self._clip_cov_generators[mode],
            )
        self._metrics[mode]["clip_cov/detached_fraction"].append(self._global_mean(selected.float(), batch.mask))
        return torch.where(selected, torch.zeros_like(per_token_loss), per_token_loss)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, CLIP_COV_GENERATOR_FILE.format(process_index=self.accelerator.process_index))
        torch.save(self._clip_cov_generators["train"].get_state(), path)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, CLIP_COV_GENERATOR_FILE.format(process_index=self.accelerator.process_index))
        if not os.path.exists(path):
            warnings.warn(
                f"{path} is missing: Clip-Cov's token selection restarts from its seed instead of continuing the "
                "checkpointed random stream",
                stacklevel=2,
            )
            return
        self._clip_cov_generators["train"].set_state(torch.load(path, weights_only=True))


class KLCovTrainer(EntropyGRPOTrainer):
    """GRPO with KL-Cov (seed 001, §4.2): no ratio clip; a KL penalty on the top-covariance tokens."""

    config_class = KLCovConfig
    _tag_names = ["trl", "grpo", "trl-entropy", "kl-cov"]

    def per_token_policy_loss(
        self, batch: CompletionBatch, ratio: torch.Tensor, advantages: torch.Tensor
    ) -> torch.Tensor:
        with torch.no_grad():
            cov = token_covariance(batch.log_probs, advantages, batch.mask)
            selected = kl_cov_selection(cov, batch.mask, self.args.kl_cov_ratio)
        penalty = (batch.log_probs - batch.old_log_probs).abs()
        per_token_loss = -advantages * ratio + self.args.kl_cov_coef * penalty * selected
        mode = _mode(self)
        self._metrics[mode]["kl_cov/penalised_fraction"].append(self._global_mean(selected.float(), batch.mask))
        self._metrics[mode]["kl_cov/abs_log_ratio"].append(self._global_mean(penalty, batch.mask))
        return per_token_loss
