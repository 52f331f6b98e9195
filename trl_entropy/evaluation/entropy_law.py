"""The entropy–reward law ``R = −a·exp(H) + b`` of Cui et al., "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models", arXiv:2505.22617, eq. 6, fitted on logged (entropy, reward) pairs: :func:`fit_entropy_law`,
:func:`entropy_law_fit` (with R², or why there is no fit) and :class:`EntropyLawCallback`. Its predicted ceiling
``R(H = 0) = b − a`` is what the policy reaches once its entropy is spent. The callback works with
``trl.GRPOTrainer`` and every trainer of this library.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from transformers import Trainer, TrainerCallback

from .counts import as_count


__all__ = ["EntropyLaw", "EntropyLawCallback", "EntropyLawFit", "entropy_law_fit", "fit_entropy_law"]


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


@dataclass(frozen=True)
class EntropyLawFit:
    """The law fitted on ``num_pairs`` (entropy, reward) pairs with its R² (``None`` when the rewards do not vary), or
    ``law=None`` and the ``reason`` the fit is not well posed."""

    num_pairs: int
    law: EntropyLaw | None = None
    r_squared: float | None = None
    reason: str | None = None


def entropy_law_fit(
    entropies,
    rewards,
    *,
    min_points: int = ENTROPY_LAW_MIN_POINTS,
    min_relative_spread: float = ENTROPY_LAW_MIN_RELATIVE_SPREAD,
) -> EntropyLawFit:
    """Least-squares fit of ``R = −a·exp(H) + b`` (linear in ``x = exp(H)``) to paired ``entropies`` and
    ``rewards``, with its R² on the points fitted, or the reason the fit is not well posed.

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
    if x.size < min_points:
        reason = f"{x.size} (entropy, reward) point{'s' * (x.size != 1)}, the fit needs {min_points}"
        return EntropyLawFit(int(x.size), reason=reason)
    if not np.all(np.isfinite(x)):
        return EntropyLawFit(int(x.size), reason="exp(H) overflows: an entropy above 709 nats")
    if x.std() < min_relative_spread * x.mean():
        reason = (
            f"the entropy barely varies (std of exp(H) is {x.std() / x.mean():.2%} of its mean, the fit needs "
            f"{min_relative_spread:.0%})"
        )
        return EntropyLawFit(int(x.size), reason=reason)
    centred = x - x.mean()
    slope = float(np.dot(centred, y - y.mean()) / np.dot(centred, centred))
    law = EntropyLaw(a=-slope, b=float(y.mean() - slope * x.mean()), num_points=int(x.size))
    residual = y - law.predict(entropies[finite])
    total = float(np.sum((y - y.mean()) ** 2))
    r_squared = 1.0 - float(np.sum(residual**2)) / total if total > 0 else None
    return EntropyLawFit(int(x.size), law=law, r_squared=r_squared)


def fit_entropy_law(
    entropies,
    rewards,
    *,
    min_points: int = ENTROPY_LAW_MIN_POINTS,
    min_relative_spread: float = ENTROPY_LAW_MIN_RELATIVE_SPREAD,
) -> EntropyLaw | None:
    """The law of :func:`entropy_law_fit` (same arguments), ``None`` when the fit is not well posed."""
    return entropy_law_fit(entropies, rewards, min_points=min_points, min_relative_spread=min_relative_spread).law


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
