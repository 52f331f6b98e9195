"""Controllers: small objects that move one coefficient from one generation cycle to the next.

A controller never sees tensors or ranks. The trainer sums its statistic over every micro-batch of a generation cycle
(``num_iterations`` passes of ``steps_per_generation`` micro-batches) and every rank, takes the token-weighted mean and
calls ``update(mean, step)`` once, at the optimizer step that ends the cycle, identically on every rank, so every rank
holds the same value (SPEC "Controller statistics and timing"). ``state_dict()`` goes into each checkpoint through
:class:`EntropyControlState` and ``load_state_dict()`` restores it.
"""

import math
from abc import ABC, abstractmethod

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState


class Controller(ABC):
    """Base class. Subclasses set ``name`` (its key in checkpoints) and ``statistic``: the ``CompletionBatch`` field
    whose token mean drives it (``"entropy"`` or ``"clamped_entropy"``)."""

    name: str
    statistic: str

    @abstractmethod
    def update(self, mean_statistic: float, step: int) -> None:
        """Take the mean statistic of the generation cycle that optimizer step ``step`` (1-based) ends."""

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
    """Steers the mean full entropy toward a target ``H*``: given, or measured on the first generation cycle
    ("Entropy-Preserving Reinforcement Learning", arXiv:2603.11682, §5).

    Subclasses set ``name``, ``value_name`` (the controlled quantity's key in the state and the metrics) and implement
    ``step(value, mean_entropy, target)``. The first update only measures the target when none was given, and the
    step then sees ``mean_entropy == target``.
    """

    statistic = "entropy"
    value_name: str

    def __init__(self, value: float, entropy_target: float | None = None):
        self.value = float(value)
        self.entropy_target = None if entropy_target is None else float(entropy_target)

    @abstractmethod
    def step(self, value: float, mean_entropy: float, target: float) -> float:
        """The controlled value after one generation cycle."""

    def update(self, mean_statistic: float, step: int) -> None:
        if self.entropy_target is None:
            self.entropy_target = float(mean_statistic)
        self.value = self.step(self.value, mean_statistic, self.entropy_target)

    def state_dict(self) -> dict:
        return {self.value_name: self.value, "entropy_target": self.entropy_target}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state[self.value_name])
        target = state["entropy_target"]
        self.entropy_target = None if target is None else float(target)

    def metrics(self) -> dict[str, float]:
        target = math.nan if self.entropy_target is None else self.entropy_target
        return {f"{self.name}/{self.value_name}": self.value, f"{self.name}/entropy_target": target}


class EntropyControlState(TrainerCallback, ExportableState):
    """The trainer's entropy-control state, carried in ``trainer_state.json`` (``stateful_callbacks``).

    `transformers.Trainer` writes the state of every ``ExportableState`` callback into the checkpoint's
    ``trainer_state.json`` before it pushes the checkpoint to the Hub, so a pushed checkpoint holds it too. The
    trainer fills ``snapshot`` right before each save: the controllers' ``state_dict()`` and the progress of the
    current generation cycle (see ``EntropyGRPOTrainer._save_checkpoint``); it reads the snapshot back from the
    loaded trainer state on resume. The callback itself does nothing during training.
    """

    def __init__(self, snapshot: dict | None = None):
        self.snapshot = snapshot

    def state(self) -> dict:
        return {"args": {}, "attributes": {"snapshot": self.snapshot}}
