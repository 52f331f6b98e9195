"""EntroPIC: entropy stabilisation by proportional-integral control (Yang et al., "EntroPIC: Towards Stable Long-Term
Training of LLMs via Entropy Stabilization with Proportional-Integral Control", arXiv:2511.15248; docs/entropic.md).
The paper's method section could not be read: what follows is the authors' code, github.com/yk7333/EntroPIC at
commit 2470730 (``dp_actor.py``: the controller; ``core_algos.py``, ``compute_policy_loss_entropic``: the loss).

Each micro-batch's loss gains a term over its high-probability tokens, ``π_θ(y_t|s_t) > τ`` (current policy, strict),
whatever the sign of their advantage:

    L = L_surrogate + α · agg_{t : π_θ(y_t|s_t) > τ}(−r_t · |A_t|),      r_t = exp(ℓ_t − ℓ^old_t), unclipped,

``agg`` the run's ``loss_type`` aggregation over those tokens, ``α`` a constant. ``α > 0`` (entropy too high) raises
the confident tokens' probabilities, which sharpens the policy; ``α < 0`` lowers them. ``α`` comes from a PI controller
on the mean entropy ``H̄`` of the micro-batch, moved at every training micro-batch, before its loss:

    e = H̄ − H*,    α = clip(K_p · e + K_i · I, −1, 1),    then    I ← I + e · w,

``I`` the integral before this micro-batch, ``w`` the micro-batch's share of the generation cycle. Ours takes ``H̄``
over every rank's valid tokens (one all-reduce), so every rank holds the same ``α``; the authors' is rank-local.
"""

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.batch import CompletionBatch
from ..core.citation import Paper, method_paper, model_card_tags
from ..core.config import EntropyGRPOBaseConfig, Range, config_field, reject_trl_entropy_bonus
from ..core.control import Controller
from ..core.parts import MethodPart, Metrics
from ..core.trainer import EntropyGRPOTrainer
from ..core.trl.objectives import aggregate_loss
from .spec import MethodDocs, MethodSpec, Metric, Neutral, Place, Sweep


# The authors clip α to [−1, 1] (dp_actor.py at 2470730); no field, as there.
ALPHA_BOUND = 1.0


def entropic_alpha(integral: float, mean_entropy: float, target: float, kp: float, ki: float) -> float:
    """The PI coefficient ``α = clip(K_p · (H̄ − H*) + K_i · I, −1, 1)`` (EntroPIC, arXiv:2511.15248; the authors'
    ``dp_actor.py`` at 2470730), ``I`` the integral before this micro-batch's update."""
    return min(max(kp * (mean_entropy - target) + ki * integral, -ALPHA_BOUND), ALPHA_BOUND)


def entropic_pi_step(
    integral: float, mean_entropy: float, target: float, kp: float, ki: float, weight: float
) -> tuple[float, float]:
    """One micro-batch of EntroPIC's controller (the authors' ``dp_actor.py`` at 2470730): ``(α, I')``, ``α`` from the
    integral as it stands (:func:`entropic_alpha`), then ``I' = I + (H̄ − H*) · w``."""
    alpha = entropic_alpha(integral, mean_entropy, target, kp, ki)
    return alpha, integral + (mean_entropy - target) * weight


def high_probability_mask(log_probs: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """The valid tokens whose current probability exceeds ``τ``, strictly: ``ℓ_t > log τ`` (the authors'
    ``core_algos.py`` at 2470730), ``(B, T)`` floats, no gradient."""
    return (log_probs.detach() > math.log(threshold)).to(log_probs.dtype) * mask.to(log_probs.dtype)


def entropic_term(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    high_mask: torch.Tensor,
    loss_type: str,
    max_completion_length: int,
    token_normaliser: torch.Tensor | None = None,
) -> torch.Tensor:
    """``agg(−r_t · |A_t|)`` over ``high_mask`` by ``loss_type``'s rule, before ``α`` (EntroPIC, arXiv:2511.15248; the
    authors' ``core_algos.py`` at 2470730): ``r_t = exp(ℓ_t − ℓ^old_t)`` per token, unclipped, differentiable;
    ``|A_t|`` detached, ``(B, 1)`` or ``(B, T)``. ``token_normaliser``: the high-probability tokens the token-sum loss
    types (dapo, cispo, vespo) divide by. An empty ``high_mask`` gives 0."""
    per_token = -torch.exp(log_probs - old_log_probs) * advantages.detach().abs()
    term, _ = aggregate_loss(per_token, high_mask, loss_type, max_completion_length, token_normaliser)
    return term


class EntroPICController(Controller):
    """EntroPIC's ``(α, I)``, moved by :func:`entropic_pi_step` at every training micro-batch, on its mean entropy over
    every rank's valid tokens; its state travels in checkpoints as every controller's does. ``value`` is the ``α`` of
    the latest training micro-batch (0 before the first)."""

    name = "entropic"
    statistic = "entropy"
    cadence = "micro_batch"

    def __init__(self, target: float, kp: float, ki: float, weight: float):
        self.target, self.kp, self.ki, self.weight = float(target), float(kp), float(ki), float(weight)
        self.value = 0.0
        self.integral = 0.0

    def value_after(self, mean_statistic: float) -> float:
        """``α`` of the training micro-batch whose mean entropy over every rank's valid tokens is ``mean_statistic``
        (the one :meth:`update` takes after its loss step); a non-finite mean holds ``α``, as the update does."""
        if not math.isfinite(mean_statistic):
            return self.value
        return entropic_pi_step(self.integral, mean_statistic, self.target, self.kp, self.ki, self.weight)[0]

    def update(self, mean_statistic: float, step: int) -> None:
        """One training micro-batch, ``mean_statistic`` its mean entropy over every rank's valid tokens."""
        self.value, self.integral = entropic_pi_step(
            self.integral, mean_statistic, self.target, self.kp, self.ki, self.weight
        )

    def state_dict(self) -> dict:
        return {"alpha": self.value, "integral": self.integral}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.integral = float(state["alpha"]), float(state["integral"])

    def metrics(self) -> dict[str, float]:
        return {
            "entropic/alpha": self.value,
            "entropic/integral": self.integral,
            "entropic/entropy_target": self.target,
        }


class EntroPICPart(MethodPart):
    """EntroPIC's seams: its controller (moved at every training micro-batch), and ``α`` times the term as the
    regulariser."""

    key = "entropic"

    def controllers(self) -> list[Controller]:
        args = self.args
        weight = 1.0 / (args.steps_per_generation * self.trainer.num_iterations)  # each micro-batch's share of a cycle
        return [EntroPICController(args.entropic_target, args.entropic_kp, args.entropic_ki, weight)]

    def regulariser(self, batch: CompletionBatch) -> tuple[torch.Tensor, Metrics]:
        """``α`` times the term; in training ``α`` is the one the controller takes on this micro-batch's mean entropy
        (it moves after the loss step), in evaluation the latest. One all-reduce, which every rank makes:
        ``[Σ high, Σ m]``: the term's normaliser needs it."""
        trainer = self.trainer
        high = high_probability_mask(batch.log_probs, batch.mask, self.args.entropic_high_prob)
        sums = torch.stack([high.float().sum(), batch.mask.float().sum()])
        high_tokens, tokens = trainer.accelerator.reduce(sums, reduction="sum").tolist()
        # The token-sum types' normaliser: the high-probability tokens of this micro-batch on every rank (those of
        # the cycle's later micro-batches are not known yet), per rank as DDP averages the gradients.
        normaliser = torch.tensor(max(high_tokens, 1.0) / trainer.accelerator.num_processes, device=batch.mask.device)
        term = entropic_term(
            batch.log_probs,
            batch.old_log_probs,
            batch.group_advantages,
            high,
            trainer.loss_type,
            trainer.max_completion_length,
            normaliser,
        )
        controller = trainer.controllers[EntroPICController.name]
        if batch.mode == "train":
            alpha = controller.value_after(batch.world_means[controller.statistic])
        else:
            alpha = controller.value
        return alpha * term, {"entropic/high_prob_fraction": high_tokens / max(tokens, 1.0)}


@dataclass
class EntroPICConfig(EntropyGRPOBaseConfig):
    r"""
    Configuration for [`EntroPICTrainer`]: [`EntropyGRPOBaseConfig`] plus EntroPIC's controller and high-probability
    term.

    Parameters (defaults: the authors' `run_entropic.sh` and code at commit 2470730):
        entropic_target (`float`, defaults to `0.1`): target entropy `H*` (nats per token), > 0.
        entropic_kp (`float`, defaults to `1.0`): proportional gain `K_p`, >= 0.
        entropic_ki (`float`, defaults to `0.01`): integral gain `K_i`, >= 0.
        entropic_high_prob (`float`, defaults to `0.95`): probability threshold `τ` of the term's tokens, in (0, 1).
    """

    method_parts: ClassVar[tuple[type, ...]] = (EntroPICPart,)

    entropic_target: float = config_field(
        0.1,
        "Target entropy H* (nats per token, of softmax(logits / temperature), as TRL's entropy metric). 0.1 is the "
        "authors' run_entropic.sh value, at rollout temperature 0.6; must be > 0 (the authors' code breaks at 0).",
        valid=Range(0, ends="(]"),
    )
    entropic_kp: float = config_field(
        1.0, "Proportional gain K_p of the controller (>= 0). 1 is the authors' run_entropic.sh value.", valid=Range(0)
    )
    entropic_ki: float = config_field(
        0.01, "Integral gain K_i of the controller (>= 0). 0.01 is the authors' run_entropic.sh value.", valid=Range(0)
    )
    entropic_high_prob: float = config_field(
        0.95,
        "Probability threshold tau in (0, 1): the term covers the valid tokens whose current probability exceeds it. "
        "0.95 is the authors' default (core_algos.py).",
        valid=Range(0, 1, "()"),
    )

    def check_settings(self) -> None:
        reject_trl_entropy_bonus(self, "EntroPIC")


class EntroPICTrainer(EntropyGRPOTrainer):
    """GRPO plus EntroPIC's PI-controlled term on the high-probability tokens (see the module docstring). Takes the
    same arguments as `trl.GRPOTrainer`; `args` must be an [`EntroPICConfig`]. Every `loss_type` works."""

    config_class = EntroPICConfig
    paper = Paper(
        "yang2025entropic",
        "EntroPIC: Towards Stable Long-Term Training of LLMs via Entropy Stabilization with Proportional-Integral "
        "Control",
        "2511.15248",
        2025,
        "Kai Yang and Xin Xu and Yangkun Chen and Weijie Liu and Jiafei Lyu and Zichuan Lin and Deheng Ye and "
        "Saiyong Yang",
    )
    _name = "EntroPIC"
    _paper = method_paper(paper)
    _tag_names = model_card_tags("entropic")


SPEC = MethodSpec(
    key="entropic",
    config_class=EntroPICConfig,
    trainer_class=EntroPICTrainer,
    description="EntroPIC: PI-controlled term on high-probability tokens, moved every micro-batch",
    acts_on=(Place.REGULARISER,),
    metrics=(
        Metric("entropic/alpha", "EntroPIC: coefficient α (entropic/alpha)", "α"),
        Metric("entropic/integral", "EntroPIC: integral of the entropy error (entropic/integral)", "nats"),
        Metric(
            "entropic/high_prob_fraction",
            "EntroPIC: tokens above τ (entropic/high_prob_fraction)",
            "fraction of valid tokens",
            smooth=True,
        ),
        Metric("entropic/entropy_target", target_label="EntroPIC target"),
    ),
    neutral=Neutral(ours={"entropic_kp": 0.0, "entropic_ki": 0.0}),
    moves_per_micro_batch=True,
    docs=MethodDocs(
        summary="a term on high-probability tokens, its coefficient steered to a target entropy by a PI controller",
        choose_when="the entropy steered to a target you give by a PI controller acting on the confident tokens, "
        "on-policy too",
        sources="the method section could not be read, the formulas and defaults from the authors' code",
    ),
    exports=(EntroPICController,),
    # The toy sweep: the target below the toy policy's start (0.58 nats) and the proportional gain (the authors' 1 and
    # a smaller one); the integral gain 0.01 and the probability threshold 0.95 are the authors'.
    sweep=Sweep(
        {"entropic_target": [0.3, 0.5], "entropic_kp": [0.3, 1.0]},
        fixed={"entropic_ki": 0.01, "entropic_high_prob": 0.95},
    ),
)
