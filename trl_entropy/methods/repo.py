"""REPO: Regulated Entropy Policy Optimization, REPO-D and REPO-R ("Entropy-Preserving Reinforcement Learning",
Petrenko et al., arXiv:2603.11682, §5.1, App. A.7, D.2; docs/repo.md). REPO replaces GRPO's per-sequence
advantage by a per-token one, ``A'_t = A_t − β · ζ_t``, built from the sampled token's log-prob under the current
forward pass, detached (``ℓ^s_t = ℓ_t.detach()``, "already available during the forward pass"; on-policy it equals
the rollout's), and a centring term ``c_t``:

* REPO-D (decorrelate): ``ζ_t = ℓ^s_t − c_t``. In expectation this is GRPO plus an entropy bonus ``β · H(π)``,
  estimated by REINFORCE from the sampled token only (App. A.7).
* REPO-R (rescale): ``ζ_t = |A_t| (ℓ^s_t − c_t)``, i.e. ``A'_t = A_t (1 − β · sign(A_t) (ℓ^s_t − c_t))``: with
  ``β > 0`` rare correct tokens are boosted and rare incorrect ones are penalised less (App. D.2). The factor is
  clamped at 0, so the rescaled advantage keeps the sign of ``A_t`` (as the public re-implementation does).
* Centring: ``c_t = 0`` (the paper's practical choice) or ``c_t = −H_t`` (the exact per-state centring, since
  ``E_{a∼π}[log π(a|s)] = −H(s)``; the kernel gives ``H_t`` at no cost).

``β`` is moved by :class:`REPOController` once per generation cycle so that the mean full entropy tracks a target (the
mean entropy of the first cycle, or a given ``repo_entropy_target``): doubled while it already pushes the wanted way,
halved otherwise, flipped to ``±β_min`` when halving takes it below ``β_min``, and capped at ``β_max``.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.batch import CompletionBatch
from ..core.citation import Paper, method_paper, model_card_tags
from ..core.config import ENTROPY_TARGET, EntropyGRPOBaseConfig, Range, config_field, reject_trl_entropy_bonus
from ..core.control import Controller, EntropyTargetController, entropy_direction
from ..core.parts import MethodPart, Metrics
from ..core.trainer import EntropyGRPOTrainer
from .spec import MethodDocs, MethodSpec, Metric, Neutral, Place, Sweep, Variant


REPO_VARIANTS = ("R", "D")
REPO_CENTERINGS = ("none", "entropy")


def repo_advantages(
    advantages: torch.Tensor,
    sampled_log_probs: torch.Tensor,
    entropy: torch.Tensor | None,
    beta: float,
    variant: str,
    centering: str = "none",
    keep_sign: bool = True,
) -> torch.Tensor:
    """REPO's per-token advantages ``A'_t = A_t − β · ζ_t`` (arXiv:2603.11682, §5.1, App. D.2).

    Args:
        advantages: ``(B, 1)`` (or ``(B,)``) per-sequence advantages ``A``.
        sampled_log_probs: ``(B, T)`` log-probs of the sampled tokens ``ℓ^s_t`` (detached here).
        entropy: ``(B, T)`` full entropies ``H_t`` (detached here); needed only for ``centering="entropy"``.
        beta: the coefficient β.
        variant: ``"D"`` (``ζ_t = ℓ^s_t − c_t``) or ``"R"`` (``ζ_t = |A_t| (ℓ^s_t − c_t)``).
        centering: ``"none"`` (``c_t = 0``) or ``"entropy"`` (``c_t = −H_t``).
        keep_sign: REPO-R only: write ``A'_t = A_t · max(0, 1 − β · sign(A_t)(ℓ^s_t − c_t))``, so ``A'_t`` never has
            the opposite sign of ``A_t``; ``False`` drops the ``max``.

    Returns:
        ``(B, T)`` advantages; nothing in them carries a gradient.
    """
    if variant not in REPO_VARIANTS:
        raise ValueError(f"variant must be one of {list(REPO_VARIANTS)}, got {variant!r}.")
    if centering not in REPO_CENTERINGS:
        raise ValueError(f"centering must be one of {list(REPO_CENTERINGS)}, got {centering!r}.")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    advantages = advantages.detach()
    centred = sampled_log_probs.detach()
    if centering == "entropy":
        if entropy is None:
            raise ValueError("centering='entropy' needs the per-token entropy, got entropy=None.")
        centred = centred + entropy.detach()  # ℓ^s_t − c_t with c_t = −H_t
    if variant == "D":
        return advantages - beta * centred
    factor = 1 - beta * torch.sign(advantages) * centred  # A − β|A|x = A(1 − β sign(A) x)
    if keep_sign:
        factor = factor.clamp(min=0)
    return advantages * factor


def repo_controller_step(beta: float, mean_entropy: float, target: float, beta_min: float, beta_max: float) -> float:
    """One update of REPO's β controller (arXiv:2603.11682, §5.1 steps 1–4; App. D.2 as re-implemented publicly).

    ``d = +1`` if the mean entropy is below the target, ``−1`` if above; ``d = 0`` leaves β unchanged. If β already
    pushes the wanted way (``sign(β) = d``) it doubles; otherwise it halves, and if then ``|β| < β_min`` it flips to
    ``d · β_min`` (so a controller at ``β = 0`` starts at ``d · β_min``). Finally ``|β|`` is capped at ``β_max``.
    """
    direction = entropy_direction(mean_entropy, target)
    if direction == 0:
        return beta
    if beta * direction > 0:
        beta = 2 * beta
    else:
        beta = beta / 2
        if abs(beta) < beta_min:
            beta = direction * beta_min
    return min(max(beta, -beta_max), beta_max)


class REPOController(EntropyTargetController):
    """Moves β so that the mean full entropy tracks the target (measured on the first cycle unless given)."""

    name = "repo"
    value_name = "beta"

    def __init__(self, beta: float, beta_min: float, beta_max: float, entropy_target: float | None = None):
        super().__init__(beta, entropy_target, bounds=(-beta_max, beta_max))
        self.beta_min = float(beta_min)
        self.beta_max = float(beta_max)

    @property
    def beta(self) -> float:
        return self.value

    def step(self, value: float, mean_entropy: float, target: float) -> float:
        return repo_controller_step(value, mean_entropy, target, self.beta_min, self.beta_max)


class REPOPart(MethodPart):
    """REPO's seams: its controller, and the token advantages."""

    key = "repo"

    def controllers(self) -> list[Controller]:
        args = self.args
        return [REPOController(args.repo_beta, args.repo_beta_min, args.repo_beta_max, args.repo_entropy_target)]

    def token_advantages(self, batch: CompletionBatch) -> tuple[torch.Tensor, Metrics]:
        args = self.args
        advantages = repo_advantages(
            batch.group_advantages,
            batch.log_probs,  # ℓ^s: this forward pass's log-prob, detached inside
            batch.entropy if args.repo_centering == "entropy" else None,
            self.trainer.controllers[REPOController.name].value,
            args.repo_variant,
            args.repo_centering,
            args.repo_keep_advantage_sign,
        )
        return advantages, {}


@dataclass
class REPOConfig(EntropyGRPOBaseConfig):
    r"""
    Configuration for [`REPOTrainer`]: [`EntropyGRPOBaseConfig`] plus REPO's per-token advantage and its β controller.

    Parameters (each field's `help` says more):
        repo_variant (`str`, defaults to `"R"`): `"R"` (REPO-R, rescale) or `"D"` (REPO-D, decorrelate).
        repo_centering (`str`, defaults to `"none"`): `c_t = 0` (`"none"`, the paper's) or `c_t = −H_t` (`"entropy"`).
        repo_beta, repo_beta_min, repo_beta_max (`float`, default to `0.0`, `1e-4`, `0.05`): initial β, smallest and
            largest |β| (the paper's REPO-R values; for REPO-D the same values are ours).
        repo_entropy_target (`float` or `None`, defaults to `None`): H*; `None` measures it on the first cycle.
        repo_keep_advantage_sign (`bool`, defaults to `True`): REPO-R's rescaled advantage keeps the sign of `A_t`.
    """

    method_parts: ClassVar[tuple[type, ...]] = (REPOPart,)

    repo_variant: str = config_field(
        "R",
        "'R' (REPO-R, rescale: zeta_t = |A_t| (logp^s_t - c_t); the variant of the paper's experiments) or 'D' "
        "(REPO-D, decorrelate: zeta_t = logp^s_t - c_t, an entropy bonus estimated by REINFORCE).",
        choices=REPO_VARIANTS,
    )
    repo_centering: str = config_field(
        "none",
        "Centring c_t of the sampled log-prob: 'none' (c_t = 0, the paper's practical choice) or 'entropy' "
        "(c_t = -H_t, the exact per-state centring; H_t is detached).",
        choices=REPO_CENTERINGS,
    )
    repo_beta: float = config_field(
        0.0,
        "Initial beta of the per-token advantage A'_t = A_t - beta * zeta_t (paper: 0; the first update then sets it "
        "to +-repo_beta_min). |repo_beta| must not exceed repo_beta_max.",
        valid=Range(),
    )
    repo_beta_min: float = config_field(
        1e-4,
        "Smallest |beta|: when halving takes |beta| below it, beta flips to +-repo_beta_min in the wanted direction. "
        "1e-4 is the paper's REPO-R value; for REPO-D the same value is ours.",
        valid=Range(0, ends="(]"),
    )
    repo_beta_max: float = config_field(
        0.05,
        "Largest |beta|; doubling stops there. 0.05 is the paper's REPO-R value; for REPO-D the same value is ours "
        "(the paper's REPO-D range did not survive extraction).",
        valid=Range(),
    )
    repo_entropy_target: float | None = config_field(
        None,
        "REPO's target mean full entropy H* (nats per token). None (default, paper) measures it on the first "
        "generation cycle.",
        **ENTROPY_TARGET,
    )
    repo_keep_advantage_sign: bool = config_field(
        True,
        "REPO-R: clamp the factor 1 - beta * sign(A) * (logp^s - c) at 0 so the rescaled advantage keeps the sign of "
        "A (the public re-implementation of the paper's App. D.2). False leaves it unclamped.",
    )

    def check_settings(self) -> None:
        reject_trl_entropy_bonus(self, "REPO")
        if self.repo_beta_max < self.repo_beta_min:
            raise ValueError(
                f"repo_beta_max must be a finite number >= repo_beta_min={self.repo_beta_min!r}, "
                f"got {self.repo_beta_max!r}."
            )
        if abs(self.repo_beta) > self.repo_beta_max:
            raise ValueError(
                f"repo_beta={self.repo_beta!r} exceeds repo_beta_max={self.repo_beta_max!r} in magnitude; "
                "the initial beta must lie in [-repo_beta_max, repo_beta_max]."
            )


class REPOTrainer(EntropyGRPOTrainer):
    """GRPO with REPO's per-token advantages (REPO-R or REPO-D) and the adaptive β controller.

    Takes the same arguments as `trl.GRPOTrainer`; `args` must be a [`REPOConfig`]. Any `loss_type` of the base works;
    the paper runs REPO-R on GRPO with symmetric clipping.
    """

    config_class = REPOConfig
    paper = Paper(
        "petrenko2026repo", "Entropy-Preserving Reinforcement Learning", "2603.11682", 2026, "Petrenko and others"
    )
    _name = "REPO"
    _paper = method_paper(paper)
    _tag_names = model_card_tags("repo")


SPEC = MethodSpec(
    key="repo",
    config_class=REPOConfig,
    trainer_class=REPOTrainer,
    variants={
        "repo_r": Variant("REPO-R: rescaled per-token advantages", {"repo_variant": "R"}),
        "repo_d": Variant("REPO-D: decorrelated per-token advantages", {"repo_variant": "D"}),
    },
    acts_on=(Place.ADVANTAGES,),
    metrics=(
        Metric("repo/beta", "REPO: β (repo/beta)", "β"),
        Metric("repo/entropy_target", target_label="REPO target"),
    ),
    neutral=Neutral(ours={"repo_beta": 0.0}),
    docs=MethodDocs("per-token advantages with a controlled entropy term", "the entropy held at its first-step value"),
    exports=(REPOController,),
    # The toy sweep, REPO-R's and REPO-D's alike: the top of β's box, from its default 0.05 up.
    sweep=Sweep({"repo_beta_max": [0.05, 0.2, 0.5]}),
)
