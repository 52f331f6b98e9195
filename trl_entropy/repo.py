"""REPO: Regulated Entropy Policy Optimization, REPO-D and REPO-R (seed 002, §5.1, App. A.7, D.2).

REPO replaces GRPO's per-sequence advantage by a per-token one, ``A'_t = A_t − β · ζ_t``, built from the sampled
token's rollout log-prob ``ℓ^s_t`` (``old_per_token_logps``, detached) and a centring term ``c_t``:

* REPO-D (decorrelate): ``ζ_t = ℓ^s_t − c_t``. In expectation this is GRPO plus an entropy bonus ``β · H(π)``,
  estimated by REINFORCE from the sampled token only (App. A.7).
* REPO-R (rescale): ``ζ_t = |A_t| (ℓ^s_t − c_t)``, i.e. ``A'_t = A_t (1 − β · sign(A_t) (ℓ^s_t − c_t))``: with
  ``β > 0`` rare correct tokens are boosted and rare incorrect ones are penalised less (App. D.2).
* Centring: ``c_t = 0`` (the paper's practical choice) or ``c_t = −H_t`` (the exact per-state centring, since
  ``E_{a∼π}[log π(a|s)] = −H(s)``; the kernel gives ``H_t`` at no cost).

``β`` is moved by :class:`REPOController` once per optimizer step so that the mean full entropy tracks a target: the
mean entropy of the first optimizer step, or a given ``entropy_target``. No extra forward pass is needed: ``ℓ^s_t`` is
the rollout log-prob GRPO already has.
"""

from dataclasses import dataclass, field

import torch

from .base import CompletionBatch, EntropyGRPOConfig, EntropyGRPOTrainer
from .controllers import Controller, EntropyTargetController, entropy_direction
from .validation import is_finite_number, reject_trl_entropy_bonus


REPO_VARIANTS = ("R", "D")
REPO_CENTERINGS = ("none", "entropy")
# (beta_step δ, beta_max) per variant when the config leaves them None. The paper's values did not survive the text
# extraction: these are ours (SPEC "REPO-D and REPO-R").
REPO_VARIANT_DEFAULTS = {"D": (1e-3, 0.05), "R": (1e-2, 0.5)}


def validate_entropy_target(value) -> None:
    if value is not None and not (is_finite_number(value) and value > 0):
        raise ValueError(
            f"entropy_target must be a positive finite number of nats, or None to measure it on the first optimizer "
            f"step; got {value!r}."
        )


@dataclass
class REPOConfig(EntropyGRPOConfig):
    r"""
    Configuration for [`REPOTrainer`]: [`EntropyGRPOConfig`] plus REPO's per-token advantage and its β controller.

    Parameters:
        repo_variant (`str`, *optional*, defaults to `"R"`):
            `"R"` (REPO-R, rescale: `ζ_t = |A_t|(ℓ^s_t − c_t)`) or `"D"` (REPO-D, decorrelate: `ζ_t = ℓ^s_t − c_t`,
            an entropy bonus estimated by REINFORCE). The paper's experiments use REPO-R.
        repo_centering (`str`, *optional*, defaults to `"none"`):
            `"none"` (`c_t = 0`, the paper's practical choice) or `"entropy"` (`c_t = −H_t`, the exact per-state
            centring).
        repo_beta (`float`, *optional*, defaults to `0.0`):
            Initial β (paper: β_0 = 0).
        repo_beta_step (`float` or `None`, *optional*, defaults to `None`):
            Controller step δ. `None` resolves from the variant: 1e-3 for REPO-D, 1e-2 for REPO-R (ours).
        repo_beta_max (`float` or `None`, *optional*, defaults to `None`):
            Maximum |β|. `None` resolves from the variant: 0.05 for REPO-D, 0.5 for REPO-R (ours).
        entropy_target (`float` or `None`, *optional*, defaults to `None`):
            Target mean full entropy H* (nats per token). `None` measures it on the first optimizer step (paper).
            This replaces the meaning `GRPOConfig.entropy_target` has for TRL's adaptive entropy bonus, which REPO
            rejects.
    """

    repo_variant: str = field(
        default="R",
        metadata={
            "help": "'R' (REPO-R, rescale: zeta_t = |A_t| (logp^s_t - c_t); the variant of the paper's experiments) "
            "or 'D' (REPO-D, decorrelate: zeta_t = logp^s_t - c_t, an entropy bonus estimated by REINFORCE).",
            "choices": list(REPO_VARIANTS),
        },
    )
    repo_centering: str = field(
        default="none",
        metadata={
            "help": "Centring c_t of the sampled log-prob: 'none' (c_t = 0, the paper's practical choice) or "
            "'entropy' (c_t = -H_t, the exact per-state centring; H_t is detached).",
            "choices": list(REPO_CENTERINGS),
        },
    )
    repo_beta: float = field(
        default=0.0,
        metadata={"help": "Initial beta of the per-token advantage A'_t = A_t - beta * zeta_t (paper: 0)."},
    )
    repo_beta_step: float | None = field(
        default=None,
        metadata={
            "help": "Controller step delta added to (or subtracted from) beta each optimizer step. None resolves "
            "from repo_variant: 1e-3 for 'D', 1e-2 for 'R' (ours: the paper's values did not survive extraction)."
        },
    )
    repo_beta_max: float | None = field(
        default=None,
        metadata={
            "help": "Maximum |beta|; beta is clipped to [-repo_beta_max, repo_beta_max]. None resolves from "
            "repo_variant: 0.05 for 'D', 0.5 for 'R' (ours: the paper's values did not survive extraction)."
        },
    )
    entropy_target: float | None = field(
        default=None,
        metadata={
            "help": "REPO's target mean full entropy H* (nats per token). None (default, paper) measures it on the "
            "first optimizer step. Not TRL's adaptive-entropy-bonus threshold: TRL's bonus is rejected with REPO."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        reject_trl_entropy_bonus(self, "REPO")
        if self.repo_variant not in REPO_VARIANTS:
            raise ValueError(f"repo_variant must be one of {list(REPO_VARIANTS)}, got {self.repo_variant!r}.")
        if self.repo_centering not in REPO_CENTERINGS:
            raise ValueError(f"repo_centering must be one of {list(REPO_CENTERINGS)}, got {self.repo_centering!r}.")
        default_step, default_max = REPO_VARIANT_DEFAULTS[self.repo_variant]
        if self.repo_beta_step is None:
            self.repo_beta_step = default_step
        if self.repo_beta_max is None:
            self.repo_beta_max = default_max
        if not (is_finite_number(self.repo_beta_step) and self.repo_beta_step > 0):
            raise ValueError(f"repo_beta_step must be a positive finite number, got {self.repo_beta_step!r}.")
        if not (is_finite_number(self.repo_beta_max) and self.repo_beta_max > 0):
            raise ValueError(f"repo_beta_max must be a positive finite number, got {self.repo_beta_max!r}.")
        if not is_finite_number(self.repo_beta):
            raise ValueError(f"repo_beta must be a finite number, got {self.repo_beta!r}.")
        if abs(self.repo_beta) > self.repo_beta_max:
            raise ValueError(
                f"repo_beta={self.repo_beta!r} exceeds repo_beta_max={self.repo_beta_max!r} in magnitude; "
                "the initial beta must lie in [-repo_beta_max, repo_beta_max]."
            )
        validate_entropy_target(self.entropy_target)


def repo_advantages(
    advantages: torch.Tensor,
    sampled_log_probs: torch.Tensor,
    entropy: torch.Tensor | None,
    beta: float,
    variant: str,
    centering: str = "none",
) -> torch.Tensor:
    """REPO's per-token advantages ``A'_t = A_t − β · ζ_t`` (seed 002, §5.1, App. D.2).

    Args:
        advantages: ``(B, 1)`` (or ``(B,)``) per-sequence advantages ``A``.
        sampled_log_probs: ``(B, T)`` rollout log-probs of the sampled tokens ``ℓ^s_t`` (detached here).
        entropy: ``(B, T)`` full entropies ``H_t`` (detached here); needed only for ``centering="entropy"``.
        beta: the coefficient β.
        variant: ``"D"`` (``ζ_t = ℓ^s_t − c_t``) or ``"R"`` (``ζ_t = |A_t| (ℓ^s_t − c_t)``).
        centering: ``"none"`` (``c_t = 0``) or ``"entropy"`` (``c_t = −H_t``).

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
    zeta = centred if variant == "D" else advantages.abs() * centred
    return advantages - beta * zeta


def repo_controller_step(beta: float, mean_entropy: float, target: float, delta: float, beta_max: float) -> float:
    """One step of REPO's β controller (seed 002, §5.1; the flip condition ``β·d < 0`` is ours).

    ``d = +1`` if the mean entropy is below the target, ``−1`` if above, else ``0``; if ``β · d < 0`` the sign of β
    flips (the pressure reverses at once); then ``β ← clip(β + d·δ, −β_max, β_max)``.
    """
    direction = entropy_direction(mean_entropy, target)
    if beta * direction < 0:
        beta = -beta
    return min(max(beta + direction * delta, -beta_max), beta_max)


class REPOController(EntropyTargetController):
    """Moves β so that the mean full entropy tracks the target (measured on the first optimizer step unless given)."""

    name = "repo"
    value_name = "beta"

    def __init__(self, beta: float, beta_step: float, beta_max: float, entropy_target: float | None = None):
        super().__init__(beta, entropy_target)
        self.beta_step = float(beta_step)
        self.beta_max = float(beta_max)

    @property
    def beta(self) -> float:
        return self.value

    def step(self, value: float, mean_entropy: float, target: float) -> float:
        return repo_controller_step(value, mean_entropy, target, self.beta_step, self.beta_max)


class REPOTrainer(EntropyGRPOTrainer):
    """GRPO with REPO's per-token advantages (REPO-R or REPO-D) and the adaptive β controller.

    Takes the same arguments as `trl.GRPOTrainer`; `args` must be a [`REPOConfig`]. Any `loss_type` of the base works;
    the paper runs REPO-R on GRPO with symmetric clipping.
    """

    config_class = REPOConfig
    _tag_names = ["trl", "grpo", "trl-entropy", "repo"]

    def build_controllers(self) -> list[Controller]:
        args = self.args
        return [REPOController(args.repo_beta, args.repo_beta_step, args.repo_beta_max, args.entropy_target)]

    def per_token_advantages(self, batch: CompletionBatch) -> torch.Tensor:
        args = self.args
        return repo_advantages(
            batch.advantages,
            batch.old_log_probs,
            batch.entropy if args.repo_centering == "entropy" else None,
            self.controllers["repo"].value,
            args.repo_variant,
            args.repo_centering,
        )
