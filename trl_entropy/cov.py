"""Clip-Cov and KL-Cov: restrain the few tokens whose covariance drives entropy collapse.

From Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv:2505.22617
(§4.2). The entropy of a softmax policy falls when the log-probability of the sampled tokens and their advantage are
positively correlated (ibid., Thm. 1). A small fraction of tokens carries most of that covariance. Both methods score
each valid token with its covariance term ``Cov_t = (ℓ_t − ℓ̄)(A_t − Ā)`` and restrain a few of the high-covariance
ones:

* **Clip-Cov** detaches, at random, ``n = max(⌊ρ·N_valid⌋, 1)`` tokens among those whose PPO clip is not already
  active and whose covariance lies in ``(lb, ub)``: their policy loss (and gradient) becomes 0, and they stay in the
  normaliser.
* **KL-Cov** drops the PPO clip altogether (per-token loss ``−A_t r_t``) and adds ``β_KL · |ℓ_t − ℓ^old_t|`` on the
  top ``k = max(⌊κ·N_valid⌋, 1)`` tokens by covariance.

Where the tokens are selected is ``cov_selection_scope``:

* ``"micro_batch"`` (default; the authors' code, verl's ``compute_policy_loss_clip_cov`` / ``_kl_cov``): in every
  loss step, over that micro-batch on that rank, from the current log-probs ``ℓ``. The selection then depends on the
  micro-batch size, the accumulation steps and the number of processes.
* ``"generation_batch"`` (ours): once per generation batch, before its loss steps, from the rollout log-probs
  ``ℓ^old`` (computed without gradient where TRL skips them), centred over the whole generation batch on all ranks,
  selected over that whole batch, and carried to the loss as a per-token mask (``COV_SELECTION_KEY``) that TRL splits
  into micro-batches with the rest of the batch. The same data selects the same tokens whatever the layout.

The selection rules are pure functions (:func:`ppo_clip_active`, :func:`clip_cov_selection`,
:func:`kl_cov_selection`, :func:`pooled_covariance`); the trainers plug them into the base's ``per_token_policy_loss``
hook and, for the generation-batch scope, into TRL's ``_generate_and_score_completions``.
"""

import hashlib
import math
import os
import warnings
from dataclasses import dataclass, field

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.models.utils import disable_gradient_checkpointing

from .base import CompletionBatch, EntropyGRPOConfig, EntropyGRPOTrainer
from .diagnostics import covariance_moments, token_covariance
from .validation import warn_if_on_policy


__all__ = [
    "COV_SELECTION_KEY",
    "COV_SELECTION_SCOPES",
    "ClipCovConfig",
    "ClipCovTrainer",
    "KLCovConfig",
    "KLCovTrainer",
    "clip_cov_selection",
    "generation_batch_seed",
    "kl_cov_selection",
    "pooled_covariance",
    "ppo_clip_active",
    "selection_count",
]

CLIP_COV_GENERATOR_FILE = "clip_cov_generator_{process_index}.pt"
COV_SELECTION_SCOPES = ("micro_batch", "generation_batch")
# The generation batch's per-token selection mask, (B, T) bool, under cov_selection_scope="generation_batch".
COV_SELECTION_KEY = "cov_selection"


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

    Masked positions are never chosen and do not count in ``N_valid``; with no valid token nothing is chosen. Among
    tokens tied at the k-th value the earlier ones in row-major order are chosen (a stable sort), so the choice is a
    function of the inputs alone.
    """
    valid = mask.bool()
    selected = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)
    valid_index = valid.flatten().nonzero().squeeze(1)
    count = selection_count(ratio, valid_index.numel())
    if count == 0:
        return selected
    order = torch.sort(cov.flatten()[valid_index], descending=True, stable=True).indices
    selected.view(-1)[valid_index[order[:count]]] = True
    return selected


def pooled_covariance(
    log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, moments: torch.Tensor
) -> torch.Tensor:
    """``Cov_t = (ℓ_t − ℓ̄)(A_t − Ā)`` in float64 with the means of a larger pool of tokens; 0 at masked positions.

    ``moments`` are :func:`trl_entropy.diagnostics.covariance_moments` summed over the pool (the whole generation
    batch on every rank), so ``ℓ̄ = Σmℓ / Σm`` and ``Ā = ΣmA / Σm`` are the pool's token-weighted means, not this
    tensor's. ``log_probs`` is ``(B, T)``; ``advantages`` is ``(B,)``, ``(B, 1)`` or ``(B, T)``.
    """
    count, sum_log_probs, sum_advantages = moments[:3].double().tolist()
    count = max(count, 1.0)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    centred_log_probs = log_probs.detach().double() - sum_log_probs / count
    centred_advantages = advantages.detach().double() - sum_advantages / count
    return centred_log_probs * centred_advantages * mask.double()


def generation_batch_seed(seed: int, step: int) -> int:
    """Seed of Clip-Cov's draw over the generation batch made at optimizer step ``step`` of a run seeded ``seed``.

    A fixed function of the two (the first 8 bytes of a SHA-256), so every rank draws the same tokens and a resumed
    run draws what the uninterrupted run drew, with no generator state to save.
    """
    digest = hashlib.sha256(f"clip_cov:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


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


PAPER = "Cui et al., arXiv:2505.22617"


@dataclass
class CovSelectionConfig(EntropyGRPOConfig):
    r"""
    What [`ClipCovConfig`] and [`KLCovConfig`] share: where the covariance selection is made.

    Parameters:
        cov_selection_scope (`str`, *optional*, defaults to `"micro_batch"`):
            `"micro_batch"`: select in every loss step over its micro-batch on its rank, from the current log-probs
            (the authors' code). `"generation_batch"`: select once per generation batch over the whole batch on all
            ranks, from the rollout log-probs, so the selection does not depend on the micro-batch size, the
            accumulation steps or the number of processes.
    """

    cov_selection_scope: str = field(
        default="micro_batch",
        metadata={
            "help": "Where Clip-Cov/KL-Cov select their tokens. 'micro_batch' (default, the authors' code): in every "
            "loss step over its micro-batch on its rank, from the current log-probs; the selection depends on the "
            "micro-batch size, accumulation and number of processes. 'generation_batch' (ours): once per generation "
            "batch over the whole batch on all ranks, from the rollout log-probs (one extra no-gradient forward pass "
            "per generation batch where TRL does not compute them); the selection is the same for any layout.",
            "choices": list(COV_SELECTION_SCOPES),
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.cov_selection_scope not in COV_SELECTION_SCOPES:
            raise ValueError(
                f"cov_selection_scope={self.cov_selection_scope!r} is invalid: choose one of "
                f"{list(COV_SELECTION_SCOPES)}."
            )
        _reject_sequence_level(self)


@dataclass
class ClipCovConfig(CovSelectionConfig):
    r"""
    Configuration for [`ClipCovTrainer`]: [`EntropyGRPOConfig`] plus Clip-Cov's selection (Cui et al., "The Entropy
    Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv:2505.22617, §4.2).

    The PPO clip range is GRPOConfig's `epsilon` (0.2, the paper's ε) and `epsilon_high`. All four loss types are
    supported; `importance_sampling_level` must be `"token"`.

    Parameters:
        clip_cov_ratio (`float`, *optional*, defaults to `2e-4`):
            ρ: the detached tokens number `max(floor(ρ · N_valid), 1)` per micro-batch (per generation batch with
            `cov_selection_scope="generation_batch"`). Paper §4.3.
        clip_cov_lb (`float`, *optional*, defaults to `1.0`):
            Lower bound of the candidates' covariance (exclusive). Paper §4.3.
        clip_cov_ub (`float`, *optional*, defaults to `5.0`):
            Upper bound of the candidates' covariance (exclusive). Paper §4.3.
        cov_selection_scope (`str`, *optional*, defaults to `"micro_batch"`):
            See [`CovSelectionConfig`].
    """

    clip_cov_ratio: float = field(
        default=2e-4,
        metadata={
            "help": "ρ: fraction of the valid tokens to detach, max(floor(ρ·N_valid), 1) tokens drawn at random among "
            "the candidates, N_valid counted over the selection scope (micro-batch or generation batch). In (0, 1]. "
            f"Default from the paper ({PAPER}, §4.3) and verl."
        },
    )
    clip_cov_lb: float = field(
        default=1.0,
        metadata={
            "help": "Lower bound (exclusive) of a candidate's covariance (ℓ_t − ℓ̄)(A_t − Ā). Default from the paper "
            f"({PAPER}, §4.3) and verl."
        },
    )
    clip_cov_ub: float = field(
        default=5.0,
        metadata={
            "help": "Upper bound (exclusive) of a candidate's covariance; must exceed clip_cov_lb. Default from the "
            f"paper ({PAPER}, §4.3) and verl."
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


@dataclass
class KLCovConfig(CovSelectionConfig):
    r"""
    Configuration for [`KLCovTrainer`]: [`EntropyGRPOConfig`] plus KL-Cov's penalty (Cui et al., "The Entropy
    Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv:2505.22617, §4.2).

    KL-Cov replaces the PPO clip: `epsilon`/`epsilon_high` do not enter the loss (they only set the `clip_ratio/*`
    diagnostics) and `delta` (a clip of the ratio) is rejected. All four loss types are supported;
    `importance_sampling_level` must be `"token"`.

    Parameters:
        kl_cov_ratio (`float`, *optional*, defaults to `2e-3`):
            κ: the penalised tokens number `max(floor(κ · N_valid), 1)` per micro-batch (per generation batch with
            `cov_selection_scope="generation_batch"`). Paper §4.3 (7B; 2e-4 at 32B).
        kl_cov_coef (`float`, *optional*, defaults to `1.0`):
            β_KL: weight of the penalty `|ℓ_t − ℓ^old_t|` on the selected tokens. Paper §4.3.
        cov_selection_scope (`str`, *optional*, defaults to `"micro_batch"`):
            See [`CovSelectionConfig`].
    """

    kl_cov_ratio: float = field(
        default=2e-3,
        metadata={
            "help": "κ: fraction of the valid tokens penalised, the top max(floor(κ·N_valid), 1) by covariance, "
            "N_valid counted over the selection scope (micro-batch or generation batch). In (0, 1]. Default from the "
            f"paper's 7B setting ({PAPER}, §4.3); it used 2e-4 at 32B."
        },
    )
    kl_cov_coef: float = field(
        default=1.0,
        metadata={
            "help": "β_KL: weight of the penalty |ℓ_t − ℓ^old_t| on the selected tokens; >= 0. Default from the paper "
            f"({PAPER}, §4.3) and verl."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        _check_ratio("kl_cov_ratio", self.kl_cov_ratio)
        coef = self.kl_cov_coef
        if not (isinstance(coef, (int, float)) and not isinstance(coef, bool) and math.isfinite(coef) and coef >= 0):
            raise ValueError(f"kl_cov_coef={coef!r} is invalid: it must be a finite number >= 0.")
        if self.delta is not None:
            raise ValueError(
                f"delta={self.delta!r} is not supported by KLCovConfig: delta clips the importance ratio, and KL-Cov "
                "replaces ratio clipping by its covariance-targeted KL penalty. Leave delta=None."
            )


# ---------------------------------------------------------------------------------------------------------------------
# Trainers
# ---------------------------------------------------------------------------------------------------------------------


def _mode(trainer) -> str:
    return "train" if trainer.model.training else "eval"


class CovSelectionTrainer(EntropyGRPOTrainer):
    """What Clip-Cov and KL-Cov share: the covariance selection, per micro-batch or once per generation batch.

    Subclasses define :meth:`select_tokens` (their rule over a pool of covariance terms). With
    ``cov_selection_scope="generation_batch"``, :meth:`select_over_generation_batch` runs on every generation batch
    TRL produces and stores its mask under ``COV_SELECTION_KEY``; TRL's shuffle and split carry it to each micro-batch,
    where :meth:`carried_selection` reads it.
    """

    config_class = CovSelectionConfig
    _carried_selection: torch.Tensor | None = None

    def select_tokens(self, cov: torch.Tensor, mask: torch.Tensor, clip_active: torch.Tensor | None, mode: str):
        """The method's selection over ``cov`` (bool, shaped like ``cov``); ``clip_active``: where the clip binds."""
        raise NotImplementedError

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.args.cov_selection_scope == "generation_batch":
            output[COV_SELECTION_KEY] = self.select_over_generation_batch(output)
        return output

    def select_over_generation_batch(self, batch: dict) -> torch.Tensor:
        """The selection over a whole generation batch on all ranks, as this rank's ``(B, T)`` bool mask.

        ``Cov_t`` uses the rollout log-probs ``ℓ^old`` and the advantages, centred over every valid token of the
        generation batch on every rank. The valid tokens' terms are pooled in rank order (each rank's tokens in
        row-major order), the method selects over the pool exactly as it would over one micro-batch (at the rollout
        policy every ratio is 1, so no clip is active), and each rank keeps its own part. Collective: every rank must
        call it.
        """
        mask = batch["completion_mask"]
        if "tool_mask" in batch:
            mask = mask * batch["tool_mask"]
        log_probs = batch.get("old_per_token_logps")
        if log_probs is None:
            log_probs = self._rollout_log_probs(batch)
        moments = self.accelerator.reduce(covariance_moments(log_probs, batch["advantages"], mask), reduction="sum")
        cov = pooled_covariance(log_probs, batch["advantages"], mask, moments)
        valid = mask.bool()
        pool, offset = self._pool_in_rank_order(cov[valid])
        pool = pool.unsqueeze(0)
        no_clip = torch.zeros_like(pool, dtype=torch.bool)
        pooled_selection = self.select_tokens(pool, torch.ones_like(pool), no_clip, _mode(self))
        selected = torch.zeros_like(valid)
        selected[valid] = pooled_selection[0, offset : offset + int(valid.sum())]
        return selected

    def _rollout_log_probs(self, batch: dict) -> torch.Tensor:
        """ℓ^old where TRL skipped it (on-policy): one forward pass without gradient, as TRL makes it off-policy."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        if self.model.training:
            batch_size = self.args.per_device_train_batch_size
        else:
            batch_size = self.args.per_device_eval_batch_size
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            log_probs, _, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, batch["completion_ids"].size(1), batch_size=batch_size
            )
        return log_probs

    def _pool_in_rank_order(self, values: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Every rank's 1-D ``values`` concatenated in rank order, and where this rank's part starts."""
        if self.accelerator.num_processes == 1:
            return values, 0
        counts = self.accelerator.gather(torch.tensor([values.numel()], device=values.device)).tolist()
        padded = self.accelerator.gather(self.accelerator.pad_across_processes(values, dim=0))
        padded = padded.view(self.accelerator.num_processes, -1)
        pool = torch.cat([padded[rank, :count] for rank, count in enumerate(counts)])
        return pool, sum(counts[: self.accelerator.process_index])

    def _compute_loss(self, model, inputs):
        # The hooks see a CompletionBatch, not the batch dict: keep this micro-batch's part of the selection at hand.
        self._carried_selection = inputs.get(COV_SELECTION_KEY)
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._carried_selection = None

    def carried_selection(self) -> torch.Tensor:
        """The current micro-batch's part of its generation batch's selection (``"generation_batch"`` scope)."""
        if self._carried_selection is None:
            raise KeyError(
                f"cov_selection_scope='generation_batch' but the batch has no {COV_SELECTION_KEY!r} mask: it is made "
                "in _generate_and_score_completions; for a hand-built batch, set it from "
                "select_over_generation_batch(batch)."
            )
        return self._carried_selection.bool()


class ClipCovTrainer(CovSelectionTrainer):
    """GRPO with Clip-Cov (Cui et al., arXiv:2505.22617, §4.2): a few random high-covariance tokens are detached from
    the policy loss.

    ``cov_selection_scope="micro_batch"``: the random choice uses a CPU ``torch.Generator`` seeded with
    ``args.seed + process_index`` (one per rank, so each rank is reproducible and ranks draw differently), and a
    separate one, seeded alike, for evaluation so evaluating never shifts the training draws. The training generator's
    state is saved in every checkpoint (``clip_cov_generator_<rank>.pt``) and restored by ``resume_from_checkpoint``.

    ``cov_selection_scope="generation_batch"``: the draw over a training generation batch uses a generator seeded with
    :func:`generation_batch_seed` of ``args.seed`` and the optimizer step, the same on every rank and after a resume
    (so checkpoints hold no generator state). Evaluation draws from its own generator seeded with ``args.seed`` (the
    same on every rank). In the loss, a drawn token whose clip is active at that step is left as it is (its policy
    gradient is already zero): the draw is made before any ratio is known, where every ratio is 1.
    """

    config_class = ClipCovConfig
    _tag_names = ["trl", "grpo", "trl-entropy", "clip-cov"]

    def __init__(self, *positional, **keyword):
        super().__init__(*positional, **keyword)
        seed = self.args.seed
        if self.args.cov_selection_scope == "micro_batch":
            seed += self.accelerator.process_index
        self._clip_cov_generators = {mode: torch.Generator().manual_seed(seed) for mode in ("train", "eval")}

    def select_tokens(self, cov, mask, clip_active, mode):
        if self.args.cov_selection_scope == "generation_batch" and mode == "train":
            generator = torch.Generator().manual_seed(generation_batch_seed(self.args.seed, self.state.global_step))
        else:
            generator = self._clip_cov_generators[mode]
        args = self.args
        return clip_cov_selection(
            cov, mask, clip_active, args.clip_cov_ratio, args.clip_cov_lb, args.clip_cov_ub, generator
        )

    def per_token_policy_loss(
        self, batch: CompletionBatch, ratio: torch.Tensor, advantages: torch.Tensor
    ) -> torch.Tensor:
        per_token_loss = super().per_token_policy_loss(batch, ratio, advantages)
        epsilon_low, epsilon_high = self.clip_range()
        mode = _mode(self)
        with torch.no_grad():
            clip_active = ppo_clip_active(ratio, advantages, epsilon_low, epsilon_high, self.args.delta)
            clip_active = clip_active.expand_as(per_token_loss)
            if self.args.cov_selection_scope == "micro_batch":
                cov = token_covariance(batch.log_probs, advantages, batch.mask)
                detached = self.select_tokens(cov, batch.mask, clip_active, mode)
            else:
                detached = self.carried_selection() & ~clip_active
        self._metrics[mode]["clip_cov/detached_fraction"].append(self._global_mean(detached.float(), batch.mask))
        return torch.where(detached, torch.zeros_like(per_token_loss), per_token_loss)

    def _save_checkpoint(self, model, trial):
        # Written before Trainer's own save, which pushes the folder to the Hub (push_to_hub) as its last step. The
        # generation-batch draws need no state: they are seeded by the step.
        if self.args.cov_selection_scope == "micro_batch":
            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, CLIP_COV_GENERATOR_FILE.format(process_index=self.accelerator.process_index))
            torch.save(self._clip_cov_generators["train"].get_state(), path)
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None or self.args.cov_selection_scope != "micro_batch":
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


class KLCovTrainer(CovSelectionTrainer):
    """GRPO with KL-Cov (Cui et al., arXiv:2505.22617, §4.2): no ratio clip; a KL penalty on the top-covariance
    tokens. Warns once, at construction, when training is fully on-policy (the penalty is then identically 0)."""

    config_class = KLCovConfig
    _tag_names = ["trl", "grpo", "trl-entropy", "kl-cov"]

    def __init__(self, *positional, **keyword):
        super().__init__(*positional, **keyword)
        warn_if_on_policy(
            self.args,
            "KL-Cov",
            "ℓ^old = ℓ at every step, so the penalty |ℓ − ℓ^old| and its gradient are 0 and the loss is the unclipped "
            "−A·r.",
            "the penalty to act (the paper makes 8 updates per rollout batch)",
            stacklevel=2,
        )

    def select_tokens(self, cov, mask, clip_active, mode):
        return kl_cov_selection(cov, mask, self.args.kl_cov_ratio)

    def per_token_policy_loss(
        self, batch: CompletionBatch, ratio: torch.Tensor, advantages: torch.Tensor
    ) -> torch.Tensor:
        mode = _mode(self)
        if self.args.cov_selection_scope == "micro_batch":
            with torch.no_grad():
                cov = token_covariance(batch.log_probs, advantages, batch.mask)
                selected = self.select_tokens(cov, batch.mask, None, mode)
        else:
            selected = self.carried_selection()
        penalty = (batch.log_probs - batch.old_log_probs).abs()
        per_token_loss = -advantages * ratio + self.args.kl_cov_coef * penalty * selected
        self._metrics[mode]["kl_cov/penalised_fraction"].append(self._global_mean(selected.float(), batch.mask))
        self._metrics[mode]["kl_cov/abs_log_ratio"].append(self._global_mean(penalty, batch.mask))
        return per_token_loss
