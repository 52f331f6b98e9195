"""Controllers: small objects that move one coefficient from one generation cycle to the next, and the per-cycle
bookkeeping that feeds them.

A controller never sees tensors or ranks. :class:`ControllerCycle` sums its statistic over every micro-batch of a
generation cycle (``num_iterations`` passes of ``steps_per_generation`` micro-batches) and every rank, takes the
token-weighted mean and calls ``update(mean, step)`` once, at the optimizer step that ends the cycle, identically on
every rank, so every rank holds the same value (the methods' papers move their coefficients once per rollout batch;
see docs/adding_a_method.md). ``state_dict()`` goes into each checkpoint through :class:`EntropyControlState` and
``load_state_dict()`` restores it.

A controller of cadence ``"micro_batch"`` moves after every training micro-batch instead, on that micro-batch's token
mean over every rank (:meth:`ControllerCycle.micro_batch_means`, which the loss step's batch carries, so that the
method's part can read the value the move gives, :meth:`Controller.value_after`): the cycle neither sums a statistic
for it nor calls its ``update`` at the cycle's end, and still carries its state in every checkpoint and logs its
metrics at every optimizer step. Controllers move only after the loss step; parts read them.
"""

import math
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from .warn import warn_user


class Controller(ABC):
    """Base class. Subclasses set ``name`` (its key in checkpoints), ``statistic``: the ``CompletionBatch`` field whose
    token mean drives it (``"entropy"`` or ``"clamped_entropy"``), and may set ``cadence``: ``"cycle"`` (the mean over
    a generation cycle, one update at the optimizer step that ends it) or ``"micro_batch"`` (the mean over each
    training micro-batch, one update after its loss step)."""

    name: str
    statistic: str
    cadence: str = "cycle"

    @abstractmethod
    def update(self, mean_statistic: float, step: int) -> None:
        """Take the mean statistic of the generation cycle that optimizer step ``step`` (1-based) ends."""

    def value_after(self, mean_statistic: float) -> float:
        """The value ``update`` would give on ``mean_statistic``, without moving (a non-finite mean holds it)."""
        raise NotImplementedError(f"controller {self.name!r} moves once per cycle: read its value")

    def follow_schedule(self, trainer) -> None:  # noqa: B027 (most controllers follow no schedule)
        """After each training micro-batch, before any move: take what a schedule gives for the running step (the
        box a coefficient stays in). Nothing by default."""

    @abstractmethod
    def state_dict(self) -> dict:
        """Everything needed to continue the trajectory exactly (JSON-serialisable)."""

    @abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""

    @abstractmethod
    def metrics(self) -> dict[str, float]:
        """The values to log, named ``<method>/<quantity>``."""


class LastCycleMean(Controller):
    """A measurement with a controller's timing and checkpoints, driving nothing: the mean ``value`` of ``statistic``
    over the last generation cycle's tokens on every rank (None before the first cycle ends)."""

    def __init__(self, name: str, statistic: str):
        self.name, self.statistic = name, statistic
        self.value: float | None = None

    def update(self, mean_statistic: float, step: int) -> None:
        self.value = mean_statistic

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]

    def metrics(self) -> dict[str, float]:
        return {}


def entropy_direction(mean_entropy: float, target: float) -> float:
    """``+1`` when the entropy is below the target (push it up), ``−1`` above, ``0`` on it."""
    if mean_entropy < target:
        return 1.0
    if mean_entropy > target:
        return -1.0
    return 0.0


# A measured entropy target below this many nats is degenerate: the first cycle's completions were deterministic.
DEGENERATE_ENTROPY = 1e-6


class EntropyTargetController(Controller):
    """Steers the mean full entropy toward a target ``H*``: given, or measured on the first generation cycle
    ("Entropy-Preserving Reinforcement Learning", arXiv:2603.11682, §5).

    Subclasses set ``name``, ``value_name`` (the controlled quantity's key in the state and the metrics) and implement
    ``step(value, mean_entropy, target)``. The first update only measures the target when none was given, and the
    step then sees ``mean_entropy == target``.
    """

    statistic = "entropy"
    value_name: str

    def __init__(
        self, value: float, entropy_target: float | None = None, bounds: tuple[float, float] = (-math.inf, math.inf)
    ):
        self.value = float(value)
        self.entropy_target = None if entropy_target is None else float(entropy_target)
        self.given_target = self.entropy_target  # a target given in the config wins over a checkpoint's on resume
        self.bounds = bounds  # the configured range of the value: a resumed value is brought into it

    @abstractmethod
    def step(self, value: float, mean_entropy: float, target: float) -> float:
        """The controlled value after one generation cycle."""

    def update(self, mean_statistic: float, step: int) -> None:
        if self.entropy_target is None:
            self.entropy_target = float(mean_statistic)
            if self.entropy_target < DEGENERATE_ENTROPY:
                warn_user(
                    f"{self.name}: the entropy target measured on the first generation cycle (ending at optimizer "
                    f"step {step}) is {self.entropy_target:.3g} nats, practically zero (every completion nearly "
                    "deterministic, e.g. only EOS): the controller will hold the entropy there. Give the target "
                    "explicitly in the config to aim at a useful entropy."
                )
        self.value = self.step(self.value, mean_statistic, self.entropy_target)

    def state_dict(self) -> dict:
        return {self.value_name: self.value, "entropy_target": self.entropy_target}

    def load_state_dict(self, state: dict) -> None:
        """The learned value and measured target of ``state``; a target given in this controller's (new) config is
        kept instead of the checkpoint's, and the value is clipped to the (new) config's range."""
        self.value = min(max(float(state[self.value_name]), self.bounds[0]), self.bounds[1])
        target = state["entropy_target"] if self.given_target is None else self.given_target
        self.entropy_target = None if target is None else float(target)

    def metrics(self) -> dict[str, float]:
        target = math.nan if self.entropy_target is None else self.entropy_target
        return {f"{self.name}/{self.value_name}": self.value, f"{self.name}/entropy_target": target}


class EntropyControlState(TrainerCallback, ExportableState):
    """The trainer's entropy-control state, carried in ``trainer_state.json`` (``stateful_callbacks``).

    `transformers.Trainer` writes the state of every ``ExportableState`` callback into the checkpoint's
    ``trainer_state.json`` before it pushes the checkpoint to the Hub, so a pushed checkpoint holds it too. The
    trainer fills ``snapshot`` right before each save: the controllers' ``state_dict()`` and the progress of the
    current generation cycle (the base trainer writes it at every save); it reads the snapshot back from the
    loaded trainer state on resume. The callback itself does nothing during training.
    """

    def __init__(self, snapshot: dict | None = None):
        self.snapshot = snapshot

    def state(self) -> dict:
        return {"args": {}, "attributes": {"snapshot": self.snapshot}}


def update_or_hold(controller: Controller, mean: float, step: int, where: str) -> None:
    """``controller.update(mean, step)``; a non-finite mean (no valid token on any rank, or a non-finite statistic)
    holds the controller where it is, with a warning naming ``where`` (the cycle or the micro-batch) and ``step``."""
    if math.isfinite(mean):
        controller.update(mean, step)
        return
    warn_user(
        f"{where} optimizer step {step}: the {controller.statistic} statistic over every rank's valid tokens is "
        f"{mean}; controller {controller.name!r} keeps its value"
    )


def statistic_sums(batch, statistic: str) -> torch.Tensor:
    """``[Σ m·statistic, Σ m]`` of ``batch`` (a ``CompletionBatch``) for the field ``statistic``."""
    values = getattr(batch, statistic)
    if values is None:
        raise RuntimeError(f"a controller needs the {statistic!r} statistic, which this method does not compute")
    return torch.stack([(values.detach().float() * batch.mask).sum(), batch.mask.float().sum()])


class ControllerCycle:
    """The controllers of one trainer and the progress of the current generation cycle.

    ``add(batch)`` adds a micro-batch's ``[Σ m·statistic, Σ m]`` per statistic the controllers use;
    ``end_optimizer_step(step)`` counts an optimizer step and, when it ends a cycle, reduces the sums over all ranks
    (``reduce_sum``, collective) and updates every controller. A cycle is ``micro_batches_per_cycle`` micro-batches,
    an optimizer step ``accumulation_steps``: the update comes at the first optimizer step that ends together with a
    cycle (every step under TRL's defaults, every second one with ``num_iterations=2``, every step when one step spans
    several cycles).
    """

    def __init__(
        self,
        controllers: list[Controller],
        micro_batches_per_cycle: int,
        accumulation_steps: int,
        reduce_sum: Callable[[torch.Tensor], torch.Tensor],
    ):
        self.controllers = {controller.name: controller for controller in controllers}
        self.micro_batches_per_cycle = micro_batches_per_cycle
        self.accumulation_steps = accumulation_steps
        self.reduce_sum = reduce_sum
        self.statistics: dict[str, torch.Tensor] = {}  # [Σ m·statistic, Σ m] per statistic, this rank, this cycle
        self.optimizer_steps = 0  # optimizer steps since the last update

    def add(self, batch) -> None:
        for statistic in self._statistics("cycle"):
            sums = statistic_sums(batch, statistic)
            previous = self.statistics.get(statistic)
            self.statistics[statistic] = sums if previous is None else previous + sums

    def micro_batch_means(self, batch) -> dict[str, float]:
        """The token mean over every rank of this training micro-batch of each statistic a controller of cadence
        ``"micro_batch"`` reads (collective, when there is such a controller; NaN where no rank has a valid token)."""
        names = self._statistics("micro_batch")
        if not names:
            return {}
        totals = self.reduce_sum(torch.stack([statistic_sums(batch, name) for name in names]))
        sums = zip(names, totals.tolist(), strict=True)
        return {name: total / count if count > 0 else math.nan for name, (total, count) in sums}

    def update_micro_batch(self, means: dict[str, float], step: int) -> None:
        """Update every controller of cadence ``"micro_batch"`` on its statistic's ``means`` over a training
        micro-batch (:meth:`micro_batch_means`); ``step`` is the optimizer step it is part of (1-based)."""
        for controller in self.controllers.values():
            if controller.cadence == "micro_batch":
                update_or_hold(controller, means[controller.statistic], step, "a micro-batch of")

    def _statistics(self, cadence: str) -> list[str]:
        return sorted({c.statistic for c in self.controllers.values() if c.cadence == cadence})

    def end_optimizer_step(self, step: int) -> dict[str, float]:
        """Count optimizer step ``step`` (1-based); update the controllers if it ends a cycle. Returns the controllers'
        metrics after the step."""
        self.optimizer_steps += 1
        if (self.optimizer_steps * self.accumulation_steps) % self.micro_batches_per_cycle == 0:
            self._update(step)
        return {name: value for c in self.controllers.values() for name, value in c.metrics().items()}

    def start_cycle(self) -> None:
        """Forget the current cycle's progress: the next micro-batch opens a new cycle."""
        self.statistics, self.optimizer_steps = {}, 0

    def _update(self, step: int) -> None:
        totals = self.world_statistics()
        self.start_cycle()
        means = {name: total / count if count > 0 else math.nan for name, (total, count) in totals.items()}
        for controller in self.controllers.values():
            if controller.cadence == "cycle":  # the others move at every micro-batch, inside the loss step
                update_or_hold(controller, means[controller.statistic], step, "the generation cycle ending at")

    def world_statistics(self) -> dict[str, list[float]]:
        """The current cycle's ``[Σ m·statistic, Σ m]`` per statistic, summed over all ranks (collective)."""
        names = sorted(self.statistics)
        if not names:
            return {}
        totals = self.reduce_sum(torch.stack([self.statistics[name] for name in names]))
        return dict(zip(names, totals.tolist(), strict=True))

    def snapshot(self) -> dict:
        """The controllers' state and the cycle's progress, the same on every rank (collective: the partial sums are
        reduced here, and on resume one rank takes them over)."""
        return {
            "controllers": {name: controller.state_dict() for name, controller in self.controllers.items()},
            "cycle_statistics": self.world_statistics(),
            "cycle_optimizer_steps": self.optimizer_steps,
        }

    def restore(self, snapshot: dict, keep_sums: bool, device) -> None:
        """Take over a :meth:`snapshot`; ``keep_sums`` on exactly one rank (the others start from zero, which gives
        the same world sums)."""
        for name, controller in self.controllers.items():
            controller.load_state_dict(snapshot["controllers"][name])
        self.statistics = {
            name: torch.tensor(sums, device=device) * (1.0 if keep_sums else 0.0)
            for name, sums in snapshot["cycle_statistics"].items()
        }
        self.optimizer_steps = snapshot["cycle_optimizer_steps"]
