"""Controllers: small objects that move one coefficient from one optimizer step to the next.

A controller never sees tensors or ranks. The trainer sums its statistic over the accumulation window and all ranks,
takes the token-weighted mean and calls ``update(mean, step)`` once per optimizer step, identically on every rank, so
every rank holds the same value. ``state_dict()`` goes into each checkpoint and ``load_state_dict()`` restores it.
"""

import math
from abc import ABC, abstractmethod


STATISTICS = ("entropy", "clamped_entropy")


class Controller(ABC):
    """Base class. Subclasses set ``statistic`` (one of ``STATISTICS``) and ``name`` (its key in checkpoints)."""

    name: str
    statistic: str

    @abstractmethod
    def update(self, mean_statistic: float, step: int) -> None:
        """Take the mean statistic of optimizer step ``step`` (1-based) and move the controlled value."""

    @abstractmethod
    def state_dict(self) -> dict:
        """Everything needed to continue the trajectory exactly (JSON-serialisable)."""

    @abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""

    @abstractmethod
    def metrics(self) -> dict[str, float]:
        """The values to log, named ``<method>/<quantity>``."""


def entropy_direction(mean_entropy: float, target: float) -> float:
    """``+1`` when the entropy is below the target (push it up), ``−1`` above, ``0`` on it."""
    if mean_entropy < target:
        return 1.0
    if mean_entropy > target:
        return -1.0
    return 0.0


class EntropyTargetController(Controller):
    """Steers the mean full entropy toward a target ``H*``: given, or measured on the first optimizer step (seed 002).

    Subclasses set ``name``, ``value_name`` (the controlled quantity's key in the state and the metrics) and implement
    ``step(value, mean_entropy, target)``. The first update only measures the target when none was given, and the
    step then sees ``mean_entropy == target``.
    """

    statistic = "entropy"
    value_name: str

    def __init__(self, value: float, entropy_target: float | None = None):
        self.value = float(value)
        self.entropy_target = None if entropy_target is None else float(entropy_target)
        self.last_step = 0  # the last optimizer step that updated the controller

    @abstractmethod
    def step(self, value: float, mean_entropy: float, target: float) -> float:
        """The controlled value after one optimizer step."""

    def update(self, mean_statistic: float, step: int) -> None:
        if self.entropy_target is None:
            self.entropy_target = float(mean_statistic)
        self.value = self.step(self.value, mean_statistic, self.entropy_target)
        self.last_step = int(step)

    def state_dict(self) -> dict:
        return {self.value_name: self.value, "entropy_target": self.entropy_target, "last_step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state[self.value_name])
        target = state["entropy_target"]
        self.entropy_target = None if target is None else float(target)
        self.last_step = int(state["last_step"])

    def metrics(self) -> dict[str, float]:
        target = math.nan if self.entropy_target is None else self.entropy_target
        return {f"{self.name}/{self.value_name}": self.value, f"{self.name}/entropy_target": target}
