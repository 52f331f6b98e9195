"""SIREN: selective, self-anchored entropy regularisation (Jiang et al., "Rethinking Entropy Regularization in Large
Reasoning Models", arXiv:2509.25133; the authors' code, github.com/Linn3a/siren at commit fa59a8d,
``verl/verl/workers/actor/dp_actor.py`` and ``verl/verl/trainer/ppo/ray_trainer.py``; docs/siren.md).

Each micro-batch's loss gains a penalty on how far its entropy has moved from an anchor the run measures itself:

    L = L_surrogate + c · (H̄ − H_anchor)²,    H̄ = (1/B) Σ_i [Σ_t keep_it H^p_it / Σ_t keep_it],

``H^p_t`` the top-p entropy (the softmax renormalised over the logits ranked down while their cumulative full-softmax
mass stays below ``p``, among the ``K`` largest; the kernel computes it with its gradient), ``keep_it = H^p_it > q_i``
with ``q_i`` the ``ρ``-quantile of sequence ``i``'s valid ``H^p`` (the peak-entropy mask), a sequence without a kept
token counting 0 in the mean over the micro-batch's ``B`` sequences. ``H_anchor`` is the same mean over the whole first
generation batch under the rollout policy, measured once (over every rank) and carried in checkpoints.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.batch import CompletionBatch
from ..core.bounds import ScheduledCoefficient
from ..core.checkpoint import load_rank_file
from ..core.citation import Paper, method_paper, model_card_tags
from ..core.config import EntropyGRPOBaseConfig, Range, config_field, reject_trl_entropy_bonus
from ..core.parts import MethodPart, Metrics, TokenMean, TopPRule
from ..core.trainer import EntropyGRPOTrainer, generation_batch_mask
from .spec import MethodDocs, MethodSpec, Metric, Neutral, Place, Sweep


SIREN_COEF = ScheduledCoefficient("siren_coef", "SIREN's penalty coefficient c")
ANCHOR_FILE = "siren_anchor_{process_index}.pt"


def peak_entropy_mask(values: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """SIREN's peak-entropy mask: per sequence, the valid tokens whose value is strictly above the ``ratio``-quantile
    (linear interpolation) of that sequence's valid values; a sequence without a valid token keeps none."""
    valid = mask.bool()
    masked = torch.where(valid, values.detach().double(), torch.full_like(values, float("nan"), dtype=torch.float64))
    quantile = torch.nanquantile(masked, ratio, dim=1, keepdim=True)
    return valid & (values.detach().double() > quantile)


def sequence_mean_token_mean(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``(1/B) Σ_i Σ_t keep_it v_it / Σ_t keep_it``: a sequence with no kept token counts 0, and still counts in B."""
    keep = keep.to(values.dtype)
    return ((values * keep).sum(1) / keep.sum(1).clamp(min=1.0)).mean()


def siren_penalty(mean_entropy: torch.Tensor, anchor: float, coef: float) -> torch.Tensor:
    """``c · (H̄ − H_anchor)²``."""
    return coef * (mean_entropy - anchor) ** 2


class SIRENPart(MethodPart):
    """SIREN's seams: the top-p entropy the kernel computes, the anchor measured on the first generation batch, and the
    penalty of each micro-batch."""

    key = "siren"

    def __init__(self, trainer):
        super().__init__(trainer)
        self.anchor: float | None = self.args.siren_anchor

    def top_p_rule(self) -> TopPRule:
        return TopPRule(self.args.siren_top_p, self.args.siren_top_k, self.args.siren_include_crossing)

    def on_generation_batch(self, batch: dict) -> None:
        """The first training generation batch measures the anchor under the rollout policy, over every rank's
        sequences (one pass without gradient); never again, a resumed run included."""
        if self.anchor is not None or self.trainer.mode != "train":
            return
        scored = self.trainer.score_generation_batch(batch, self.top_p_rule())
        mask = generation_batch_mask(batch)
        keep = peak_entropy_mask(scored.top_p_entropy, mask, self.args.siren_mask_ratio)
        values = scored.top_p_entropy.double()
        sequences = values.new_tensor(len(values))
        sums = torch.stack([sequence_mean_token_mean(values, keep) * sequences, sequences])  # summed over the ranks
        sums = self.trainer.accelerator.reduce(sums, reduction="sum")
        self.anchor = float(sums[0] / sums[1])

    def regulariser(self, batch: CompletionBatch) -> tuple[torch.Tensor | None, Metrics]:
        keep = peak_entropy_mask(batch.top_p_entropy, batch.mask, self.args.siren_mask_ratio)
        mean_entropy = sequence_mean_token_mean(batch.top_p_entropy, keep)
        sizes = batch.top_p_set_size
        metrics = {
            "siren/kept_fraction": TokenMean(keep.float(), batch.mask),
            "siren/topp_set_size": TokenMean(sizes, batch.mask),
            "siren/empty_set_fraction": TokenMean((sizes == 0).float(), batch.mask),
        }
        if self.anchor is None:  # an evaluation before the first training batch: nothing to hold the entropy to yet
            return None, metrics
        coef, _ = SIREN_COEF.now(self.trainer)
        penalty = siren_penalty(mean_entropy, self.anchor, coef)
        metrics |= {
            "siren/topp_entropy": mean_entropy.detach().item(),
            "siren/anchor": self.anchor,
            "siren/coef": coef,
        }
        metrics["siren/penalty"] = penalty.detach().item()
        return penalty, metrics

    def rank_checkpoint_state(self) -> dict[str, object]:
        return {} if self.anchor is None else {ANCHOR_FILE: torch.tensor(self.anchor, dtype=torch.float64)}

    def restore_rank_checkpoint_state(self, checkpoint: str) -> None:
        stored = load_rank_file(checkpoint, ANCHOR_FILE, self.trainer.accelerator.process_index)
        if stored is not None and self.args.siren_anchor is None:
            self.anchor = float(stored)


@dataclass
class SIRENConfig(EntropyGRPOBaseConfig):
    r"""
    Configuration for [`SIRENTrainer`]: every field of [`EntropyGRPOBaseConfig`] plus SIREN's penalty.

    Defaults are the authors' (`exp_scripts/siren.sh` and `dp_actor.py` at fa59a8d); docs/siren.md gives their recipe
    (`scale_rewards="none"`, `loss_type="dr_grpo"`, clip 0.2/0.2).

    Parameters: each field's `help`; docs/siren.md.
    """

    method_parts: ClassVar[tuple[type, ...]] = (SIRENPart,)

    siren_coef: float = config_field(
        0.005, "Coefficient c of the penalty c (H - H_anchor)^2; the authors' siren.sh.", valid=Range(0)
    )
    siren_coef_schedule: str = SIREN_COEF.kind_field()
    siren_coef_final: float | None = SIREN_COEF.final_field()
    siren_coef_warmup_steps: int = SIREN_COEF.warmup_field()
    siren_coef_warmup_start: float = SIREN_COEF.warmup_start_field()
    siren_coef_decay_steps: int | None = SIREN_COEF.decay_field()
    siren_top_p: float = config_field(
        0.8,
        "Mass p of the top-p set: the logits ranked down while their cumulative full-softmax mass stays below p (the "
        "token that crosses p is left out, as in the authors' code); 0 < p <= 1. The authors' dp_actor.py.",
        valid=Range(0, 1, "(]"),
    )
    siren_top_k: int = config_field(
        10000,
        "At most this many largest logits make the top-p set (>= 1); the authors' dp_actor.py.",
        valid=Range(1, integer=True),
    )
    siren_mask_ratio: float = config_field(
        0.8,
        "Quantile rho of the peak-entropy mask: per sequence, only the tokens whose top-p entropy is above the "
        "rho-quantile of the sequence's enter the penalty; 0 <= rho < 1. The authors' siren.sh.",
        valid=Range(0, 1, "[)"),
    )
    siren_anchor: float | None = config_field(
        None,
        "The anchor H_anchor (nats). None measures it, as the authors do, on the first generation batch under the "
        "rollout policy, once; a checkpoint carries it.",
        valid=Range(0),
        none_means="(measured on the first generation batch)",
    )
    siren_include_crossing: bool = config_field(
        False,
        "Keep the token whose cumulative mass crosses siren_top_p in the top-p set, as standard nucleus sampling does "
        "(ours); False leaves it out, as the authors' code does.",
    )

    def check_settings(self) -> None:
        SIREN_COEF.check(self)
        reject_trl_entropy_bonus(self, "SIREN")

    def reads_max_steps(self) -> bool:
        return EntropyGRPOBaseConfig.reads_max_steps(self) or SIREN_COEF.schedule(self).moves


class SIRENTrainer(EntropyGRPOTrainer):
    """GRPO with SIREN's penalty on the distance of a masked top-p entropy from an anchor the run measures itself
    (arXiv:2509.25133). Takes the same arguments as `trl.GRPOTrainer`; `args` must be a [`SIRENConfig`]."""

    config_class = SIRENConfig
    paper = Paper(
        "jiang2025siren",
        "Rethinking Entropy Regularization in Large Reasoning Models",
        "2509.25133",
        2025,
        "Jiang and others",
    )
    _name = "SIREN"
    _paper = method_paper(paper)
    _tag_names = model_card_tags("siren")


SPEC = MethodSpec(
    key="siren",
    config_class=SIRENConfig,
    trainer_class=SIRENTrainer,
    description="SIREN: a masked top-p entropy held near a self-measured anchor",
    acts_on=(Place.REGULARISER, Place.TOP_P),
    metrics=(
        Metric("siren/topp_entropy", "SIREN: masked top-p entropy (siren/topp_entropy)", "nats"),
        Metric("siren/anchor", target_label="SIREN anchor"),
        Metric("siren/penalty"),
        Metric("siren/coef"),
        Metric("siren/kept_fraction"),
        Metric("siren/topp_set_size"),
        Metric("siren/empty_set_fraction"),
    ),
    neutral=Neutral(ours={"siren_coef": 0.0}),
    docs=MethodDocs(
        summary="a penalty on how far a masked top-p entropy moves from an anchor the run measures on its first batch",
        choose_when="the entropy of the tokens that matter held where the run started, by a penalty, on-policy too",
        sources="the top-p and peak-entropy masks, the anchor and the defaults from the authors' code "
        "(`Linn3a/siren` at `fa59a8d`), two of its defects fixed",
    ),
    # The toy sweep: the coefficient from ten times the authors' 0.005 up (the toy's entropy moves by tenths of a nat,
    # so the penalty's square is small).
    sweep=Sweep({"siren_coef": [0.05, 0.5, 5.0]}),
)
