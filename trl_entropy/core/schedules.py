"""Coefficient schedules, as pure functions: a value that moves with the training clock from a start to a final value,
after an optional warm-up. What TRL users asked for in TRL's issue #5584 (an entropy coefficient that decays over
training), with the bonus's gradient intact (docs/schedules.md).

The clock ``s`` is the optimizer step (TRL's ``state.global_step`` while a step runs: 0 during the first), or the
generation cycle ``floor(s / n_c)``; ``S`` is the run's last step on that clock. Warm-up for ``s < w``:
``c(s) = c_w + (c_0 − c_w)·s/w``; after it ``u = clamp((s − w)/max(D, 1), 0, 1)`` with ``D`` the decay steps (``S − w``
when not given), and ``c = c_0`` (constant), ``c_0 + (c_1 − c_0)·u`` (linear) or ``c_1 + (c_0 − c_1)·½(1 + cos πu)``
(cosine). The final value is reached at ``s = S``, as transformers' linear learning-rate schedule reaches 0.

A method's bounds (an entropy band, a coefficient box) follow the same schedules (:func:`bound_schedule`; their
fields and checks: ``core/bounds.py``): each bound from its value to its final one, holding it through the warm-up.
"""

import math
from dataclasses import dataclass


SCHEDULES = ("constant", "linear", "cosine")
SCHEDULE_UNITS = ("optimizer_step", "generation_cycle")


@dataclass(frozen=True)
class Schedule:
    """``kind`` from ``start`` (``c_0``) to ``final`` (``c_1``; unused by ``"constant"``), after ``warmup_steps``
    (``w``) from ``warmup_start`` (``c_w``), decaying over ``decay_steps`` (``D``; None: to the end of the run)."""

    kind: str = "constant"
    start: float = 0.0
    final: float | None = None
    warmup_steps: int = 0
    warmup_start: float = 0.0
    decay_steps: int | None = None

    @property
    def moves(self) -> bool:
        """False for a constant value without warm-up: the clock plays no part."""
        return self.kind != "constant" or self.warmup_steps > 0

    @property
    def ever_nonzero(self) -> bool:
        """Whether any step's value can differ from 0."""
        values = [self.start]
        values += [self.final] if self.kind != "constant" and self.final is not None else []
        values += [self.warmup_start] if self.warmup_steps > 0 else []
        return any(value != 0 for value in values)

    def progress(self, step: int, total: int | None) -> float:
        """``u`` at clock ``step`` of ``total``: 0 through the warm-up, 1 from the end of the decay on."""
        if step < self.warmup_steps:
            return 0.0
        decay = self.decay_steps
        if decay is None:
            if total is None:
                raise ValueError("the schedule decays to the end of the run, whose length is unknown")
            decay = total - self.warmup_steps
        return min(max((step - self.warmup_steps) / max(decay, 1), 0.0), 1.0)

    def value(self, step: int, total: int | None) -> float:
        """The value at clock ``step`` of a run of ``total`` (its last step; None: unknown)."""
        if step < self.warmup_steps:
            return self.warmup_start + (self.start - self.warmup_start) * step / self.warmup_steps
        if self.kind == "constant":
            return self.start
        u = self.progress(step, total)
        if self.kind == "linear":
            return self.start + (self.final - self.start) * u
        return self.final + (self.start - self.final) * 0.5 * (1 + math.cos(math.pi * u))


def schedule_clock(global_step: int, max_steps: int, unit: str, steps_per_cycle: float) -> tuple[int, int]:
    """``(s, S)`` on the schedule's clock: the optimizer step and the run's steps, or the generation cycle and the
    run's cycles (``steps_per_cycle`` optimizer steps each, at least one)."""
    if unit == "optimizer_step":
        return global_step, max_steps
    per_cycle = max(steps_per_cycle, 1.0)
    return math.floor(global_step / per_cycle), math.floor(max_steps / per_cycle)


def run_clock(args, global_step: int, max_steps: int, num_iterations: int) -> tuple[int, int]:
    """``(s, S)`` of optimizer step ``global_step`` of ``max_steps`` on the clock ``entropy_schedule_unit``."""
    steps_per_cycle = args.steps_per_generation * num_iterations / args.gradient_accumulation_steps
    return schedule_clock(global_step, max_steps, args.entropy_schedule_unit, steps_per_cycle)


def require_run_length(schedules, total: int, schedule_field: str, decay_field: str) -> None:
    """Refuse, naming the fields, schedules that decay to the run's last step when the run's length is unknown."""
    if total <= 0 and any(s.kind != "constant" and s.decay_steps is None for s in schedules):
        raise ValueError(
            f"{schedule_field} decays until the run's last step, which is unknown (no max_steps): set {decay_field}."
        )


@dataclass(frozen=True)
class CoefficientSchedule:
    """A coefficient field ``name`` on a schedule, read from the fields ``<name>_schedule``, ``<name>_final``,
    ``<name>_warmup_steps``, ``<name>_warmup_start`` and ``<name>_decay_steps`` (TRL's ``entropy_coef`` has them, and a
    method's coefficient may: docs/schedules.md), on the clock ``entropy_schedule_unit``."""

    name: str

    def schedule(self, config) -> Schedule:
        name = self.name
        return Schedule(
            kind=getattr(config, f"{name}_schedule"),
            start=getattr(config, name),
            final=getattr(config, f"{name}_final"),
            warmup_steps=getattr(config, f"{name}_warmup_steps"),
            warmup_start=getattr(config, f"{name}_warmup_start"),
            decay_steps=getattr(config, f"{name}_decay_steps"),
        )

    def check(self, config) -> None:
        """Refuse, naming the field: a decaying schedule without its final value, and a setting nothing reads."""
        schedule, name = self.schedule(config), self.name
        constant = schedule.kind == "constant"
        if not constant and schedule.final is None:
            raise ValueError(
                f"{name}_schedule={schedule.kind!r} needs {name}_final, the value it ends at: set it (0.0 to decay it "
                "away)."
            )
        unused = [
            (f"{name}_final", f"{name}_schedule='constant' never reaches it", constant and schedule.final is not None),
            (
                f"{name}_decay_steps",
                f"{name}_schedule='constant' does not decay",
                constant and schedule.decay_steps is not None,
            ),
            (
                f"{name}_warmup_start",
                f"{name}_warmup_steps=0: there is no warm-up",
                schedule.warmup_steps == 0 and schedule.warmup_start != 0.0,
            ),
        ]
        for field_name, why, ignored in unused:
            if ignored:
                raise ValueError(
                    f"{field_name}={getattr(config, field_name)!r} would be ignored: {why}. Leave it out, or set what "
                    "uses it."
                )

    def value(self, config, global_step: int, max_steps: int, num_iterations: int) -> tuple[float, float]:
        """``(value, u)`` at optimizer step ``global_step`` of ``max_steps`` on the config's clock (``u``: 0 for a
        constant schedule)."""
        schedule = self.schedule(config)
        step, total = run_clock(config, global_step, max_steps, num_iterations)
        require_run_length([schedule], total, f"{self.name}_schedule", f"{self.name}_decay_steps")
        return schedule.value(step, total), schedule.progress(step, total) if schedule.kind != "constant" else 0.0

    def now(self, trainer) -> tuple[float, float]:
        """``(value, u)`` at the optimizer step ``trainer`` is running (between steps: the next one)."""
        state = trainer.state
        return self.value(trainer.args, state.global_step, state.max_steps, trainer.num_iterations)


# TRL's entropy coefficient on its schedule (the base config's entropy_coef_* fields).
ENTROPY_COEF_SCHEDULE = CoefficientSchedule("entropy_coef")


def bound_schedule(
    kind: str, start: float, final: float | None, warmup_steps: int, decay_steps: int | None
) -> Schedule:
    """A bound from ``start`` to ``final`` under ``kind`` (``final`` None: it stays at ``start``); it holds ``start``
    through the warm-up, since a bound has no value of its own to rise from."""
    if final is None:
        return Schedule(start=start)
    return Schedule(kind, start, final, warmup_steps, warmup_start=start, decay_steps=decay_steps)
