"""``MethodPart``: what one method contributes to the loss step, one seam per place it acts.

A method is data to the loss step: its config names its parts (``method_parts``), the trainer builds one of each, and
``EntropyGRPOTrainer.loss_step`` asks every part for each seam in turn, in the order of the config's parts (the axis
order). A seam a part leaves at its default contributes nothing. Each seam returns its value and the metrics it
measured, ``(value, metrics)``; the step returns the metrics, and they are reduced over the ranks after it
(``core.statistics``: a ``TokenMean`` is averaged over every rank's tokens, a ``WorldSum`` added, a ``Gathered``
gathered), so a seam makes no collective for its metrics. How several parts' answers at one seam combine, and in which
order the seams are asked: ``core/places.py``.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from .batch import CompletionBatch
from .control import Controller
from .statistics import Gathered, Metrics, TokenMean, WorldSum
from .warn import warn_user


__all__ = ["Gathered", "MethodPart", "Metrics", "TokenGate", "TokenMean", "TopPRule", "WorldSum"]


@dataclass
class TokenGate:
    """What one gate does to the per-token loss, without gradient through itself: ``stop_gradient`` (bool) keeps the
    value and drops the gradient where set; ``weight`` then multiplies value and gradient. Either may be None."""

    stop_gradient: torch.Tensor | None = None
    weight: torch.Tensor | None = None

    def apply(self, per_token_loss: torch.Tensor) -> torch.Tensor:
        if self.stop_gradient is not None:
            per_token_loss = torch.where(self.stop_gradient, per_token_loss.detach(), per_token_loss)
        if self.weight is not None:
            per_token_loss = per_token_loss * self.weight
        return per_token_loss


@dataclass(frozen=True)
class TopPRule:
    """The top-p set the kernel keeps for ``batch.top_p_entropy``: the prefix of the logits ranked down whose
    cumulative full-softmax mass stays below ``p``, among the ``k`` largest; the token whose mass crosses ``p`` is left
    out unless ``include_crossing``."""

    p: float
    k: int
    include_crossing: bool = False


class MethodPart:
    """One method's seams. Every default contributes nothing, so a part fills only the seams of the places it acts.

    ``key`` is the method's registry key (its metrics' prefix, ``trainer.part(key)``); ``trainer`` the
    ``EntropyGRPOTrainer`` it belongs to, whose ``args`` hold the method's fields. ``needs_rollout_entropy``: it reads
    ``batch.old_entropy``. ``carried_token_keys``: the ``(B, T)`` tensors its ``on_generation_batch`` adds to the
    generation batch.
    """

    key: ClassVar[str]
    needs_rollout_entropy: ClassVar[bool] = False
    carried_token_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, trainer):
        self.trainer = trainer

    @property
    def args(self):
        return self.trainer.args

    # Set-up and the generation cycle

    def controllers(self) -> list[Controller]:
        """The controllers the method moves; a controller's ``cadence`` says when."""
        return []

    def group_baseline(self, grouped_rewards: torch.Tensor) -> tuple[torch.Tensor | None, Metrics]:
        """The baseline ``(groups,)`` of the rewards ``(groups, num_generations)`` gathered from every rank (NaN:
        unscorable), the same on every rank; None keeps TRL's mean."""
        return None, {}

    def reject_rollouts(
        self, rewards: torch.Tensor, advantages: torch.Tensor, batch: dict
    ) -> tuple[torch.Tensor | None, Metrics]:
        """Every generation batch, on every rank, after the group baseline: this rank's rows' advantages with some
        rollouts rejected (their advantage 0), from their summed rewards (NaN: unscorable), their advantages and the
        generation batch; None keeps them. Collectives are allowed; the same decision on every rank."""
        return None, {}

    def on_generation_batch(self, batch: dict) -> None:
        """Every generation batch (training and evaluation), on every rank, before TRL splits it into micro-batches;
        it may add ``(B, T)`` tensors under ``carried_token_keys``. Collectives are allowed."""

    # The loss step's seams, in the order they run

    def clamp_fraction(self) -> float:
        """Fraction of the vocabulary dropped for the clamped entropy; 0: the method needs none."""
        return 0.0

    def top_p_rule(self) -> TopPRule | None:
        """The top-p set of ``batch.top_p_entropy``; None: the method needs none."""
        return None

    def token_advantages(self, batch: CompletionBatch) -> tuple[torch.Tensor | None, Metrics]:
        """The token advantages the surrogate multiplies, ``(B, 1)`` or ``(B, T)``, made from
        ``batch.group_advantages`` without gradient; None keeps them."""
        return None, {}

    def clip_range(self) -> tuple[float, float] | None:
        """The PPO clip's ``(ε_low, ε_high)``; None keeps the config's."""
        return None

    def surrogate(
        self, batch: CompletionBatch, ratio: torch.Tensor, token_advantages: torch.Tensor
    ) -> tuple[torch.Tensor | None, Metrics]:
        """The per-token policy loss; None keeps the loss type's (``trainer.loss_type_surrogate``)."""
        return None, {}

    def penalty(
        self, batch: CompletionBatch, ratio: torch.Tensor, token_advantages: torch.Tensor
    ) -> tuple[torch.Tensor | None, Metrics]:
        """A per-token penalty added to the surrogate, before the gates act; None adds nothing."""
        return None, {}

    def gate(
        self, batch: CompletionBatch, ratio: torch.Tensor, token_advantages: torch.Tensor
    ) -> tuple[TokenGate | None, Metrics]:
        """A gate on the per-token loss; None lets every token through as it is."""
        return None, {}

    def regulariser(self, batch: CompletionBatch) -> tuple[torch.Tensor | None, Metrics]:
        """A scalar added to each micro-batch's loss, before the loss step divides it by the accumulation steps."""
        return None, {}

    # Checkpoints

    def rank_checkpoint_state(self) -> dict[str, object]:
        """This rank's extra state for a checkpoint: ``{file name pattern with {process_index}: value}``."""
        return {}

    def restore_rank_checkpoint_state(self, checkpoint: str) -> None:
        """Read back what ``rank_checkpoint_state`` saved (``core.checkpoint.load_rank_file``)."""


def warn_beside_entropy_drivers(config, part: type, subject: str) -> None:
    """Warn, naming them, where ``config`` trains beside ``part`` a part that builds controllers (each moves its
    method's coefficient or clip toward an entropy target of its own) or TRL's adaptive coefficient: two can pull
    against each other. ``subject`` says what ``part`` does; the warning points at the code that builds the config."""
    drivers = [p.key for p in config.method_parts if p is not part and p.controllers is not MethodPart.controllers]
    drivers += ["use_adaptive_entropy"] if config.use_adaptive_entropy else []
    if drivers:
        warn_user(
            f"{subject}, and {drivers} also drives the entropy to a target of its own: the two can pull against each "
            "other."
        )
