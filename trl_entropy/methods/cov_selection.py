"""What Clip-Cov and KL-Cov share: the covariance term of each token, how many tokens to select, and where the
selection is made (Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
arXiv:2505.22617, §4.2; each method's docs page).

The entropy of a softmax policy falls when the log-probability of the sampled tokens and their advantage are
positively correlated (ibid., Thm. 1), and a small fraction of tokens carries most of that covariance. Both methods
score each valid token with ``Cov_t = (ℓ_t − ℓ̄)(A_t − Ā)`` (eq. 10) and restrain ``max(⌊r·N_valid⌋, 1)`` of them.
Where the tokens are selected is ``cov_selection_scope``:

* ``"micro_batch"`` (default; the authors' code): in every loss step, over that micro-batch on that rank, from the
  current log-probs ``ℓ``. The selection then depends on the micro-batch size, the accumulation steps and the number
  of processes.
* ``"generation_batch"`` (ours): once per generation batch, before its loss steps, from the rollout log-probs
  ``ℓ^old`` (computed without gradient where TRL skips them), centred over the whole generation batch on all ranks,
  selected over that whole batch, and carried to the loss as a per-token mask (``COV_SELECTION_KEY``) that TRL splits
  into micro-batches with the rest of the batch. The same data selects the same tokens whatever the layout.
"""

import math
from dataclasses import dataclass

import torch
from trl.models.utils import disable_gradient_checkpointing

from ..core.batch import CompletionBatch
from ..core.citation import Paper
from ..core.config import EntropyGRPOBaseConfig, config_field
from ..core.parts import MethodPart
from ..core.statistics import covariance_moments, pooled_covariance


COV_SELECTION_SCOPES = ("micro_batch", "generation_batch")
# The generation batch's per-token selection mask, (B, T) bool, under cov_selection_scope="generation_batch".
COV_SELECTION_KEY = "cov_selection"
PAPER = "Cui et al., arXiv:2505.22617"
# Both methods' paper, which their model cards cite (next to GRPO's).
COV_PAPER = Paper(
    "cui2025entropy",
    "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    "2505.22617",
    2025,
    "Ganqu Cui and others",
)


def selection_count(ratio: float, num_valid: int) -> int:
    """``max(⌊ratio · num_valid⌋, 1)`` tokens, or 0 when no token is valid (the count verl computes)."""
    if num_valid <= 0:
        return 0
    return max(math.floor(ratio * num_valid), 1)


class CovSelectionPart(MethodPart):
    """What Clip-Cov's and KL-Cov's parts share: the covariance selection, per micro-batch or once per generation
    batch.

    Subclasses define :meth:`select_tokens` (their rule over a pool of covariance terms). With
    ``cov_selection_scope="generation_batch"``, :meth:`select_over_generation_batch` runs on every generation batch
    (the ``on_generation_batch`` hook) and stores its mask under ``COV_SELECTION_KEY``; TRL's shuffle and split carry
    it to each micro-batch, where :meth:`carried_selection` reads it.
    """

    carried_token_keys = (COV_SELECTION_KEY,)

    def select_tokens(self, cov: torch.Tensor, mask: torch.Tensor, clip_active: torch.Tensor | None, mode: str):
        """The method's selection over ``cov`` (bool, shaped like ``cov``); ``clip_active``: where the clip binds."""
        raise NotImplementedError

    def on_generation_batch(self, batch: dict) -> None:
        if self.args.cov_selection_scope == "generation_batch":
            batch[COV_SELECTION_KEY] = self.select_over_generation_batch(batch)

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
        accelerator = self.trainer.accelerator
        moments = accelerator.reduce(covariance_moments(log_probs, batch["advantages"], mask), reduction="sum")
        cov = pooled_covariance(log_probs, batch["advantages"], mask, moments)
        valid = mask.bool()
        pool, offset = self._pool_in_rank_order(cov[valid])
        pool = pool.unsqueeze(0)
        no_clip = torch.zeros_like(pool, dtype=torch.bool)
        pooled_selection = self.select_tokens(pool, torch.ones_like(pool), no_clip, self.trainer.mode)
        selected = torch.zeros_like(valid)
        selected[valid] = pooled_selection[0, offset : offset + int(valid.sum())]
        return selected

    def _rollout_log_probs(self, batch: dict) -> torch.Tensor:
        """ℓ^old where TRL skipped it (on-policy): one forward pass without gradient, as TRL makes it off-policy."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        trainer = self.trainer
        if trainer.mode == "train":
            batch_size = self.args.per_device_train_batch_size
        else:
            batch_size = self.args.per_device_eval_batch_size
        with torch.no_grad(), disable_gradient_checkpointing(trainer.model, self.args.gradient_checkpointing_kwargs):
            scored = trainer.score_tokens(
                trainer.model,
                input_ids,
                attention_mask,
                batch["completion_ids"].size(1),
                batch_size=batch_size,
                multimodal=batch,  # a VLM's images, sliced with their rows
            )
        return scored.log_probs

    def _pool_in_rank_order(self, values: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Every rank's 1-D ``values`` concatenated in rank order, and where this rank's part starts."""
        accelerator = self.trainer.accelerator
        if accelerator.num_processes == 1:
            return values, 0
        counts = accelerator.gather(torch.tensor([values.numel()], device=values.device)).tolist()
        padded = accelerator.gather(accelerator.pad_across_processes(values, dim=0))
        padded = padded.view(accelerator.num_processes, -1)
        pool = torch.cat([padded[rank, :count] for rank, count in enumerate(counts)])
        return pool, sum(counts[: accelerator.process_index])

    @staticmethod
    def carried_selection(batch: CompletionBatch) -> torch.Tensor:
        """The micro-batch's part of its generation batch's selection (``"generation_batch"`` scope)."""
        if COV_SELECTION_KEY not in batch.carried:
            raise KeyError(
                f"cov_selection_scope='generation_batch' but the batch has no {COV_SELECTION_KEY!r} mask: it is made "
                "by on_generation_batch; for a hand-built batch, set it from select_over_generation_batch(batch)."
            )
        return batch.carried[COV_SELECTION_KEY].bool()


@dataclass
class CovSelectionConfig(EntropyGRPOBaseConfig):
    r"""
    What the covariance-selection methods' configs share: where the selection is made.

    Parameters:
        cov_selection_scope (`str`, *optional*, defaults to `"micro_batch"`):
            `"micro_batch"`: select in every loss step over its micro-batch on its rank, from the current log-probs
            (the authors' code). `"generation_batch"`: select once per generation batch over the whole batch on all
            ranks, from the rollout log-probs, so the selection does not depend on the micro-batch size, the
            accumulation steps or the number of processes.
    """

    cov_selection_scope: str = config_field(
        "micro_batch",
        "Where Clip-Cov/KL-Cov select their tokens. 'micro_batch' (default, the authors' code): in every loss step "
        "over its micro-batch on its rank, from the current log-probs; the selection depends on the micro-batch size, "
        "accumulation and number of processes. 'generation_batch' (ours): once per generation batch over the whole "
        "batch on all ranks, from the rollout log-probs (one extra no-gradient forward pass per generation batch "
        "where TRL does not compute them); the selection is the same for any layout.",
        choices=COV_SELECTION_SCOPES,
    )

    def check_settings(self) -> None:
        if self.importance_sampling_level != "token":
            raise ValueError(
                f"importance_sampling_level={self.importance_sampling_level!r} is not supported by "
                f"{type(self).__name__}: it selects individual tokens by their covariance, so it needs one importance "
                "ratio per token. Use importance_sampling_level='token'."
            )
