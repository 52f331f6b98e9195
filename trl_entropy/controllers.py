"""Controllers: small objects that move one coefficient from one optimizer step to the next.

A controller never sees tensors or ranks. The trainer sums its statistic over the accumulation window and all ranks,
takes the token-weighted mean and calls ``update(mean, step)`` once per optimizer step, identically on every rank, so
every rank holds the same value. ``state_dict()`` goes into each checkpoint and ``load_state_dict()`` restores it.
"""

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
