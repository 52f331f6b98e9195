"""The entropy–reward law ``R = −a·exp(H) + b`` of Cui et al., "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models", arXiv:2505.22617, eq. 6, fitted on logged (entropy, reward) pairs: :func:`fit_entropy_law`
and :class:`EntropyLawCallback`. Its predicted ceiling ``R(H = 0) = b − a`` is what the policy reaches once its entropy
is spent. The callback works with ``trl.GRPOTrainer`` and every trainer of this library.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from transformers import Trainer, TrainerCallback

from .counts import as_count


__all__ = ["EntropyLaw", "EntropyLawCallback", "fit_entropy_law"]


# A fit needs this many (entropy, reward) points, and this spread of exp(H): the standard deviation of exp(H) over
# its mean, which is about the standard deviation of H in nats. Below it the points sit at one entropy and the slope
# `a` is the noise of the rewards divided by almost nothing.
ENTROPY_LAW_MIN_POINTS = 10
ENTROPY_LAW_MIN_RELATIVE_SPREAD = 0.01


@dataclass(frozen=True)
class EntropyLaw:
    """``R = −a·exp(H) + b`` (Cui et al., arXiv:2505.22617, eq. 6) fitted on ``num_points`` logged points."""

    a: float
    b: float
    num_points: int

    @property
    def ceiling(self) -> float:
        """The predicted reward once the entropy is spent, ``R(H = 0) = b − a``."""
        return self.b - self.a

    def predict(self, entropy):
        """The law's reward at ``entropy`` (a float or an array)."""
        return self.b - self.a * np.exp(entropy)


def fit_entropy_law(
    entropies,
    rewards,
    *,
    min_points: int = ENTROPY_LAW_MIN_POINTS,
    min_relative_spread: float = ENTROPY_LAW_MIN_RELATIVE_SPREAD,
) -> EntropyLaw | None:
    """Least-squares fit of ``R = −a·exp(H) + b`` (linear in ``x = exp(H)``) to paired ``entropies`` and
    ``rewards``; ``None`` when the fit is not well posed.

    Well posed means: at least ``min_points`` finite pairs (non-finite pairs are dropped), and ``std(x) / mean(x)
    >= min_relative_spread`` (about the standard deviation of ``H`` in nats; 0.01 by default). With every point at
    one entropy the slope is undetermined, and with a tiny spread it is the reward noise divided by that spread.
    """
    entropies = np.asarray(entropies, dtype=np.float64).ravel()
    rewards = np.asarray(rewards, dtype=np.float64).ravel()
    if entropies.shape != rewards.shape:
        raise ValueError(f"entropies and rewards must pair up, got {entropies.size} and {rewards.size} values")
    finite = np.isfinite(entropies) & np.isfinite(rewards)
    x, y = np.exp(entropies[finite]), rewards[finite]
    if x.size < min_points or not np.all(np.isfinite(x)):
        return None
    if x.std() < min_relative_spread * x.mean():
        return None
    centred = x - x.mean()
    slope = float(np.dot(centred, y - y.mean()) / np.dot(centred, centred))
    return EntropyLaw(a=-slope, b=float(y.mean() - slope * x.mean()), num_points=int(x.size))


class EntropyLawCallback(TrainerCallback):
    """Fits the entropy–reward law on the training log and logs ``entropy/law_a``, ``entropy/law_b`` and
    ``entropy/predicted_ceiling`` (``b − a``).

    After every training log that holds both ``entropy_key`` and ``reward_key``, it refits
    :func:`fit_entropy_law` on every such entry of ``trainer.state.log_history`` (so a resumed run keeps its earlier
    points) and, once the fit is well posed, logs the three values as their own entry at the same step. Before that
    it logs nothing. Works with ``trl.GRPOTrainer`` and every trainer of this library::

        trainer.add_callback(EntropyLawCallback(trainer))

    Each logged point is a logging window's mean entropy and mean reward, so ``logging_steps`` sets how many points
    a run gives.
    """

    def __init__(
        self,
        trainer,
        entropy_key: str = "entropy",
        reward_key: str = "reward",
        min_points: int = ENTROPY_LAW_MIN_POINTS,
        min_relative_spread: float = ENTROPY_LAW_MIN_RELATIVE_SPREAD,
    ):
        min_points = as_count(min_points, "min_points")
        if min_points < 2:
            raise ValueError(f"min_points must be at least 2 (a line needs two points), got {min_points}")
        if not min_relative_spread > 0:
            raise ValueError(f"min_relative_spread must be positive, got {min_relative_spread}")
        self.trainer = trainer
        self.entropy_key = entropy_key
        self.reward_key = reward_key
        self.min_points = min_points
        self.min_relative_spread = min_relative_spread
        self._points: list[tuple[float, float]] = []
        self._scanned = 0  # entries of state.log_history already read

    def on_train_begin(self, args, state, control, **kwargs):
        self._points, self._scanned = [], 0  # a resumed run has reloaded its log: read it again from the start

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or self.entropy_key not in logs or self.reward_key not in logs:
            return
        if len(state.log_history) < self._scanned:  # a new log (another run, or a resumed one reloaded it)
            self._points, self._scanned = [], 0
        for entry in state.log_history[self._scanned :]:  # only the entries added since the last call
            if entry.get(self.entropy_key) is not None and entry.get(self.reward_key) is not None:
                self._points.append((entry[self.entropy_key], entry[self.reward_key]))
        self._scanned = len(state.log_history)
        law = fit_entropy_law(
            [entropy for entropy, _ in self._points],
            [reward for _, reward in self._points],
            min_points=self.min_points,
            min_relative_spread=self.min_relative_spread,
        )
        if law is not None:
            Trainer.log(
                self.trainer,
                {"entropy/law_a": law.a, "entropy/law_b": law.b, "entropy/predicted_ceiling": law.ceiling},
            )
