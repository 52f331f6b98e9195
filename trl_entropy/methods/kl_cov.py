"""KL-Cov: no ratio clip, and a KL penalty on the tokens of highest covariance (Cui et al., "The Entropy Mechanism of
Reinforcement Learning for Reasoning Language Models", arXiv:2505.22617, §4.2, eqs. 13–14; docs/kl_cov.md).

The per-token loss is ``−A_t r_t`` (the penalty replaces the PPO clip; with ``loss_type`` ``"cispo"``, ``"sapo"`` or
``"vespo"``, which have no PPO clip, that loss type's own surrogate: docs/loss_types.md) plus
``β_KL · |ℓ_t − ℓ^old_t|`` on the top ``k = max(⌊κ·N_valid⌋, 1)`` valid
tokens by covariance term ``Cov_t`` (eq. 10). Where the top-k is taken (per micro-batch, or once per generation
batch) is the shared ``cov_selection_scope`` of ``methods/cov_selection.py``.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.batch import CompletionBatch
from ..core.citation import method_paper, model_card_tags
from ..core.config import TOKEN_FRACTION, Range, config_field, warn_if_on_policy
from ..core.parts import Metrics, TokenMean
from ..core.statistics import token_covariance
from ..core.trainer import EntropyGRPOTrainer
from ..core.trl.objectives import PPO_CLIP_LOSS_TYPES
from .cov_selection import COV_PAPER, PAPER, CovSelectionConfig, CovSelectionPart, selection_count
from .spec import MethodDocs, MethodSpec, Metric, Neutral, Place, Sweep


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


class KLCovPart(CovSelectionPart):
    """KL-Cov's seams: the surrogate without the PPO clip, and the penalty on the selected tokens."""

    key = "kl_cov"

    def __init__(self, trainer):
        super().__init__(trainer)
        warn_if_on_policy(
            self.args,
            "KL-Cov",
            "ℓ^old = ℓ at every step, so the penalty |ℓ − ℓ^old| and its gradient are 0 and the loss is the unclipped "
            "−A·r.",
            "the penalty to act (the paper makes 8 updates per rollout batch)",
        )

    def select_tokens(self, cov, mask, clip_active, mode):
        return kl_cov_selection(cov, mask, self.args.kl_cov_ratio)

    def surrogate(
        self, batch: CompletionBatch, ratio: torch.Tensor, token_advantages: torch.Tensor
    ) -> tuple[torch.Tensor | None, Metrics]:
        """The paper's surrogate, where the penalty replaces the clip: ``−A·r`` for a loss type with the PPO clip; a
        loss type with none keeps its own."""
        if self.trainer.loss_type in PPO_CLIP_LOSS_TYPES:
            return -token_advantages * ratio, {}
        return None, {}

    def penalty(
        self, batch: CompletionBatch, ratio: torch.Tensor, token_advantages: torch.Tensor
    ) -> tuple[torch.Tensor, Metrics]:
        if self.args.cov_selection_scope == "micro_batch":
            with torch.no_grad():
                cov = token_covariance(batch.log_probs, token_advantages, batch.mask)
                selected = self.select_tokens(cov, batch.mask, None, batch.mode)
        else:
            selected = self.carried_selection(batch)
        abs_log_ratio = (batch.log_probs - batch.old_log_probs).abs()
        metrics = {
            "kl_cov/penalised_fraction": TokenMean(selected.float(), batch.mask),
            "kl_cov/abs_log_ratio": TokenMean(abs_log_ratio, batch.mask),
        }
        return self.args.kl_cov_coef * abs_log_ratio * selected, metrics


@dataclass
class KLCovConfig(CovSelectionConfig):
    r"""
    Configuration for [`KLCovTrainer`]: [`EntropyGRPOBaseConfig`] plus KL-Cov's penalty (Cui et al., "The Entropy
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

    method_parts: ClassVar[tuple[type, ...]] = (KLCovPart,)

    kl_cov_ratio: float = config_field(
        2e-3,
        "κ: fraction of the valid tokens penalised, the top max(floor(κ·N_valid), 1) by covariance, N_valid counted "
        "over the selection scope (micro-batch or generation batch). In (0, 1]. Default from the paper's 7B setting "
        f"({PAPER}, §4.3); it used 2e-4 at 32B.",
        **TOKEN_FRACTION,
    )
    kl_cov_coef: float = config_field(
        1.0,
        "β_KL: weight of the penalty |ℓ_t − ℓ^old_t| on the selected tokens; >= 0. Default from the paper "
        f"({PAPER}, §4.3) and verl.",
        valid=Range(0),
    )

    def check_settings(self) -> None:
        if self.delta is not None:
            raise ValueError(
                f"delta={self.delta!r} is not supported by KLCovConfig: delta clips the importance ratio, and KL-Cov "
                "replaces ratio clipping by its covariance-targeted KL penalty. Leave delta=None."
            )


class KLCovTrainer(EntropyGRPOTrainer):
    """GRPO with KL-Cov (Cui et al., arXiv:2505.22617, §4.2): no ratio clip; a KL penalty on the top-covariance
    tokens."""

    config_class = KLCovConfig
    paper = COV_PAPER
    _name = "KL-Cov"
    _paper = method_paper(paper)
    _tag_names = model_card_tags("kl-cov")


SPEC = MethodSpec(
    key="kl_cov",
    config_class=KLCovConfig,
    trainer_class=KLCovTrainer,
    description="KL-Cov: KL penalty on high-covariance tokens",
    acts_on=(Place.SURROGATE, Place.KL),
    replaces_ppo_clip=True,
    metrics=(
        Metric(
            "kl_cov/penalised_fraction",
            "KL-Cov: selected fraction (kl_cov/penalised_fraction)",
            "fraction of tokens",
            smooth=True,
        ),
        Metric("kl_cov/abs_log_ratio"),
    ),
    # With the penalty off, KL-Cov is the paper's unclipped −A·r where the loss type has the PPO clip (TRL with a clip
    # that never binds), and the loss type's own surrogate otherwise.
    neutral=Neutral(ours={"kl_cov_coef": 0.0}, trl_with_ppo_clip={"epsilon": 1e3, "epsilon_high": 1e3}),
    docs=MethodDocs(
        summary="a KL penalty on the tokens with the highest covariance",
        choose_when="a fixed-cost fix that touches only the few tokens driving the collapse, a smooth penalty in "
        "place of PPO's clip",
    ),
    # The toy sweep: the fraction of the tokens penalised, and the penalty's coefficient (its default 1, and ten).
    sweep=Sweep({"kl_cov_ratio": [0.02, 0.1, 0.3], "kl_cov_coef": [1.0, 10.0]}),
)
